"""One pipeline for every tool call: resolve → approve → execute → spill → per-turn budget → persisted decision
and execution record.

A *turn* is a batch of calls the host runs together. Each item is either a :class:`ToolCall` of a built-in or
registered tool (run here — see :mod:`~sandbox_runtime.pipeline.call` for ``delegate_call`` expansion and approval;
several run in parallel) or a :class:`HostResult` (the host ran its own tool and hands in what it returned). Every
result then goes the same way: a failure's full error is saved in ``errors/`` and shortened; a result of
``threshold_chars`` or more is spilled to ``spill/`` (unless its tool is self-bounded); the turn's budget replaces
the largest spilled results by their stand-ins; and the exact text the model gets is stored per conversation and
call id *before* anything is returned. A call id decided before is never run or spilled again: its stored
decision is replayed, byte for byte, even after a restart or a change of policy.

Bad calls (unknown tool, arguments that do not fit, refused or missing paths, malformed files) become results with
``is_error`` the model can read, and so does an unexpected exception inside a tool or while its result is saved
(an internal-error result, logged with its traceback; see :mod:`~sandbox_runtime.pipeline.call`). Only
infrastructure failures (engine gone, sandbox cannot start) raise — and never at the cost of the turn's other
calls: every call of the batch still runs, those that finished are decided and stored as usual, and then the
failure is raised (with a note naming the calls that were decided). Run the turn again with the same call ids:
the decided calls are replayed, not run again; only the failed one runs anew.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import AdmissionRefused, InvalidToolArguments
from sandbox_runtime.models import HostResult, SpillMode, StoredResult, ToolCall, ToolOutcome, TurnReport
from sandbox_runtime.pipeline.admission import Admission
from sandbox_runtime.pipeline.approval import Approver
from sandbox_runtime.pipeline.call import (
    Call,
    CallRunner,
    call_record,
    internal_error,
    is_infrastructure,
    outcome,
    stored_result,
)
from sandbox_runtime.pipeline.claims import CallClaimer, check_call_id
from sandbox_runtime.pipeline.observed import INFRASTRUCTURE, REFUSED, observed_call
from sandbox_runtime.pipeline.script_tools import PipelineScriptTools
from sandbox_runtime.policy import Policy
from sandbox_runtime.spill.budget import BudgetCandidate, BudgetDecision, plan_turn_budget
from sandbox_runtime.spill.shown import shown_result, spill_rule
from sandbox_runtime.state.audit import unsettled_detail
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.telemetry.metrics import RuntimeMetrics
from sandbox_runtime.tools.base import ToolContext, ToolReturn, ToolSpec
from sandbox_runtime.workers import Workers

__all__ = ["Call", "Dispatcher", "HostResult", "ToolCall", "ToolOutcome", "TurnReport"]

logger = logging.getLogger(__name__)


class Dispatcher:
    """Runs turns for the conversations of one runtime."""

    def __init__(
        self,
        state: StateDB,
        policy: Policy,
        tools: dict[str, ToolSpec],
        context: Callable[[str], ToolContext],
        workers: Workers,
        clock: Callable[[], float] = time.time,
        approver: Approver | None = None,
        *,
        lease_id: str,
        admission: Admission | None = None,
        metrics: RuntimeMetrics,
    ) -> None:
        self.state = state
        self.claimer = CallClaimer(state, lease_id, policy.state.call_wait_s)
        self.policy = policy
        self.tools = tools  # the runtime's own mapping: tools it registers later are seen here too
        self._context = context
        self._workers = workers
        self._clock = clock
        self.metrics = metrics
        self.runner = CallRunner(policy, tools, approver, clock, audit=state.audit, metrics=metrics)
        self.admission = admission or Admission(policy.admission, metrics=metrics)

    def context(self, conversation_id: str) -> ToolContext:
        """What the conversation's calls run with (its folders made and held)."""
        return self._context(conversation_id)

    def run_turn(
        self,
        conversation_id: str,
        items: Sequence[ToolCall | HostResult],
        turn_id: str | None = None,
        *,
        approver: Approver | None = None,
        control: CallControl | None = None,
    ) -> TurnReport:
        """Run (or take in) every item, spill, apply the turn budget, store the decisions, and report;
        ``control`` cancels (and hears the progress of) every call of the turn."""
        calls = [item if item.call_id else item.model_copy(update={"call_id": _new_call_id()}) for item in items]
        ids = _unique([check_call_id(item.call_id) for item in calls])  # checked before anything runs
        stored = self.state.stored_results(conversation_id, ids)
        given = [item.call_id for item in items if item.call_id]  # a fresh id needs no claim
        claims = self.claimer.claim(conversation_id, given, stored, control)  # one running elsewhere: waited for
        try:
            return self._run_claimed(conversation_id, calls, stored, turn_id, approver, control)
        finally:
            self.claimer.give_back(conversation_id, claims)

    def _run_claimed(
        self,
        conversation_id: str,
        calls: list[ToolCall | HostResult],
        stored: dict[str, StoredResult],
        turn_id: str | None,
        approver: Approver | None,
        control: CallControl | None,
    ) -> TurnReport:
        ctx = self._context(conversation_id)
        prepared, failures = self._prepare_all(ctx, calls, stored, approver, control)
        if not failures:
            return self.settle(conversation_id, prepared, turn_id)
        failed_id, failure = failures[0]
        if prepared:  # the calls that finished keep their decisions: a retry replays them, never runs them again
            try:
                report = self.settle(conversation_id, prepared, turn_id)
            except BaseException as unsettled:
                raise unsettled from failure
            decided = ", ".join(o.call_id for o in report.outcomes)
            failure.add_note(
                f"call {failed_id} failed; the other calls of turn {report.turn_id} were decided and stored "
                f"({decided}): run the turn again with the same call ids to get them without running them again"
            )
        for other_id, other in failures[1:]:
            failure.add_note(f"call {other_id} failed as well: {type(other).__name__}: {other}")
        raise failure

    def prepare(
        self,
        conversation_id: str,
        item: ToolCall | HostResult,
        *,
        approver: Approver | None = None,
        control: CallControl | None = None,
        made_by: tuple[str, str] | None = None,
        context: ToolContext | None = None,
        stored: dict[str, StoredResult] | None = None,
    ) -> Call:
        """The first half of a turn, for one call that arrived on its own (an MCP request, or a script's call:
        ``made_by`` names the tool that made it and where its arguments came from, ``context`` is its run's):
        run it (or find its stored decision) and spill its result. The caller claimed its call id
        (:attr:`claimer`) or it is a script's. Its decision is made by :meth:`settle`,
        together with the other calls of its turn. ``control`` lets the caller cancel the run and hear its
        progress; ``stored``: its stored decision as the caller just read it (after its claim), when it did."""
        if not item.call_id:  # a fresh id: decided never
            item, stored = item.model_copy(update={"call_id": _new_call_id()}), {}
        call_id = check_call_id(item.call_id)
        if stored is None:
            stored = self.state.stored_results(conversation_id, [call_id])
        context = context or self._context(conversation_id)
        prepared, failures = self._prepare_all(context, [item], stored, approver, control, made_by)
        if failures:
            raise failures[0][1]
        return prepared[0]

    def settle(
        self,
        conversation_id: str,
        prepared: Sequence[Call],
        turn_id: str | None = None,
        *,
        shown_before_chars: int = 0,
        made_by: str | None = None,
    ) -> TurnReport:
        """The second half: one sync for the turn's files, the turn budget over all its results (of which
        ``shown_before_chars`` were already given to the model earlier in the same turn), and the decisions
        stored before anything is returned; ``made_by`` names the call whose script made these calls."""
        turn_id = turn_id or f"turn-{uuid.uuid4().hex[:16]}"
        ids = _unique([call.call_id for call in prepared])
        fresh = {call.call_id: call for call in prepared if call.ran}
        stored = {call.call_id: call.stored for call in prepared if call.stored is not None}
        if any(call.descriptor is not None or call.error_path is not None for call in fresh.values()):
            self._sync(prepared[0].ctx, fresh)  # one sync of the folder, before the decisions are stored
        decision = self._budget(ids, stored, fresh, shown_before_chars)
        now = self._clock()
        cap = self.policy.tools.record_args_max_bytes
        kept = self.state.store_results(
            [stored_result(call, conversation_id, turn_id, now) for call in fresh.values()],
            [call_record(call, conversation_id, turn_id, cap, made_by) for call in fresh.values()],
        )  # written (with their audit entries) before anything is returned; a concurrent first decision wins
        outcomes = []
        for call_id in ids:
            if call_id in fresh and kept[call_id].text == fresh[call_id].text():
                outcomes.append(outcome(kept[call_id], fresh[call_id]))
            else:
                outcomes.append(outcome(stored.get(call_id) or kept[call_id]))
        return TurnReport(
            turn_id=turn_id,
            outcomes=outcomes,
            total_before_chars=decision.total_before_chars,
            total_after_chars=decision.total_after_chars,
            budget_chars=decision.budget_chars,
            over_budget=decision.over_budget,
            replaced_call_ids=[ids[i] for i in decision.replace],  # the earlier-shown entry never gives way
        )

    @staticmethod
    def _sync(ctx: ToolContext, fresh: dict[str, Call]) -> None:
        try:
            ctx.root.sync()
        except OSError as exc:
            warning = f"the results folder could not be synced to disk: {exc}"
            logger.warning(warning)
            for call in fresh.values():
                call.warnings.append(warning)

    # ------------------------------------------------------------------------------------------ execute
    def _prepare_all(
        self,
        ctx: ToolContext,
        items: Sequence[ToolCall | HostResult],
        stored: dict[str, StoredResult],
        approver: Approver | None,
        control: CallControl | None = None,
        made_by: tuple[str, str] | None = None,
    ) -> tuple[list[Call], list[tuple[str, BaseException]]]:
        """Every item run (or found decided) and spilled; and the calls that raised (infrastructure failures), each
        with its call id — one call's failure stops none of the others."""

        def prepare(item: ToolCall | HostResult) -> Call | BaseException:
            call_id = item.call_id or ""
            if call_id in stored:
                return Call(item, ctx, stored=stored[call_id])
            scripts = PipelineScriptTools(self, ctx, call_id, approver, control)
            call = Call(item, dataclasses.replace(ctx, call_id=call_id, control=control, scripts=scripts))
            tenant = self.state.tenants.of_key(ctx.conversation_id)
            try:
                with observed_call(call, tenant, self.metrics):
                    if isinstance(item, HostResult):
                        self.runner.host_result(call, item.result, item.is_error)
                    elif made_by is not None:  # a script's call runs in its run's slot
                        self.runner.run(call, item.arguments, approver=approver, made_by=made_by)
                    else:
                        self._admitted(call, tenant, item.arguments, approver, control)
                    self._spill_or_fault(call)
            except BaseException as exc:  # raised once the others of the turn are decided
                if isinstance(exc, Exception):
                    self.audit_unsettled(call, tenant, exc)
                return exc
            return call

        if sum(isinstance(item, ToolCall) and item.call_id not in stored for item in items) <= 1:
            done = [prepare(item) for item in items]
        else:
            done = self._workers.map(prepare, items)  # the runtime's one pool
        prepared = [p for p in done if isinstance(p, Call)]
        failures = [
            (item.call_id or "", p) for item, p in zip(items, done, strict=True) if isinstance(p, BaseException)
        ]
        return prepared, failures

    def _admitted(
        self,
        call: Call,
        tenant: str,
        arguments: dict[str, Any],
        approver: Approver | None,
        control: CallControl | None,
    ) -> None:
        """Run a call in a run slot of its conversation's tenant (:mod:`~sandbox_runtime.pipeline.admission`);
        one cancelled while it waited is recorded cancelled, never run; one refused its turn raises
        :class:`~sandbox_runtime.errors.AdmissionRefused` (audited by :meth:`audit_unsettled`)."""
        try:
            with self.admission.slot(tenant, control) as admitted:
                call.queued_s = admitted.waited_s
                if admitted.cancelled:
                    call.target = call.item.tool
                    call.started_at = self._clock()
                    left = (
                        f"Cancelled after {admitted.waited_s:.1f} s waiting for a run slot: {call.target} did not run."
                    )
                    call.finish(ToolReturn(is_error=True, error=left), "cancelled", call.started_at)
                    return
                self.runner.run(call, arguments, approver=approver)
        except AdmissionRefused as refused:  # no run slot in time, its tenant's disk full, or (in the run) no sandbox
            # its whole wait goes on the refusal (for the caller's quota): the run slot's, when it got one and a
            # sandbox's turn was refused in its run, and what the refusal measured
            refused.waited_s += call.queued_s
            call.queued_s = refused.waited_s
            raise

    def audit_unsettled(self, call: Call, tenant: str, exc: Exception) -> None:
        """A call that raised (admission refused it, or an infrastructure failure ended it) ends with no decision
        (its call id runs anew when tried again), so :meth:`settle` never audits it: its ``call`` entry is written
        here, as :func:`call_record` and :func:`~sandbox_runtime.state.audit.call_detail` describe every call, with
        the status the metrics count it under (``refused`` or ``infrastructure``), the reason and its wait."""
        call.target = call.target or call.item.tool
        call.finished_at = call.finished_at or self._clock()
        call.started_at = call.started_at or call.finished_at  # (refused in the queue: it never started)
        conversation = call.ctx.conversation_id
        record = call_record(call, conversation, None, self.policy.tools.record_args_max_bytes, None)
        facts: dict[str, Any] = {"waited_s": round(call.queued_s, 3), "error_type": type(exc).__name__}
        if isinstance(exc, AdmissionRefused):
            detail = unsettled_detail(record, REFUSED, str(exc), **facts, retry_after_s=exc.retry_after_s)
        else:
            detail = unsettled_detail(record, INFRASTRUCTURE, str(exc), **facts)
        self.state.audit.append("call", conversation=conversation, call_id=call.call_id, tenant=tenant, **detail)

    # ------------------------------------------------------------------------------------------ spill
    def _spill_or_fault(self, call: Call) -> None:
        """Spill the call's result; when saving it fails unexpectedly (a result no writer takes), an internal-error
        result in its place, logged with its traceback."""
        try:
            self._spill(call)
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            logger.exception("internal error saving the result of %s (call %s)", call.target, call.call_id)
            ret = internal_error(call.target, exc, during=" (saving its result)")
            call.finish(ret, "internal", call.finished_at)
            self._spill(call)

    def _mode(self, item: ToolCall | HostResult, tool: str) -> tuple[SpillMode, int | None]:
        if isinstance(item, HostResult):
            mode, threshold = item.spill_mode, item.threshold_chars
        else:
            spec = self.tools.get(tool)
            mode, threshold = (spec.spill_mode, spec.threshold_chars) if spec else ("normal", None)
        return spill_rule(self.policy.spill, tool, mode, threshold)

    def _spill(self, call: Call) -> None:
        """The call's result as the model will see it (:func:`~sandbox_runtime.spill.shown.shown_result`)."""
        ret = call.ret
        mode, threshold = self._mode(call.item, call.target)
        shown = shown_result(
            call.ctx.root,
            ret.content,
            error=ret.error,
            note=ret.note,
            built=ret.descriptor,
            error_path=ret.error_path,
            tool=call.target,
            call_id=call.call_id,
            mode=mode,
            threshold_chars=threshold,
            policy=self.policy.spill,
            now=dt.datetime.fromtimestamp(self._clock(), dt.UTC),
        )
        call.body, call.stand_in, call.tail, call.descriptor = shown.body, shown.stand_in, shown.tail, shown.descriptor
        call.error_path, call.warnings = shown.error_path, shown.warnings
        call.is_error = ret.is_error or shown.rows_failed
        if shown.rows_failed:
            call.failure = call.failure or "tool_error"

    def _budget(
        self, ids: list[str], stored: dict[str, StoredResult], fresh: dict[str, Call], shown_before_chars: int
    ) -> BudgetDecision:
        candidates = []
        for call_id in ids:
            if call_id in fresh:
                call = fresh[call_id]
                shown = len(call.text())
                stand_in = None if call.stand_in is None else len(call.stand_in) + shown - len(call.body)
                size = call.descriptor.chars if call.descriptor is not None else None
                candidates.append(BudgetCandidate(shown, stand_in, size))
            else:
                candidates.append(BudgetCandidate(len(stored[call_id].text), None))
        if shown_before_chars:
            candidates.append(BudgetCandidate(shown_before_chars, None))  # given earlier: cannot give way
        decision = plan_turn_budget(
            candidates, budget_chars=self.policy.spill.turn_budget_chars, floor_chars=self.policy.spill.turn_floor_chars
        )
        self.metrics.budget_replacements.inc(len(decision.replace))
        for i in decision.replace:
            call = fresh[ids[i]]
            call.replaced = True
            if call.descriptor is not None:
                call.descriptor = call.descriptor.model_copy(update={"truncated_inline": True})
        if decision.over_budget:
            logger.warning(
                "a turn's results show %d characters inline, over the budget of %d: the rest cannot give way "
                "(self-bounded tools, results not saved, or results under %d characters)",
                decision.total_after_chars,
                decision.budget_chars,
                self.policy.spill.turn_floor_chars,
            )
        return decision


def _new_call_id() -> str:
    return f"call-{uuid.uuid4().hex[:16]}"


def _unique(ids: list[str]) -> list[str]:
    if len(set(ids)) != len(ids):
        repeated = ", ".join(sorted(call_id for call_id, n in Counter(ids).items() if n > 1))
        raise InvalidToolArguments(f"call ids must be unique within a turn; repeated: {repeated}")
    return ids
