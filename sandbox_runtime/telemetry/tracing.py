"""The runtime's OpenTelemetry spans: one tracer and the names of the attributes it sets (the threads a call runs
in take the caller's context, its current span with it: :class:`~sandbox_runtime.workers.Workers`).

The runtime only uses the OpenTelemetry API: without an SDK's tracer provider (``serve`` installs one when the
``OTEL_*`` variables ask for an exporter, :mod:`~sandbox_runtime.telemetry.export`; a host installs its own) every
span is a non-recording one, which costs next to nothing. Attributes name a conversation only by a hash of its key,
its tenant, the call id and how the call ended: never an argument's value nor a result.

The spans of one call (parents first)::

    tools/call <tool>          the MCP SDK's server span (its parent: the client's traceparent in _meta)
      execute_tool <tool>      the pipeline's call (gen_ai.* attributes), under it:
        admission.wait         the wait for a run slot of the tenant
        approval               a person asked (allowed or denied)
        pool.take / sandbox.start
        sandbox.run            the run in its sandbox; the spans its code opens (sandbox_tools.span) under it,
                               and the script's own tool calls (execute_tool ...)
        export                 export_table writing its file
        spill.write            a result written to a file
        upstream.call          the call of an upstream MCP server's tool (the SDK's client span under it carries
                               the trace on to the upstream server)
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

__all__ = [
    "ATTR_CALL_ID",
    "ATTR_CALL_STATUS",
    "ATTR_CONVERSATION",
    "ATTR_ERROR_TYPE",
    "ATTR_FAILURE",
    "ATTR_OPERATION",
    "ATTR_TENANT",
    "ATTR_TOOL",
    "Span",
    "conversation_hash",
    "failed",
    "span",
    "trace_id",
    "tracer",
]

tracer = trace.get_tracer("sandbox_runtime")

# OpenTelemetry's GenAI semantic conventions, for a tool's execution
ATTR_OPERATION = "gen_ai.operation.name"
ATTR_TOOL = "gen_ai.tool.name"
ATTR_CALL_ID = "gen_ai.tool.call.id"
ATTR_ERROR_TYPE = "error.type"
# the runtime's own
ATTR_CONVERSATION = "sandbox_runtime.conversation.hash"
ATTR_TENANT = "sandbox_runtime.tenant"
ATTR_CALL_STATUS = "sandbox_runtime.call.status"
ATTR_FAILURE = "sandbox_runtime.call.failure"

_HASH_HEX_CHARS = 16


def conversation_hash(key: str) -> str:
    """A conversation as traces name it: 16 hex digits of the sha256 of its key (the same for every span and
    replica; the id itself never leaves the host in a trace)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_HEX_CHARS]


@contextlib.contextmanager
def span(name: str, attributes: dict[str, Any] | None = None, *, kind: SpanKind = SpanKind.INTERNAL) -> Iterator[Span]:
    """A span of the runtime's tracer, current inside the block; an exception that leaves the block marks it
    failed (its type, not its message: a message may quote an argument)."""
    with tracer.start_as_current_span(
        name, kind=kind, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as exc:
            failed(current, type(exc).__qualname__)
            raise


def failed(current: Span, error_type: str, description: str | None = None) -> None:
    """Mark a span failed: ``error.type`` and an error status."""
    if current.is_recording():
        current.set_attribute(ATTR_ERROR_TYPE, error_type)
        current.set_status(Status(StatusCode.ERROR, description))


def trace_id() -> str | None:
    """The current trace's id (32 hex digits), None outside a recorded span: what a log line carries."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None
