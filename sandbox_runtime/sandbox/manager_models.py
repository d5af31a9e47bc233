"""What the sandbox manager hands out (a conversation's running :class:`Sandbox`, a :class:`Removal`), what it is
given (a :class:`ResultsFolder` to bind), and the narrow :class:`SandboxRecords` protocol through which it keeps
its records (the state database is one; a shared database of a scaled-out runtime would be another)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.state.leases import Leases
from sandbox_runtime.state.records import SandboxRecord

__all__ = ["Removal", "ResultsFolder", "Sandbox", "SandboxRecords"]


class Sandbox(BaseModel):
    """A conversation's running container (``pooled``: it was started in a warm pool on a slot's folder)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    container_id: str
    created_at: float
    pooled: bool = False


class Removal(BaseModel):
    """A container that ``reap``, ``close`` or ``sweep_orphans`` removed, and why; ``state_dir`` is the state
    directory it belonged to (another one's, for an orphan whose state directory is gone); ``pool_slot``: it was
    a pooled sandbox no conversation had taken (its slot's folder goes too)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    container_id: str
    conversation_id: str | None
    reason: str
    state_dir: str | None = None
    pool_slot: str | None = None


class ResultsFolder(NamedTuple):
    """A host folder the sandbox gets as its results folder (made and mounted by its owner beforehand), and how
    its disk use is capped there (``loop``: its own filesystem; ``measured``: counted after each run)."""

    path: str
    quota_mode: str


class SandboxRecords(Protocol):
    """What the manager records: its lease and holds, each sandbox it started or re-attached, and whether a
    conversation is known (a container of an unknown one is an orphan)."""

    @property
    def leases(self) -> Leases: ...

    def record_sandbox(self, container_id: str, conversation_id: str, created_at: float) -> None: ...

    def touch_sandbox(self, container_id: str, when: float) -> None: ...

    def sandbox(self, container_id: str) -> SandboxRecord | None: ...

    def live_sandboxes_of(self, conversation_id: str) -> list[SandboxRecord]: ...

    def mark_removed(self, container_id: str, reason: str) -> None: ...

    def knows_conversation(self, conversation_id: str) -> bool: ...
