"""When a tool result goes to a file and how much of it the model sees inline (``[spill]``, ``[spill.tools.*]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sandbox_runtime.policy.base import MiB, PositiveInt, Section

__all__ = ["CHARS_PER_TOKEN", "SpillPolicy", "ToolSpillRule"]

CHARS_PER_TOKEN = 4  # the estimate behind every limit given in tokens: English prose and JSON average ~4


class ToolSpillRule(Section):
    """How one tool's results are spilled, overriding what the tool declares itself."""

    mode: Literal["normal", "self_bounded"] = Field(
        "normal", description="'self_bounded': the tool bounds its own output; never spilled or budgeted."
    )
    threshold_chars: PositiveInt | None = Field(None, description="This tool's own spill threshold.")


class SpillPolicy(Section):
    """When a tool result goes to a file, and how much of it the model still sees inline."""

    threshold_chars: PositiveInt = Field(1000, description="Results of this many characters or more are spilled.")
    inline_cap_tokens: PositiveInt = Field(
        50_000, description="Above this (estimated as characters / 4) the model sees a preview instead."
    )
    preview_chars: PositiveInt = Field(2000, description="Preview length in characters (whole code points).")
    retention_s: PositiveInt = Field(
        7 * 86400, description="Spill, error and argument files expire after this many seconds."
    )
    retention_interval_s: PositiveInt = Field(6 * 3600, description="How often expired files are removed.")
    turn_budget_chars: PositiveInt = Field(
        200_000, description="Most characters a turn's results show inline; the largest spilled ones give way."
    )
    turn_floor_chars: PositiveInt = Field(
        5_000, description="Results shorter than this are never replaced by the turn budget."
    )
    manifest_max_bytes: PositiveInt = Field(
        64 * MiB, description="Cap of results/manifest.jsonl; past it spills are still made, not listed."
    )
    tools: dict[str, ToolSpillRule] = Field(default_factory=dict, description="Per-tool rules by tool name.")

    @property
    def inline_cap_chars(self) -> int:
        """The inline cap in characters: tokens are estimated as 4 characters each (no tokenizer runs)."""
        return self.inline_cap_tokens * CHARS_PER_TOKEN
