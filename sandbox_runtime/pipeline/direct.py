"""A host program's own call into a conversation (``Conversation.exec``, ``read_bytes``, ``write_bytes``): no model
sent it and no model is shown what it returns, so there is nothing to approve, spill or decide. Like every call it
runs in a run slot of its conversation's tenant (:mod:`~sandbox_runtime.pipeline.admission`), is observed (its
span, log fields and metrics: :mod:`~sandbox_runtime.pipeline.observed`) and is kept in the execution record
with its audit entry. An error of the caller's (a missing file, a refused path) is recorded as the call's failure
and raised; a call that raised otherwise (admission refused it, or the engine failed) is audited as every unsettled
call is."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.models import CallFailure, ToolCall
from sandbox_runtime.pipeline.call import Call, call_record, is_infrastructure
from sandbox_runtime.pipeline.observed import observed_call
from sandbox_runtime.tools.base import ToolContext, ToolReturn

if TYPE_CHECKING:
    from sandbox_runtime.pipeline.dispatch import Dispatcher

__all__ = ["Done", "direct_call"]


class Done(NamedTuple):
    """What a direct call's work gives back: its value for the caller, a short text standing for it in the
    record (its digest is audited), and why it failed, when it did."""

    value: Any
    summary: str
    failure: CallFailure | None = None


def direct_call(
    dispatcher: Dispatcher,
    conversation_id: str,
    tool: str,
    arguments: dict[str, Any],
    work: Callable[[ToolContext], Done],
    cancelled: Callable[[], Any],
    control: CallControl | None = None,
) -> Any:
    """Run ``work`` as the call ``tool`` (``arguments``: what the record keeps of it) of the conversation, in a run
    slot; ``cancelled()`` is the value when the caller cancelled while it waited for one."""
    ctx = dispatcher.context(conversation_id)
    call_id = f"api-{uuid.uuid4().hex[:16]}"
    call = Call(ToolCall(tool=tool, arguments=arguments, call_id=call_id), dataclasses.replace(ctx, control=control))
    tenant = dispatcher.state.tenants.of_key(conversation_id)
    try:
        with observed_call(call, tenant, dispatcher.metrics), dispatcher.admission.slot(tenant, control) as admitted:
            call.queued_s, call.target, call.started_at = admitted.waited_s, tool, time.time()
            if admitted.cancelled:
                waited = f"cancelled after {admitted.waited_s:.1f} s waiting for a run slot"
                done, refused = Done(cancelled(), waited, "cancelled"), None
            else:
                done, refused = _worked(work, call.ctx)
            call.finish(ToolReturn(content=done.summary, is_error=done.failure is not None), done.failure, time.time())
    except Exception as exc:
        dispatcher.audit_unsettled(call, tenant, exc)
        raise
    cap = dispatcher.policy.tools.record_args_max_bytes
    dispatcher.state.record_calls([call_record(call, conversation_id, None, cap, None)], [done.summary])
    if refused is not None:
        raise refused
    return done.value


def _worked(work: Callable[[ToolContext], Done], ctx: ToolContext) -> tuple[Done, Exception | None]:
    """What the work did, or the caller's error it raised (kept as the call's failure, raised once recorded); an
    infrastructure failure raises at once."""
    try:
        return work(ctx), None
    except Exception as exc:
        if is_infrastructure(exc):
            raise
        failure: CallFailure = "invalid_arguments" if isinstance(exc, InvalidToolArguments) else "tool_error"
        return Done(None, f"{type(exc).__name__}: {exc}", failure), exc
