"""What the sandbox manager hands out: a conversation's running :class:`Sandbox`, and a :class:`Removal`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.store.folders import ConversationFolders

__all__ = ["Removal", "Sandbox"]


class Sandbox(BaseModel):
    """A conversation's running container and its folders."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    container_id: str
    folders: ConversationFolders
    created_at: float


class Removal(BaseModel):
    """A container that ``reap`` or ``sweep_orphans`` removed, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    container_id: str
    conversation_id: str | None
    reason: str
