"""Exporting the runtime's traces, as the standard OpenTelemetry environment variables ask (``serve`` calls
:func:`export_traces_from_environment` once at start; a host that embeds the Python API installs its own tracer
provider instead, and the runtime's spans go wherever it sends them).

Traces are exported by OTLP over HTTP (protobuf) when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set; ``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true`` turns
that off. The exporter and the batch processor read their other variables themselves (``OTEL_EXPORTER_OTLP_HEADERS``,
``..._COMPRESSION``, ``..._TIMEOUT``, ``OTEL_BSP_*``), the resource its own (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``; the service is ``sandbox-runtime`` unless they say otherwise), the sampler its own
(``OTEL_TRACES_SAMPLER``). A protocol other than ``http/protobuf`` is refused (a :class:`PolicyError`), never
silently ignored. Without these variables nothing is installed: tracing is off and costs nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from sandbox_runtime.errors import PolicyError
from sandbox_runtime.telemetry.metrics import package_version

__all__ = ["TraceExport", "export_traces_from_environment"]

logger = logging.getLogger(__name__)

SERVICE_NAME = "sandbox-runtime"
_PROTOCOL = "http/protobuf"


@dataclass(frozen=True)
class TraceExport:
    """Traces being exported: where to, and how to stop (every span ended so far is sent first)."""

    endpoint: str
    provider: object  # the SDK's TracerProvider (imported only when traces are exported)

    def shutdown(self) -> None:
        """Send what is left, then stop (bounded by the exporter's own timeout)."""
        self.provider.shutdown()  # type: ignore[attr-defined]


def export_traces_from_environment(environ: Mapping[str, str] | None = None) -> TraceExport | None:
    """Install a tracer provider exporting by OTLP/HTTP when the environment asks for it; None when it does not."""
    env = os.environ if environ is None else environ
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = [name.strip() for name in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if name.strip()]
    if exporters == ["none"]:
        return None
    if exporters != ["otlp"]:
        raise PolicyError(f"OTEL_TRACES_EXPORTER={','.join(exporters)}: only otlp (or none) is supported")
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = env.get(variable)
        if protocol:
            if protocol != _PROTOCOL:
                raise PolicyError(f"{variable}={protocol}: traces are exported by {_PROTOCOL} only")
            break
    named = bool(env.get("OTEL_SERVICE_NAME")) or "service.name" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    return _install(endpoint, named=named)


def _install(endpoint: str, *, named: bool) -> TraceExport:
    from opentelemetry import trace  # noqa: PLC0415  (the SDK loads only when traces are exported)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415  (idem)
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415  (idem)
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415  (idem)
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415  (idem)

    resource = Resource.create({"service.version": package_version()})
    if not named:  # the resource's own default is "unknown_service:python"
        resource = resource.merge(Resource.create({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    logger.info("exporting traces by OTLP/HTTP to %s", endpoint)
    return TraceExport(endpoint, provider)
