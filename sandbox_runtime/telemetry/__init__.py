"""What the runtime tells its operator: Prometheus metrics (:mod:`.metrics`), OpenTelemetry spans (:mod:`.tracing`;
from inside sandboxes: :mod:`.sandbox_spans`; exported as ``OTEL_*`` asks: :mod:`.export`) and structured logs
(:mod:`.logs`). See ``docs/observability.md``."""
