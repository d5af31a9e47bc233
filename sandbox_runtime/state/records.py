"""The typed records the state database keeps for itself and the runtime (see
:mod:`~sandbox_runtime.state.database`); the records it keeps of calls are public models
(:mod:`~sandbox_runtime.models`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ConversationRecord", "ExpiredFile", "SandboxRecord", "StoreReport"]


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


class ExpiredFile(BaseModel):
    """A file retention removed: answers "where did it go" with when, instead of a bare "not found"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    path: str
    bytes: int
    modified_at: float
    removed_at: float


class StoreReport(BaseModel):
    """Where the state lives, as ``doctor`` shows it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    store: str  # "sqlite" or "postgresql"
    where: str  # the file, or the server's URL without its password
    schema_version: int
