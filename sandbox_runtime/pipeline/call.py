"""One call through the pipeline: what the dispatcher holds of it from the request to the stored decision
(:class:`Call`), how it runs (:class:`CallRunner`), and what is derived from it, each by one function: the decision
kept for replay (:func:`stored_result`), the execution record (:func:`call_record`) and what the caller gets
(:func:`outcome`).

A :class:`Call` is filled in as it goes, by the step that knows each part: the run (:class:`CallRunner`: resolve,
expanding ``delegate_call`` → validate → approve → execute; the tool that ran, the expanded arguments and their
file, the timings, the tool's return, and ``failure``, set where the failure is caught), the spill (the
:class:`~sandbox_runtime.pipeline.dispatch.Dispatcher`: body, stand-in, the lines after them, the file's
descriptor, the error file, warnings), and the turn budget (``replaced``). A call decided before carries its
stored decision instead (``stored``) and is replayed as it is.

**One channel for the model's failures.** Everything a call does — expanding, validating, approving, the handler —
runs under one ``try``, which decides what reaches the host:

* a :class:`~sandbox_runtime.errors.ToolFailure` (bad arguments, a refused or missing path, a malformed table file,
  a full attachments quota, ...) is a result with ``is_error``: its type and message, for the model to act on
  (a missing file that retention removed is said to have expired, here, for every tool);
* an :class:`~sandbox_runtime.errors.UpstreamError` is one too (the model reads why an upstream MCP server failed,
  as the host-tool wrapper has always given it);
* any other :class:`~sandbox_runtime.errors.SandboxRuntimeError`, and a ``ConnectionError``, is an infrastructure
  failure (the engine, a sandbox, the image, the quota): it raises, and the call gets no stored decision, so the
  same call id runs again when retried;
* any other exception (``RecursionError``, ``OverflowError``, a library's ``ValueError``, ...) is a fault inside
  the tool: logged with its traceback, it becomes an internal-error result naming the tool and the exception.

So only infrastructure failures raise, whatever type the library underneath a tool raises.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandbox_runtime.errors import (
    InvalidToolArguments,
    PathExpired,
    PathNotFound,
    SandboxRuntimeError,
    ToolFailure,
    UnknownTool,
    UpstreamError,
)
from sandbox_runtime.models import (
    CallFailure,
    CallRecord,
    CallStatus,
    HostResult,
    ResultDescriptor,
    StoredResult,
    ToolCall,
    ToolOutcome,
)
from sandbox_runtime.pipeline.approval import ApprovalRequest, Approver, Judgement, judgement, make_request
from sandbox_runtime.policy import Policy
from sandbox_runtime.spill.spiller import is_mcp_error, result_text
from sandbox_runtime.state.audit import AuditLog
from sandbox_runtime.telemetry.metrics import RuntimeMetrics
from sandbox_runtime.tools.base import ToolContext, ToolReturn, ToolSpec, validate_arguments
from sandbox_runtime.tools.delegate import DelegateCallArgs, expand_delegate_call

__all__ = [
    "DELEGATE",
    "Call",
    "CallRunner",
    "call_record",
    "internal_error",
    "is_infrastructure",
    "outcome",
    "stored_result",
]

logger = logging.getLogger(__name__)

_STATUS: dict[CallFailure | None, CallStatus] = {None: "ok", "denied": "denied", "cancelled": "cancelled"}  # else error


def failure_of(ret: ToolReturn) -> CallFailure | None:
    """Why a tool's return is a failure, as the tool said it: cancelled by the caller, or failed on its input."""
    if ret.cancelled:
        return "cancelled"
    return "tool_error" if ret.is_error else None


