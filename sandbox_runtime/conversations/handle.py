"""What a tool uses of its conversation's sandbox: a :class:`SandboxHandle` (the conversation's lock, its running
sandbox, its folders, its run numbers, a run and how it ended, and what may be done to the sandbox after a run),
not the services behind it: no tool sees the backend."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import EngineLost, SandboxGone
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import CommandStreams, RunRequest, ScriptCalls
from sandbox_runtime.sandbox.holds import RunLock
from sandbox_runtime.sandbox.manager_models import Sandbox
from sandbox_runtime.sandbox.runs import RunResult
from sandbox_runtime.store.folders import ConversationFolders
from sandbox_runtime.store.quota import QuotaUsage
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.telemetry.sandbox_spans import RunSpans

if TYPE_CHECKING:
    from sandbox_runtime.conversations.service import ConversationService

__all__ = ["SandboxHandle"]

logger = logging.getLogger(__name__)


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

    def lock(self) -> RunLock:
        """The conversation's run lock, in this process and across the processes of its state directory: hold it
        from the start of a run to its end."""
        return self._service.run_lock(self.conversation_id)

    def root(self) -> ResultsRoot:
        """The results folder, for safe reads and writes beneath it."""
        return self._service.store.results_root(self.folders)

    def usage(self) -> QuotaUsage:
        """Bytes used in the results folder against its quota."""
        return self._service.store.usage(self.folders)

    def run_spans(self) -> RunSpans:
        """The spans a run's code opens inside the sandbox, under the span current now (the run's)."""
        return RunSpans(self.policy.telemetry, on_drop=self._service.metrics.sandbox_spans_dropped.inc)

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

    def run(
        self,
        sandbox: Sandbox,
        request: RunRequest,
        control: CallControl | None,
        calls: ScriptCalls | None,
        *,
        what: str,
        streams: CommandStreams | None = None,
    ) -> tuple[Sandbox, RunResult]:
        """Run a program in the sandbox and say how it ended, as data
        (:meth:`~sandbox_runtime.sandbox.backend.SandboxBackend.run`); the sandbox it ran in comes back with it. A
        sandbox removed or stopped from outside since this process last used it (nothing ran) is replaced, and
        the program runs in the new one. An engine that went away during the run raises
        :class:`~sandbox_runtime.errors.EngineLost`, and the sandbox is never used again (``what``: the run, in
        words, for the record; ``streams``: a command's input and where its output goes)."""
        backend = self._manager.backend
        try:
            try:
                return sandbox, backend.run(sandbox.container_id, request, control, calls, streams)
            except SandboxGone:
                logger.info("sandbox of %s is gone; starting a new one", self.conversation_id)
                sandbox = self.replace()
                return sandbox, backend.run(sandbox.container_id, request, control, calls, streams)
        except EngineLost:
            self.abandon(sandbox, f"the engine went away during {what}")
            raise

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
