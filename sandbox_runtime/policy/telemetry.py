"""What the runtime tells its operator (``[telemetry]``): how many series its metrics may have and how much a run
may trace from inside its sandbox. A section of :class:`~sandbox_runtime.policy.Policy`; every field has a documented
default in ``policies/``. Where traces go is not policy: the standard ``OTEL_*`` environment variables say it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from sandbox_runtime.policy.base import Section

__all__ = ["TelemetryPolicy"]


class TelemetryPolicy(Section):
    """Bounds on the runtime's metrics and on the spans a run opens inside its sandbox."""

    metrics_tenant_series_max: Annotated[int, Field(ge=1, le=10_000)] = Field(
        50,
        description="Tenants named in the per-tenant gauges (those holding the most bytes); the others are summed "
        'under tenant="_other", so a server with many tenants keeps a bounded number of series.',
    )
    sandbox_spans_max_count: Annotated[int, Field(ge=0, le=100_000)] = Field(
        256,
        description="Spans and events one run may open from inside its sandbox (sandbox_tools.span, .event); "
        "past it they are dropped (and counted). 0: none are taken.",
    )
    sandbox_span_attributes_max_count: Annotated[int, Field(ge=0, le=1_000)] = Field(
        32, description="Attributes one span or event from inside a sandbox may carry; the rest are dropped."
    )
    sandbox_span_text_max_chars: Annotated[int, Field(ge=16, le=65_536)] = Field(
        256, description="Characters of a name, key or text value from inside a sandbox; longer ones are cut."
    )
