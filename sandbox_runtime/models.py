"""The public models, in one place: what goes into a turn (:class:`ToolCall`, :class:`HostResult`) and what comes
out (:class:`ToolOutcome`, :class:`TurnReport`), the file a result was saved to (:class:`ResultDescriptor`), the
stored decision and execution record of a call (:class:`StoredResult`, :class:`CallRecord`), and attachments.

Every layer uses these types as they are; only the state database (:mod:`~sandbox_runtime.state.database`) turns
them into rows and back.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Attachment",
    "AttachmentCard",
    "CallFailure",
    "CallRecord",
    "CallStatus",
    "DescribedFormat",
    "HostResult",
    "QuotaMode",
    "ResultDescriptor",
    "RunStatus",
    "SavedResult",
    "SpillMode",
    "StoredResult",
    "ToolCall",
    "ToolOutcome",
    "TurnReport",
]

DescribedFormat = Literal["json", "table", "text", "csv", "xlsx"]  # spills, and the files tools build
SpillMode = Literal["normal", "self_bounded"]  # self_bounded: the tool bounds its own output (never spilled)
CallStatus = Literal["ok", "error", "denied", "cancelled"]  # how a call ended, as its execution record says
CallFailure = Literal["denied", "invalid_arguments", "tool_error", "internal", "cancelled"]
"""Why a call failed, set where the failure was caught: refused by approval; arguments that do not fit; the tool
(or an upstream server) failed on its input, or the sandbox's file; a fault inside the tool; cancelled by the
caller."""
RunStatus = Literal["ok", "error", "timeout", "memory_limit", "output_limit", "quota_exceeded", "cancelled"]
QuotaMode = Literal["loop", "measured"]  # loop: enforced by a volume of its own; measured: reported after a run


class ResultDescriptor(BaseModel):
    """What a spilled result carries: the same object in the Python API and over MCP."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spilled: Literal[True] = True
    path: str
    format: DescribedFormat
    bytes: int
    chars: int | None  # None for binary files (xlsx)
    sha256: str
    rows: int | None = None
    columns: list[str] | None = None
    column_types: list[str] | None = None
    preview: str
    truncated_inline: bool
    expires_at: str | None  # None: a file retention does not remove (an export)


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
    queued_s: float = 0.0  # how long it waited for a run slot of its tenant (fair admission; not replayed)


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


class StoredResult(BaseModel):
    """The decision made for one tool result: the exact text the model was given, kept for replay."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    call_id: str
    tool: str
    turn_id: str | None
    decided_at: float
    is_error: bool
    replaced: bool
    text: str
    descriptor: ResultDescriptor | None
    error_path: str | None
    failure: CallFailure | None = None  # why the call failed (None: it did not, or it was decided before this was kept)


class SavedResult(BaseModel):
    """A result that was saved to a file: which call made it, when, and the file's descriptor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_id: str
    tool: str
    decided_at: float
    descriptor: ResultDescriptor


class CallRecord(BaseModel):
    """The execution record of one call: what the model wrote, what was really run, and how it ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    call_id: str
    turn_id: str | None
    tool: str  # as the model called it (e.g. delegate_call)
    target: str  # what ran (the delegated tool)
    started_at: float
    finished_at: float
    status: CallStatus
    arguments: str | None  # the short call, as JSON (cut to the policy's record cap)
    expanded: str | None  # the expanded arguments, when they differ from the short call
    arguments_sha256: str | None  # of the expanded arguments, whole
    arguments_cut: bool
    descriptor: ResultDescriptor | None
    error_path: str | None
    made_by: str | None = None  # the run_python call whose script made this call, when a script made it
    failure: CallFailure | None = None  # why it failed, set where the failure was caught (None: it did not)


class AttachmentCard(BaseModel):
    """A file handed to the user as a download: the card a host (or an MCP client) renders."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attachment_id: str
    filename: str
    bytes: int
    mime_type: str
    sha256: str


class Attachment(AttachmentCard):
    """An attachment as the runtime records it: the card, and where the file came from and lies."""

    source: str  # the sandbox path it was copied from
    host_path: str  # where the copy is on the host (outputs/)
