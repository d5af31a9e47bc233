"""Turns for calls that arrive one by one (MCP requests): which calls share the per-turn budget.

A host that sends a batch as one turn says so with a turn id (over MCP: ``_meta["sandbox-runtime/turn"]``).
Without one, calls that *overlap in time* in the same conversation form a turn: a call that arrives while another
is still running joins it. Each call runs and spills as soon as it arrives; its decision waits until every call of
its group has finished, then the budget is planned over the group at once (largest first) and each call gets its
answer. Calls of a turn id that arrive after a group was decided still count what that turn already showed, so a
turn split over several groups stays within one budget: the state keeps each turn id's total (every replica adds
to it; kept for ``spill.retention_s``). Groups are formed in each replica: the calls of one turn that a load
balancer spreads over replicas are decided in a group per replica, each counting what the others had shown when
it was decided (two deciding in the same instant may each miss the other's).

A call the host named by its id claims it first (:mod:`~sandbox_runtime.pipeline.claims`): the same id sent
again while it runs, here or on another replica, waits for its decision outside any group, then is answered
with it.

A call whose run raises (only infrastructure failures do; every other failure is a result) counts as finished for
its group and raises to its own caller alone: the others of its group are decided and stored as usual, whichever
of them finishes last, so a retry with their call ids replays them.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import InvalidToolArguments, SandboxRuntimeError
from sandbox_runtime.models import StoredResult
from sandbox_runtime.pipeline.approval import Approver
from sandbox_runtime.pipeline.dispatch import Call, Dispatcher, HostResult, ToolCall, ToolOutcome, TurnReport

__all__ = ["TurnGate"]

_TURN_ID_MAX_CHARS = 200


@dataclass
class _Group:
    turn_id: str
    running: int = 0
    ready: list[Call] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    report: TurnReport | None = None
    failure: BaseException | None = None


class TurnGate:
    """Groups single calls into turns (see the module text) and runs them through one dispatcher."""

    def __init__(self, dispatcher: Dispatcher, *, wait_s: float) -> None:
        self._dispatcher = dispatcher
        self._wait_s = wait_s  # the longest a finished call waits for the others of its group
        self._lock = threading.Lock()
        self._open: dict[tuple[str, str | None], _Group] = {}

    def run(
        self,
        conversation_id: str,
        item: ToolCall | HostResult,
        *,
        turn_id: str | None = None,
        approver: Approver | None = None,
        control: CallControl | None = None,
    ) -> tuple[ToolOutcome, TurnReport]:
        """Run one call as part of its turn; return its outcome and the report of the group it was decided in."""
        if turn_id is not None and not 0 < len(turn_id) <= _TURN_ID_MAX_CHARS:
            raise InvalidToolArguments(f"a turn id must be 1 to {_TURN_ID_MAX_CHARS} characters")
        stored: dict[str, StoredResult] | None = None  # a fresh id is decided never: prepare makes one
        claims = []
        if item.call_id:  # claimed before it joins a group: one that waits for its id's run holds up no group
            stored = self._dispatcher.state.stored_results(conversation_id, [item.call_id])
            claims = self._dispatcher.claimer.claim(conversation_id, [item.call_id], stored, control)
        try:  # the decision as read after the claim: its holder alone may store one now
            group, prepared = self._join_and_prepare(conversation_id, item, turn_id, approver, control, stored)
        finally:
            self._dispatcher.claimer.give_back(conversation_id, claims)  # after the decision was stored
        if group.failure is not None:
            raise group.failure
        assert group.report is not None  # noqa: S101  (set by _settle, which had this call's result)
        outcome = next(o for o in group.report.outcomes if o.call_id == prepared.call_id)
        return outcome, group.report

    def _join_and_prepare(
        self,
        conversation_id: str,
        item: ToolCall | HostResult,
        turn_id: str | None,
        approver: Approver | None,
        control: CallControl | None,
        stored: dict[str, StoredResult] | None,
    ) -> tuple[_Group, Call]:
        """Run the call as a member of its group, and wait until the group was decided."""
        key = (conversation_id, turn_id)
        with self._lock:
            group = self._open.get(key)
            if group is None:
                group = self._open[key] = _Group(turn_id or f"turn-{uuid.uuid4().hex[:16]}")
            group.running += 1
        try:
            prepared = self._dispatcher.prepare(
                conversation_id, item, approver=approver, control=control, stored=stored
            )
        except BaseException:
            if self._finish(key, group, None):
                self._settle(conversation_id, turn_id, group)  # the others of the group still get decided
            raise
        if self._finish(key, group, prepared):
            self._settle(conversation_id, turn_id, group)
        elif not group.done.wait(self._wait_s):
            raise SandboxRuntimeError(f"the other calls of turn {group.turn_id} did not finish in {self._wait_s:g} s")
        return group, prepared

    def _finish(self, key: tuple[str, str | None], group: _Group, prepared: Call | None) -> bool:
        """Count one call of the group as finished; True for the last one, which decides for all."""
        with self._lock:
            group.running -= 1
            if prepared is not None:
                group.ready.append(prepared)
            if group.running:
                return False
            if self._open.get(key) is group:
                del self._open[key]  # later calls start a new group
            return True

    def _settle(self, conversation_id: str, turn_id: str | None, group: _Group) -> None:
        try:
            if group.ready:
                state = self._dispatcher.state
                shown_before = state.turn_shown(conversation_id, turn_id) if turn_id else 0
                group.report = self._dispatcher.settle(
                    conversation_id, group.ready, group.turn_id, shown_before_chars=shown_before
                )
                if turn_id is not None:
                    shown = group.report.total_after_chars - shown_before
                    state.add_turn_shown(conversation_id, turn_id, shown, time.time())
        except BaseException as exc:
            group.failure = exc
            raise
        finally:
            group.done.set()
