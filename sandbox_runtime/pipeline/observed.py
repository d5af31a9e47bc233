"""What the pipeline tells the operator of each call that runs: its span (``execute_tool <tool>``, with the
OpenTelemetry GenAI attributes), the fields of the lines it logs, and its metrics once its result is saved.

The span names the conversation by a hash of its key, its tenant, the call id, the tool, and how the call ended:
never an argument or a result. The metrics are counted here, from the call's record, for every tool alike (see
:mod:`~sandbox_runtime.telemetry.metrics`): the call by tool and status and its duration; for ``run_python`` the
run's status and time; a spilled result or error and its bytes; an export's format and rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sandbox_runtime.errors import AdmissionRefused
from sandbox_runtime.models import ToolCall
from sandbox_runtime.telemetry.logs import log_fields
from sandbox_runtime.telemetry.metrics import RuntimeMetrics
from sandbox_runtime.telemetry.tracing import (
    ATTR_CALL_ID,
    ATTR_CALL_STATUS,
    ATTR_CONVERSATION,
    ATTR_FAILURE,
    ATTR_OPERATION,
    ATTR_TENANT,
    ATTR_TOOL,
    conversation_hash,
    failed,
    span,
)

if TYPE_CHECKING:
    from sandbox_runtime.pipeline.call import Call

__all__ = ["INFRASTRUCTURE", "REFUSED", "observed_call"]

INFRASTRUCTURE = "infrastructure"  # the status of a call an infrastructure failure ended (it raised)
REFUSED = "refused"  # the status of a call admission refused (it raised AdmissionRefused)
_RUN_PYTHON = "run_python"
_EXPORT_TABLE = "export_table"


@contextlib.contextmanager
def observed_call(call: Call, tenant: str, metrics: RuntimeMetrics) -> Iterator[None]:
    """The call's span and log fields around its run and spill, counted in flight meanwhile; counted (once its
    result is saved) when the block ends, or raises."""
    key = call.ctx.conversation_id
    operation = "execute_tool" if isinstance(call.item, ToolCall) else "take_result"  # a host's own tool's
    with (
        log_fields(conversation=key, call_id=call.call_id, tool=call.item.tool),
        span(f"{operation} {call.item.tool}") as current,
    ):
        if current.is_recording():  # the hash and the attributes only for a span that is kept
            current.set_attributes(
                {
                    ATTR_OPERATION: operation,
                    ATTR_TOOL: call.item.tool,
                    ATTR_CALL_ID: call.call_id,
                    ATTR_CONVERSATION: conversation_hash(key),
                    ATTR_TENANT: tenant,
                }
            )
        metrics.calls_in_flight.inc()
        try:
            yield
        except BaseException as exc:
            _count(call, metrics, raised=exc)
            raise
        finally:
            metrics.calls_in_flight.dec()
        _count(call, metrics)
        if current.is_recording():
            current.set_attribute(ATTR_CALL_STATUS, call.status)
            if call.target and call.target != call.item.tool:
                current.set_attribute("sandbox_runtime.call.target", call.target)
            if call.failure is not None:
                current.set_attribute(ATTR_FAILURE, call.failure)
                failed(current, call.failure)


def _count(call: Call, metrics: RuntimeMetrics, *, raised: BaseException | None = None) -> None:
    """Count a call that ran (or a host's result taken in: only its spill), once its result is saved; ``raised``:
    what ended it instead (the call raised): ``refused`` when admission refused it (its tenant's share is full),
    else ``infrastructure`` (the engine, a sandbox, the state)."""
    if raised is not None:
        status = REFUSED if isinstance(raised, AdmissionRefused) else INFRASTRUCTURE
        metrics.calls.labels(metrics.tool(call.target or call.item.tool), status).inc()
        return
    if isinstance(call.item, ToolCall):
        tool = metrics.tool(call.target or call.item.tool)
        metrics.calls.labels(tool, call.failure or "ok").inc()
        if call.finished_at >= call.started_at > 0:
            metrics.call_seconds.labels(tool).observe(call.finished_at - call.started_at)
    details = call.ret.details or {}
    if call.target == _RUN_PYTHON and isinstance(details.get("status"), str):
        metrics.runs.labels(details["status"]).inc()
        duration = details.get("duration_s")
        if isinstance(duration, int | float):
            metrics.run_seconds.labels(metrics.backend).observe(float(duration))
    descriptor = call.descriptor
    if descriptor is not None and descriptor is not call.ret.descriptor:  # written by the spill, not the tool
        metrics.spills.labels("result").inc()
        metrics.spilled_bytes.labels("result").inc(descriptor.bytes)
    if call.error_path is not None and call.error_path != call.ret.error_path:
        metrics.spills.labels("error").inc()
    if call.target == _EXPORT_TABLE and call.failure is None and descriptor is not None:
        metrics.exports.labels(descriptor.format).inc()
        metrics.exported_rows.labels(descriptor.format).inc(descriptor.rows or 0)
