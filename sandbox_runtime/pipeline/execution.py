"""Running one call: resolve (expand ``delegate_call``) → validate → approve → execute → the execution record.

What goes back into the model's history is the short call it wrote; the execution record keeps, per call, the
short arguments, the expanded ones (when ``delegate_call`` read them from a file) with their sha256, the status,
the timings and the result's descriptor. Arguments are kept up to ``tools.record_args_max_bytes`` each; longer
ones are cut and marked, their digest still covers the whole.

**One channel for the model's failures.** Everything a call does — expanding, validating, approving, the handler —
runs under one ``try``, which decides what reaches the host:

* a :class:`~sandbox_runtime.errors.ToolFailure` (bad arguments, a refused or missing path, a malformed table file,
  a full attachments quota, ...) is a result with ``is_error``: its type and message, for the model to act on;
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

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandbox_runtime.errors import (
    InvalidToolArguments,
    PathNotFound,
    SandboxRuntimeError,
    ToolFailure,
    UnknownTool,
    UpstreamError,
)
from sandbox_runtime.models import CallRecord, ResultDescriptor
from sandbox_runtime.pipeline.approval import Approver, judge, make_request
from sandbox_runtime.policy import Policy
from sandbox_runtime.spill.spiller import is_mcp_error, result_text
from sandbox_runtime.tools.base import ToolContext, ToolReturn, ToolSpec, expired_or, validate_arguments
from sandbox_runtime.tools.delegate import DelegateCallArgs, expand_delegate_call

__all__ = ["DELEGATE", "CallRunner", "Ran", "internal_error", "is_infrastructure"]

logger = logging.getLogger(__name__)

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


@dataclass
class Ran:
    """One call after it ran (or was refused)."""

    ret: ToolReturn
    target: str  # the tool that ran: the call's own, or the one delegate_call named
    expanded: dict[str, Any] | None  # the arguments delegate_call built, when it did
    source: str | None  # the arguments file they came from
    started_at: float
    finished_at: float
    denied: bool = False

    @property
    def status(self) -> str:
        if self.denied:
            return "denied"
        if (self.ret.details or {}).get("status") == "cancelled":
            return "cancelled"  # the caller cancelled it (a run ended every process it started)
        return "error" if self.ret.is_error else "ok"


class CallRunner:
    """Resolves, judges and runs built-in and registered calls; takes in host results."""

    def __init__(
        self,
        policy: Policy,
        tools: Mapping[str, ToolSpec],
        approver: Approver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.tools = tools
        self.approver = approver
        self._clock = clock

    def host_result(self, tool: str, result: object, is_error: bool) -> Ran:
        now = self._clock()
        ret = self._host_error(tool, result) if is_error or is_mcp_error(result) else ToolReturn(content=result)
        return Ran(ret=ret, target=tool, expanded=None, source=None, started_at=now, finished_at=now)

    def _host_error(self, tool: str, result: object) -> ToolReturn:
        try:
            return ToolReturn(is_error=True, error=result_text(result))
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            logger.exception("the host's error result of %s could not be read", tool)
            return internal_error(tool, exc, during=" (reading the host's error result)")

    def run(
        self,
        ctx: ToolContext,
        call_id: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        approver: Approver | None = None,
        made_by: tuple[str, str] | None = None,
    ) -> Ran:
        """Run one call; ``approver`` (e.g. the MCP client's user, asked by elicitation) takes the place of the
        runtime's own for this call. ``made_by``: the tool whose run made the call and where its arguments came
        from (a run_python script: judged by the stricter of its rule and the target's, as a delegated call)."""
        started = self._clock()
        target, expanded, source = tool, None, None
        nesting_max = self.policy.tools.json_nesting_max
        try:
            if tool == DELEGATE:
                target, expanded, source = self._expand(ctx, arguments)
            spec = self._spec(target)
            label = f"{DELEGATE} → {target}" if expanded is not None else target
            sent = expanded if expanded is not None else arguments
            validated = validate_arguments(spec, sent, label=label, nesting_max=nesting_max)
            via = DELEGATE if expanded is not None else None
            if made_by is not None:
                via, source = made_by
            request = make_request(self.policy.approval, ctx.conversation_id, call_id, target, sent, source, via=via)
            refusal = judge(self.policy.approval, approver or self.approver, request)
            if refusal is not None:
                ret = ToolReturn(
                    is_error=True,
                    error=f"Denied: {refusal}. The call of {target} was not made; do not retry it unchanged.",
                )
                return Ran(ret, target, expanded, source, started, self._clock(), denied=True)
            ret = spec.handler(ctx, validated)
        except _MODEL_READS as exc:  # the model's call, or what the sandbox wrote: the model reads why
            ret = ToolReturn(is_error=True, error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            if is_infrastructure(exc):
                raise
            logger.exception("internal error in %s (call %s of conversation %s)", target, call_id, ctx.conversation_id)
            ret = internal_error(target, exc)
        return Ran(ret, target, expanded, source, started, self._clock())

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
        path = args.args_file.partition("#")[0]
        try:
            expanded = expand_delegate_call(
                ctx.root, args, max_bytes=self.policy.tools.args_file_max_bytes, nesting_max=nesting_max
            )
        except PathNotFound as exc:
            raise expired_or(ctx, path, exc) from exc
        return expanded.tool, expanded.arguments, expanded.source

    def record(
        self,
        conversation_id: str,
        turn_id: str,
        call_id: str,
        tool: str,
        arguments: dict[str, Any] | None,
        ran: Ran,
        descriptor: ResultDescriptor | None,
        error_path: str | None,
        made_by: str | None = None,
    ) -> CallRecord:
        """The execution record of one call, with its result's descriptor and error file (and the call whose
        script made it)."""
        cap = self.policy.tools.record_args_max_bytes
        short, short_cut = _capped_json(arguments, cap)
        expanded, expanded_cut = _capped_json(ran.expanded, cap)
        whole = ran.expanded if ran.expanded is not None else arguments
        digest = None
        if whole is not None:
            try:
                canonical = json.dumps(whole, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
            except (RecursionError, ValueError, TypeError):  # too deep, or not JSON (keys of mixed types, a cycle)
                canonical = None
            if canonical is not None:
                digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
        return CallRecord(
            conversation_id=conversation_id,
            call_id=call_id,
            turn_id=turn_id,
            tool=tool,
            target=ran.target,
            started_at=ran.started_at,
            finished_at=ran.finished_at,
            status=ran.status,
            arguments=short,
            expanded=expanded,
            arguments_sha256=digest,
            arguments_cut=short_cut or expanded_cut,
            descriptor=descriptor,
            error_path=error_path,
            made_by=made_by,
        )


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
