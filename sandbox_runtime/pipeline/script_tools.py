"""The dispatch pipeline as a ``run_python`` script reaches it: each tool call a run makes is a call of its own,
run, judged, spilled and decided like a model's call, and recorded as made by the run's call.

The call id of a run's call ``n`` is ``<the run's call id>/<n>``: when the run's call is tried again after an
infrastructure failure (same call id), its script's calls that were decided are replayed, not made again. The
approval request names ``run_python`` as the tool the call came through and the script as the arguments' source;
as for ``delegate_call``, the stricter of ``run_python``'s rule and the target's applies. The run's cancel
cancels its calls; their progress is not reported (the run's is).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sandbox_runtime.control import CallControl
from sandbox_runtime.models import CallFailure, ToolCall
from sandbox_runtime.pipeline.approval import Approver
from sandbox_runtime.tools.base import ScriptCallOutcome, ScriptFailure, ToolContext, ToolSpec

if TYPE_CHECKING:
    from sandbox_runtime.pipeline.dispatch import Dispatcher

__all__ = ["PipelineScriptTools", "script_call_id"]

_CALL_ID_MAX_CHARS = 200
_RUN_PYTHON = "run_python"
# why a call failed, as a script's ToolError says it (every other failure is "failed")
_SCRIPT_FAILURES: dict[CallFailure | None, ScriptFailure] = {
    "denied": "denied",
    "invalid_arguments": "invalid_arguments",
}


def script_call_id(parent_call_id: str, number: int) -> str:
    """``<parent>/<number>``; a parent id too long to fit is shortened to its digest."""
    call_id = f"{parent_call_id}/{number}"
    if len(call_id) <= _CALL_ID_MAX_CHARS:
        return call_id
    digest = hashlib.sha256(parent_call_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{digest}/{number}"


class PipelineScriptTools:
    """:class:`~sandbox_runtime.tools.base.ScriptTools` for the run of one ``run_python`` call: its calls go
    through the dispatcher (see the module text)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        context: ToolContext,
        parent_call_id: str,
        approver: Approver | None,
        control: CallControl | None,
    ) -> None:
        self._dispatcher = dispatcher
        self._run_context = context
        self._conversation_id = context.conversation_id
        self._parent = parent_call_id
        self._approver = approver
        self._control = None if control is None else CallControl(cancelled=control.cancelled)

    def specs(self) -> Mapping[str, ToolSpec]:
        return self._dispatcher.tools

    def call(self, tool: str, arguments: dict[str, Any], number: int, source: str) -> ScriptCallOutcome:
        item = ToolCall(tool=tool, arguments=arguments, call_id=script_call_id(self._parent, number))
        dispatcher, conversation = self._dispatcher, self._conversation_id
        call = dispatcher.prepare(
            conversation,
            item,
            approver=self._approver,
            control=self._control,
            made_by=(_RUN_PYTHON, source),
            context=self._run_context,  # its folders are held already: not claimed again per call (each call
            # gets its own id, control and script tools from the pipeline)
        )
        outcome = dispatcher.settle(conversation, [call], made_by=self._parent).outcomes[0]
        why = call.stored.failure if call.stored is not None else call.failure  # a replay: as it was decided
        failure = _SCRIPT_FAILURES.get(why, "failed") if outcome.is_error else None
        return ScriptCallOutcome(outcome=outcome, failure=failure)
