"""Approval: every call is judged on its real, expanded arguments before it runs.

The policy's ``[approval]`` section gives each tool a rule — ``allow``, ``deny`` or ``ask`` (``default_rule``
for the rest). ``ask`` hands an :class:`ApprovalRequest` to the host's approver (a callable given to
:class:`~sandbox_runtime.api.runtime.Runtime`); without one, ``rule_without_approver`` decides. The request shows
what will actually be sent: the arguments after ``delegate_call`` read its file and laid the overrides on top —
whole up to ``shown_max_chars``, else the start, a summary and the file's path. A denial becomes a tool error the
model can read, never an exception.

A delegated call is judged by two rules: that of ``delegate_call`` itself and that of the target tool (each its
``tool_rules`` entry, else ``default_rule``); the stricter wins — ``deny`` over ``ask`` over ``allow``. So
``tool_rules.delegate_call = "deny"`` stops every delegation, ``"ask"`` asks about each one (once, showing the
target and its expanded arguments), and a target's own ``deny`` or ``ask`` holds whether it is called directly or
through ``delegate_call``. (With ``default_rule = "deny"``, delegation needs ``delegate_call = "allow"`` as well
as an allowed target.)
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.policy import ApprovalPolicy, Rule
from sandbox_runtime.telemetry.tracing import failed, span

__all__ = ["ApprovalRequest", "Approver", "Judgement", "judge", "judgement", "make_request", "rule_for"]

logger = logging.getLogger(__name__)


class ApprovalRequest(BaseModel):
    """What an approver is shown: the call, and the arguments that will really be sent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    call_id: str
    tool: str
    arguments_json: str  # the expanded arguments, whole or cut at shown_max_chars
    arguments_chars: int
    arguments_sha256: str
    complete: bool  # False: arguments_json is cut; the whole is in `source`
    source: str | None = None  # the arguments file (delegate_call), when there was one
    summary: str  # one line: tool, argument names and sizes
    via: str | None = None  # the tool that made the call (delegate_call), when it was delegated


Approver = Callable[[ApprovalRequest], bool | str]  # True: run it; False or a reason: refuse


def _summary(tool: str, arguments: dict[str, Any]) -> str:
    parts = []
    for key, value in list(arguments.items())[:20]:
        size = len(json.dumps(value, ensure_ascii=False, default=str))
        parts.append(f"{key} ({size:,} characters)")
    more = f" and {len(arguments) - 20:,} more" if len(arguments) > 20 else ""
    return f"{tool} with {', '.join(parts) or 'no arguments'}{more}"


def make_request(
    policy: ApprovalPolicy,
    conversation_id: str,
    call_id: str,
    tool: str,
    arguments: dict[str, Any],
    source: str | None,
    *,
    via: str | None = None,
) -> ApprovalRequest:
    """The request for one call of ``tool`` (made through ``via`` when delegated), its arguments cut to
    ``shown_max_chars`` when longer."""
    text = json.dumps(arguments, ensure_ascii=False, indent=2, default=str)
    shown = text[: policy.shown_max_chars]
    return ApprovalRequest(
        conversation_id=conversation_id,
        call_id=call_id,
        tool=tool,
        arguments_json=shown,
        arguments_chars=len(text),
        arguments_sha256=hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
        complete=len(shown) == len(text),
        source=source,
        summary=_summary(tool, arguments),
        via=via,
    )


_STRICTNESS: dict[Rule, int] = {"allow": 0, "ask": 1, "deny": 2}


def rule_for(policy: ApprovalPolicy, request: ApprovalRequest) -> tuple[Rule, str]:
    """The rule that applies to ``request`` and the tool it comes from: the stricter of the target's and, for a
    delegated call, ``delegate_call``'s (on a tie, the target's)."""
    tools = [request.tool] if request.via is None else [request.tool, request.via]
    ruled = [(policy.tool_rules.get(tool, policy.default_rule), tool) for tool in tools]
    return max(ruled, key=lambda pair: _STRICTNESS[pair[0]])


class Judgement(NamedTuple):
    """How a call was judged: why it may not run (None: it may), the rule that applied and whose it was, and
    whether someone (the approver) was asked."""

    refusal: str | None
    rule: Rule
    ruled_by: str
    asked: bool


def judgement(policy: ApprovalPolicy, approver: Approver | None, request: ApprovalRequest) -> Judgement:
    """Judge one call (see the module text): the refusal, if any, with the rule and whether the approver was asked."""
    rule, ruled_by = rule_for(policy, request)
    if rule == "ask" and approver is None:
        fallback = policy.rule_without_approver
        if fallback == "deny":
            return Judgement(f"calls of {ruled_by} need approval, and no approver is available", rule, ruled_by, False)
        return Judgement(None, rule, ruled_by, False)
    if rule != "ask":
        refusal = None if rule == "allow" else f"the policy denies calls of {ruled_by}"
        return Judgement(refusal, rule, ruled_by, False)
    assert approver is not None  # noqa: S101  (checked above)
    with span("approval", {"sandbox_runtime.approval.rule": ruled_by}) as asking:
        try:
            answer = approver(request)
        except Exception as exc:
            logger.exception("the approver failed on %s (%s)", request.tool, request.call_id)
            failed(asking, type(exc).__qualname__)
            return Judgement(f"the approver failed: {type(exc).__name__}: {exc}", rule, ruled_by, True)
        asking.set_attribute("sandbox_runtime.approval.answer", "allow" if answer is True else "deny")
    if answer is True:
        return Judgement(None, rule, ruled_by, True)
    declined = answer if isinstance(answer, str) and answer else "the approver declined the call"
    return Judgement(declined, rule, ruled_by, True)


def judge(policy: ApprovalPolicy, approver: Approver | None, request: ApprovalRequest) -> str | None:
    """None when the call may run; otherwise the reason it may not (for the model to read)."""
    return judgement(policy, approver, request).refusal
