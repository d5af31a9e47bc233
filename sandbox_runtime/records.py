"""The typed records the state database stores and returns (see :mod:`~sandbox_runtime.state`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = [
    "Attachment",
    "AttachmentCard",
    "CallRecord",
    "ConversationRecord",
    "ExpiredFile",
    "SandboxRecord",
    "StoredResult",
]


class ConversationRecord(BaseModel):
    """One conversation as stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    created_at: float
    quota_mode: str
    quota_bytes: int
    runs: int


class SandboxRecord(BaseModel):
    """One sandbox container as stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    container_id: str
    conversation_id: str
    created_at: float
    last_used_at: float
    removed_at: float | None = None
    removed_reason: str | None = None


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
    descriptor: str | None  # the ResultDescriptor as JSON
    error_path: str | None


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
    status: str  # ok | error | denied
    arguments: str | None  # the short call, as JSON (cut to the policy's record cap)
    expanded: str | None  # the expanded arguments, when they differ from the short call
    arguments_sha256: str | None  # of the expanded arguments, whole
    arguments_cut: bool
    descriptor: str | None
    error_path: str | None


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


class ExpiredFile(BaseModel):
    """A file retention removed: answers "where did it go" with when, instead of a bare "not found"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    path: str
    bytes: int
    modified_at: float
    removed_at: float
