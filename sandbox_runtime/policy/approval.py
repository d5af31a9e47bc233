"""Which calls run (``[approval]``): judged on the real, expanded arguments."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sandbox_runtime.policy.base import PositiveInt, Section

__all__ = ["ApprovalPolicy", "Rule"]

Rule = Literal["allow", "deny", "ask"]


class ApprovalPolicy(Section):
    """Which calls run: judged on the real, expanded arguments (after delegate_call read its file)."""

    default_rule: Rule = Field("allow", description="The rule for tools not named in `tool_rules`.")
    tool_rules: dict[str, Rule] = Field(default_factory=dict, description="Per-tool rules by tool name.")
    rule_without_approver: Literal["allow", "deny"] = Field(
        "deny", description="What 'ask' means when the host gave no approver (and, later, no MCP elicitation)."
    )
    shown_max_chars: PositiveInt = Field(
        20_000, description="Longest arguments text an approval request shows; longer: a summary and the path."
    )
