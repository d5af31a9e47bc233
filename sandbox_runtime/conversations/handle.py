"""What a tool uses of its conversation's sandbox: a :class:`SandboxHandle` (the conversation's lock, its running
sandbox, its folders, its run numbers, and what may be done to the sandbox after a run), not the services behind
it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import SandboxBackend
from sandbox_runtime.sandbox.records import Sandbox
from sandbox_runtime.store.folders import ConversationFolders
from sandbox_runtime.store.quota import QuotaUsage
from sandbox_runtime.store.safe_paths import ResultsRoot

if TYPE_CHECKING:
    from sandbox_runtime.conversations.service import ConversationService

__all__ = ["SandboxHandle"]


class SandboxHandle:
    """One conversation's sandbox, for the tool that runs code in it."""

    def __init__(self, service: ConversationService, conversation_id: str, folders: ConversationFolders) -> None:
        self._service = service
        self._manager = service.manager
        self.conversation_id = conversation_id
        self.folders = folders

    @property
    def policy(self) -> Policy:
        return self._service.policy

    @property
    def backend(self) -> SandboxBackend:
        """The engine the sandbox runs on (exec, inspect, counters), for the container ids this handle gives."""
        return self._manager.backend

    def lock(self) -> threading.RLock:
        """The conversation's lock: hold it from the start of a run to its end."""
        return self._service.lock(self.conversation_id)

    def root(self) -> ResultsRoot:
        """The results folder, for safe reads and writes beneath it."""
        return self._service.store.results_root(self.folders)

    def usage(self) -> QuotaUsage:
        """Bytes used in the results folder against its quota."""
        return self._service.store.usage(self.folders)

    def begin_run(self, sandbox: Sandbox) -> int:
        """The run's number, with the sandbox's use recorded in the same write."""
        return self._service.begin_run(self.conversation_id, sandbox)

    def start(self) -> Sandbox:
        """The running sandbox, started or re-attached when needed."""
        return self._service.sandbox(self.conversation_id)

    def replace(self) -> Sandbox:
        """A sandbox in place of one the engine says is gone (removed or stopped from outside)."""
        self._manager.forget(self.conversation_id)
        return self.start()

    def touch(self, sandbox: Sandbox) -> None:
        """Record a use (idle time counts from now)."""
        self._manager.touch(sandbox)

    def restart(self, sandbox: Sandbox) -> None:
        """End every process of the sandbox at once (its results folder stays)."""
        self._manager.restart(sandbox)

    def discard(self, sandbox: Sandbox, reason: str) -> None:
        """Remove a sandbox that can no longer be trusted; the next use starts a fresh one."""
        self._manager.discard(sandbox, reason)

    def abandon(self, sandbox: Sandbox, reason: str) -> None:
        """Never use the sandbox again, without asking the engine (it went away)."""
        self._manager.abandon(sandbox, reason)