@dataclass(eq=False)
class Call:
    """One call of a turn, from its request to its decision (see the module text)."""

    item: ToolCall | HostResult
    ctx: ToolContext  # the context it runs in: its results folder is synced before the decision
    stored: StoredResult | None = None  # decided before: replayed as it is, never run again
    # the run
    target: str = ""  # the tool that ran: the call's own, or the one delegate_call named
    expanded: dict[str, Any] | None = None  # the arguments delegate_call built, when it did
    source: str | None = None  # the file they came from (or the script that made the call)
    started_at: float = 0.0
    finished_at: float = 0.0
    ret: ToolReturn = field(default_factory=ToolReturn)
    failure: CallFailure | None = None
    # the spill and the turn budget
    is_error: bool = False
    body: str = ""
    stand_in: str | None = None  # what the turn budget may show instead of the body
    tail: str = ""  # the short error, notes: shown after the body (or the stand-in) either way
    descriptor: ResultDescriptor | None = None
    error_path: str | None = None
    warnings: list[str] = field(default_factory=list)
    replaced: bool = False
    queued_s: float = 0.0  # how long it waited for its tenant's run slot

    @property
    def call_id(self) -> str:
        return self.item.call_id or ""

    @property
    def ran(self) -> bool:
        """Whether it ran now (else it was decided before)."""
        return self.stored is None

    @property
    def status(self) -> CallStatus:
        return _STATUS.get(self.failure, "error")

    def finish(self, ret: ToolReturn, failure: CallFailure | None, finished_at: float) -> None:
        """What the tool returned (or what stands for it), and why it failed, when it did."""
        self.ret, self.failure, self.finished_at = ret, failure, finished_at

    def text(self) -> str:
        """Exactly what the model is given."""
        shown = self.stand_in if self.replaced and self.stand_in is not None else self.body
        return "\n".join(part for part in (shown, self.tail) if part)


# ------------------------------------------------------------------------------------------ running it
DELEGATE = "delegate_call"
_MODEL_READS = (ToolFailure, UpstreamError)  # results with is_error: what the model sent or the sandbox wrote
_INTERNAL_MESSAGE_MAX_CHARS = 2_000  # of an unexpected exception's message, in an internal-error result


def is_infrastructure(exc: BaseException) -> bool:
    """True for a failure of what the runtime stands on (engine, sandbox, image, quota, a connection): it raises.
    False for what the model reads (a :class:`ToolFailure`, an :class:`UpstreamError`) and for a fault inside a
    tool (any other ``Exception``). What is no ``Exception`` at all (an interrupt, ``SystemExit``) always raises."""
    if not isinstance(exc, Exception):
        return True
    if isinstance(exc, _MODEL_READS):
        return False
    return isinstance(exc, SandboxRuntimeError | ConnectionError)


def internal_error(tool: str, exc: BaseException, *, during: str = "") -> ToolReturn:
    """The result of an unexpected exception inside ``tool`` (the caller logs its traceback)."""
    text = str(exc)
    cut = text[:_INTERNAL_MESSAGE_MAX_CHARS] + ("…" if len(text) > _INTERNAL_MESSAGE_MAX_CHARS else "")
    detail = f"{type(exc).__name__}: {cut}" if cut else type(exc).__name__
    return ToolReturn(
        is_error=True,
        error=(
            f"Internal error in {tool}{during}: {detail}. The tool failed unexpectedly on this input (the host's "
            "log has the details); the same call is likely to fail the same way: change its input or take another way."
        ),
    )


