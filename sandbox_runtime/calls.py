"""What goes into a turn and what comes out: the calls a model made (or the host ran), their outcomes, the report.

The dispatch pipeline (:mod:`~sandbox_runtime.dispatch`) takes these in and gives these back; the Python API and
the MCP server pass them on.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.spill.spiller import ResultDescriptor
from sandbox_runtime.tools.base import SpillMode

__all__ = ["HostResult", "ToolCall", "ToolOutcome", "TurnReport"]


class ToolCall(BaseModel):
    """A call of a built-in tool, as the model wrote it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    call_id: str | None = None


class HostResult(BaseModel):
    """The result of one of the host's own tools: text, a JSON value, an MCP ``CallToolResult``, or a table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str
    call_id: str
    result: Any
    is_error: bool = False
    spill_mode: SpillMode = "normal"
    threshold_chars: int | None = Field(None, gt=0)


class ToolOutcome(BaseModel):
    """What one call came to: ``text`` is exactly what the model is given (and what history replays)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_id: str
    tool: str
    is_error: bool
    text: str
    descriptor: ResultDescriptor | None = None
    error_path: str | None = None
    replaced: bool = False  # the model sees a stand-in (preview and path), by the inline cap or the turn budget
    replayed: bool = False  # the decision was made before (same call id) and is given again unchanged
    warnings: list[str] = Field(default_factory=list)
    details: dict[str, Any] | None = None  # for the host: e.g. a run's status and exit code (not replayed)
    blocks: list[dict[str, Any]] = Field(default_factory=list)  # MCP content blocks after the text (not replayed)
    annotations: dict[str, Any] | None = None  # MCP annotations of the text block (not replayed)
    structured: Any = None  # a host tool's own structured result, when it gave one (not replayed)


class TurnReport(BaseModel):
    """A turn's outcomes, in the order given, and what the budget did."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turn_id: str
    outcomes: list[ToolOutcome]
    total_before_chars: int
    total_after_chars: int
    budget_chars: int
    over_budget: bool
    replaced_call_ids: list[str]