class CallRunner:
    """Resolves, judges and runs built-in and registered calls; takes in host results."""

    def __init__(
        self,
        policy: Policy,
        tools: Mapping[str, ToolSpec],
        approver: Approver | None = None,
        clock: Callable[[], float] = time.time,
        audit: AuditLog | None = None,
        *,
        metrics: RuntimeMetrics,
    ) -> None:
        self.policy = policy
        self.tools = tools
        self.approver = approver
        self.audit = audit
        self.metrics = metrics
        self._clock = clock

    def host_result(self, call: Call, result: object, is_error: bool) -> None:
        """Take in what the host's own tool returned."""
        call.target = call.item.tool
        call.started_at = self._clock()
        if not (is_error or is_mcp_error(result)):
            call.finish(ToolReturn(content=result), None, call.started_at)
            return
        try:
            call.finish(ToolReturn(is_error=True, error=result_text(result)), "tool_error", call.started_at)
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            logger.exception("the host's error result of %s could not be read", call.item.tool)
            ret = internal_error(call.item.tool, exc, during=" (reading the host's error result)")
            call.finish(ret, "internal", call.started_at)

    def run(
        self,
        call: Call,
        arguments: dict[str, Any],
        *,
        approver: Approver | None = None,
        made_by: tuple[str, str] | None = None,
    ) -> None:
        """Run one call (its context is ``call.ctx``); ``approver`` (e.g. the MCP client's user, asked by
        elicitation) takes the place of the runtime's own for this call. ``made_by``: the tool whose run made the
        call and where its arguments came from (a run_python script: judged by the stricter of its rule and the
        target's, as a delegated call)."""
        ctx, tool = call.ctx, call.item.tool
        call.started_at = self._clock()
        call.target = tool
        nesting_max = self.policy.tools.json_nesting_max
        try:
            if tool == DELEGATE:
                call.target, call.expanded, call.source = self._expand(ctx, arguments)
            target = call.target
            spec = self._spec(target)
            label = f"{DELEGATE} → {target}" if call.expanded is not None else target
            sent = call.expanded if call.expanded is not None else arguments
            validated = validate_arguments(spec, sent, label=label, nesting_max=nesting_max)
            via = DELEGATE if call.expanded is not None else None
            if made_by is not None:
                via, call.source = made_by
            request = make_request(
                self.policy.approval, ctx.conversation_id, call.call_id, target, sent, call.source, via=via
            )
            judged = judgement(self.policy.approval, approver or self.approver, request)
            self._audit_judgement(request, judged, sent)
            if judged.asked or judged.refusal is not None:
                decision = "refused" if not judged.asked else "allowed" if judged.refusal is None else "denied"
                self.metrics.approvals.labels(decision).inc()
            refusal = judged.refusal
            if refusal is not None:
                denied = f"Denied: {refusal}. The call of {target} was not made; do not retry it unchanged."
                call.finish(ToolReturn(is_error=True, error=denied), "denied", self._clock())
                return
            ret = spec.handler(ctx, validated)
            call.finish(ret, failure_of(ret), self._clock())
        except _MODEL_READS as exc:  # the model's call, or what the sandbox wrote: the model reads why
            if isinstance(exc, PathNotFound):
                exc = _expired_or(ctx, exc)
            failure: CallFailure = "invalid_arguments" if isinstance(exc, InvalidToolArguments) else "tool_error"
            call.finish(ToolReturn(is_error=True, error=f"{type(exc).__name__}: {exc}"), failure, self._clock())
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            logger.exception(
                "internal error in %s (call %s of conversation %s)", call.target, call.call_id, ctx.conversation_id
            )
            call.finish(internal_error(call.target, exc), "internal", self._clock())

    def _audit_judgement(self, request: ApprovalRequest, judged: Judgement, sent: dict[str, Any]) -> None:
        """An approval asked (and its answer), or a denial, in the audit trail (with the digest of the arguments
        ``sent``, as the call has it)."""
        if self.audit is None or not (judged.asked or judged.refusal is not None):
            return
        facts: dict[str, Any] = {
            "tool": request.tool,
            "via": request.via,
            "arguments_sha256": _digest(sent),
            "rule": judged.rule,
            "ruled_by": judged.ruled_by,
        }
        conversation, call_id = request.conversation_id, request.call_id
        if judged.asked:
            answer = "allow" if judged.refusal is None else "deny"
            self.audit.append("approval", conversation=conversation, call_id=call_id, answer=answer, **facts)
        if judged.refusal is not None:
            self.audit.append("denial", conversation=conversation, call_id=call_id, reason=judged.refusal, **facts)

    def _spec(self, name: str) -> ToolSpec:
        spec = self.tools.get(name)
        if spec is None:
            raise UnknownTool(f"there is no tool named {name!r}; the tools are: {', '.join(self.tools)}")
        return spec

    def _expand(self, ctx: ToolContext, raw: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
        nesting_max = self.policy.tools.json_nesting_max
        args: DelegateCallArgs = validate_arguments(self._spec(DELEGATE), raw, nesting_max=nesting_max)
        if args.tool == DELEGATE:
            raise InvalidToolArguments("delegate_call cannot call delegate_call; name the tool itself")
        self._spec(args.tool)  # an unknown target is an error before any file is read
        expanded = expand_delegate_call(
            ctx.root, args, max_bytes=self.policy.tools.args_file_max_bytes, nesting_max=nesting_max
        )
        return expanded.tool, expanded.arguments, expanded.source


def _expired_or(ctx: ToolContext, missing: PathNotFound) -> PathNotFound:
    """The clear "expired" error when the file asked for is one retention removed; else ``missing`` as it is. The
    one place a missing file becomes an expired one, for every tool and for ``delegate_call``'s file."""
    if missing.path is None or isinstance(missing, PathExpired):
        return missing
    gone = ctx.expired(missing.path)
    if gone is None:
        return missing
    removed = dt.datetime.fromtimestamp(gone.removed_at, dt.UTC).isoformat(timespec="seconds")
    days = ctx.policy.spill.retention_s / 86400
    return PathExpired(
        f"{missing.path} has expired: it was removed on {removed} (spill, error and argument files are kept "
        f"{days:g} days). Re-run the query or tool that produced it to get a fresh copy.",
        path=missing.path,
    )


# ------------------------------------------------------------------------------------------ what is derived
def stored_result(call: Call, conversation_id: str, turn_id: str, now: float) -> StoredResult:
    """The decision kept for a call that ran now: replayed, byte for byte, whenever its call id comes again."""
    return StoredResult(
        conversation_id=conversation_id,
        call_id=call.call_id,
        tool=call.item.tool,
        turn_id=turn_id,
        decided_at=now,
        is_error=call.is_error,
        replaced=call.replaced or bool(call.descriptor and call.descriptor.truncated_inline),
        text=call.text(),
        descriptor=call.descriptor,
        error_path=call.error_path,
        failure=call.failure,
    )


def call_record(
    call: Call, conversation_id: str, turn_id: str | None, args_max_bytes: int, made_by: str | None
) -> CallRecord:
    """The execution record of a call that ran now: the short call, the expanded arguments (each cut at
    ``args_max_bytes``, their digest over the whole), the status and why it failed, the timings, its files, and
    the call whose script made it (``turn_id``: None for a call that ended before its turn was decided)."""
    arguments = call.item.arguments if isinstance(call.item, ToolCall) else None
    short, short_cut = _capped_json(arguments, args_max_bytes)
    expanded, expanded_cut = _capped_json(call.expanded, args_max_bytes)
    whole = call.expanded if call.expanded is not None else arguments
    return CallRecord(
        conversation_id=conversation_id,
        call_id=call.call_id,
        turn_id=turn_id,
        tool=call.item.tool,
        target=call.target,
        started_at=call.started_at,
        finished_at=call.finished_at,
        status=call.status,
        arguments=short,
        expanded=expanded,
        arguments_sha256=None if whole is None else _digest(whole),
        arguments_cut=short_cut or expanded_cut,
        descriptor=call.descriptor,
        error_path=call.error_path,
        made_by=made_by,
        failure=call.failure,
    )


def outcome(stored: StoredResult, fresh: Call | None = None) -> ToolOutcome:
    """What the caller gets for a stored decision; ``fresh``: the call it was just made from, whose warnings,
    details and MCP extras (never replayed) come along. Without it the decision is a replay."""
    extras: dict[str, Any] = {}
    if fresh is not None:
        ret = fresh.ret
        extras = {
            "warnings": fresh.warnings,
            "details": ret.details,
            "blocks": ret.blocks,
            "annotations": ret.annotations,
            "structured": ret.structured,
            "queued_s": fresh.queued_s,
        }
    return ToolOutcome(
        call_id=stored.call_id,
        tool=stored.tool,
        is_error=stored.is_error,
        text=stored.text,
        descriptor=stored.descriptor,
        error_path=stored.error_path,
        replaced=stored.replaced,
        replayed=fresh is None,
        **extras,
    )


def _digest(value: dict[str, Any]) -> str | None:
    """The sha256 of the arguments as canonical JSON; None for arguments that are not JSON (too deep, keys of
    mixed types, a cycle)."""
    try:
        canonical = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
    except (RecursionError, ValueError, TypeError):
        return None
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _capped_json(value: dict[str, Any] | None, cap_bytes: int) -> tuple[str | None, bool]:
    if value is None:
        return None, False
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (RecursionError, ValueError, TypeError) as exc:  # arguments the call refused: say why they are not here
        return f"[not recorded: {type(exc).__name__}: {str(exc)[:200]}]", True
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= cap_bytes:
        return text, False
    return data[:cap_bytes].decode("utf-8", "ignore") + f"…[cut: {len(data):,} bytes in all]", True
