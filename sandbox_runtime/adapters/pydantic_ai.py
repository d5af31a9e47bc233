"""pydantic-ai's workspace contract over sandbox-runtime: a workspace backend whose environment is a conversation.

Install ``pip install 'sandbox-runtime[pydantic-ai]'``. Give an agent run the backend (``agent.run(...,
workspace=SandboxRuntimeWorkspace(runtime))``), or a capability whose ``get_workspace`` returns one; tools reach it
as ``ctx.workspace``. It implements ``WorkspaceBackend``, ``SupportsCommands``, ``SupportsFilesystem`` and
``SupportsRealpath``:

* the environment is a conversation, made at the first operation (never at construction) or attached by its
  ``WorkspaceRef(provider="sandbox-runtime", id=<conversation id>)``: a ref whose conversation was deleted raises
  ``WorkspaceUnavailableError``, never makes a new one. The working directory is the results folder;
* ``run`` is :meth:`~sandbox_runtime.Conversation.exec` (``shell=True``: ``/bin/sh -c``); its input is at its end;
  output undecodable as UTF-8 is replaced, never dropped; a time limit raises ``WorkspaceTimeoutError`` with the
  output so far, output past ``[run] command_output_max_bytes`` ``WorkspaceOutputLimitError``;
* the file operations are the conversation's own (``read_bytes``, ``write_bytes``, ``stat``, ``list_dir``,
  ``make_dir``, ``remove``, ``exists``, ``realpath``), done in the sandbox as its user, with Python's own errors.

Declared, never faked (the documentation's pydantic-ai page lists the conformance results): ``timeout=None`` is the
policy's ``[run] max_timeout_s``; no process outlives its command (a detached one included); the operations of one
conversation are serialised (a file operation waits for a running command); one non-root uid; no network.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import anyio
from pydantic_ai.workspaces import (
    CommandResult,
    FileEntry,
    WorkspaceCommand,
    WorkspaceOutputLimitError,
    WorkspaceRef,
    WorkspaceTimeoutError,
    WorkspaceUnavailableError,
)

from sandbox_runtime.adapters.common import UNAVAILABLE, conversation_id, in_thread
from sandbox_runtime.api.conversation import Conversation
from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.control import CallControl
from sandbox_runtime.tools.command import CommandResult as RuntimeCommandResult
from sandbox_runtime.tools.sandbox_files import SandboxEntry

__all__ = ["PROVIDER", "SandboxRuntimeWorkspace"]

PROVIDER = "sandbox-runtime"
_CONVERSATION_PREFIX = "pydantic-ai"
T = TypeVar("T")


class SandboxRuntimeWorkspace:
    """A pydantic-ai workspace backend on ``runtime``: a fresh conversation at the first operation, or the one
    ``ref`` names."""

    def __init__(self, runtime: Runtime, *, ref: WorkspaceRef | None = None) -> None:
        if ref is not None and ref.provider != PROVIDER:
            raise ValueError(f"a {PROVIDER} workspace cannot attach a {ref.provider!r} ref")
        self.runtime = runtime
        self._ref = ref
        self._conversation: Conversation | None = None
        self._first = anyio.Lock()

    @property
    def ref(self) -> WorkspaceRef | None:
        return self._ref

    @property
    def conversation_id(self) -> str | None:
        """The conversation's id once there is one: the same conversation over MCP or from Python."""
        return None if self._ref is None else self._ref.id

    async def _environment(self) -> Conversation:
        """The conversation, made (or attached) at the first operation; one deleted raises unavailable."""
        async with self._first:
            if self._conversation is None:
                if self._ref is None:
                    self._ref = WorkspaceRef(provider=PROVIDER, id=conversation_id(_CONVERSATION_PREFIX))
                    self._conversation = self.runtime.conversation(self._ref.id)
                else:
                    name = self._ref.id
                    if await in_thread(lambda _control: self.runtime.state.conversation(name) is None):
                        raise WorkspaceUnavailableError(f"conversation {name} does not exist (deleted?)")
                    self._conversation = self.runtime.conversation(name)
            return self._conversation

    async def working_dir(self) -> str:
        await self._environment()
        return self.runtime.policy.sandbox.results_mount_path

    # ------------------------------------------------------------------------------------------ commands
    async def run(
        self,
        command: WorkspaceCommand,
        *,
        shell: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        if shell != isinstance(command, str):
            raise TypeError("a str command needs shell=True and a sequence of words shell=False")
        argv = ["/bin/sh", "-c", str(command)] if shell else list(command)
        if not argv:
            raise ValueError("the command has no words")
        conversation = await self._environment()
        policy = self.runtime.policy
        limit = policy.run.max_timeout_s if timeout is None else timeout

        def run(control: CallControl) -> RuntimeCommandResult:
            return conversation.exec(argv, env=dict(env or {}), timeout_s=limit, control=control)

        done = await self._call(run)
        stdout, stderr = done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")
        if done.status == "timeout":
            raise WorkspaceTimeoutError(f"the command ran past {limit:g} s", stdout=stdout, stderr=stderr)
        if done.status == "output_limit":
            cap = policy.run.command_output_max_bytes
            raise WorkspaceOutputLimitError(f"the command wrote more than {cap} bytes", limit=cap, stdout=stdout)
        return CommandResult(exit_code=1 if done.exit_code is None else done.exit_code, stdout=stdout, stderr=stderr)

    # ------------------------------------------------------------------------------------------ files
    async def read_bytes(self, path: str) -> bytes:
        conversation = await self._environment()
        return await self._call(lambda control: conversation.read_bytes(path, control=control))

    async def write_bytes(self, path: str, data: bytes) -> None:
        conversation = await self._environment()
        await self._call(lambda control: conversation.write_bytes(path, data, control=control))

    async def stat(self, path: str) -> FileEntry:
        conversation = await self._environment()
        return _entry(await self._call(lambda control: conversation.stat(path, control=control)), path)

    async def list_dir(self, path: str) -> Sequence[FileEntry]:
        conversation = await self._environment()
        found = await self._call(lambda control: conversation.list_dir(path, control=control))
        return [_entry(entry, posixpath.join(path, entry.name)) for entry in found]

    async def make_dir(self, path: str) -> None:
        conversation = await self._environment()
        await self._call(lambda control: conversation.make_dir(path, control=control))

    async def remove(self, path: str) -> None:
        working_dir = await self.working_dir()
        target = posixpath.normpath(path)
        if target in ("/", working_dir) or working_dir.startswith(target.rstrip("/") + "/"):
            raise ValueError(f"{path} is the working directory or holds it: it is not removed")
        conversation = await self._environment()
        await self._call(lambda control: conversation.remove(path, control=control))

    async def exists(self, path: str) -> bool:
        conversation = await self._environment()
        return await self._call(lambda control: conversation.exists(path, control=control))

    async def realpath(self, path: str) -> str:
        conversation = await self._environment()
        return await self._call(lambda control: conversation.realpath(path, control=control))

    async def _call(self, call: Callable[[CallControl], T]) -> T:
        """A conversation's call in a worker thread; a sandbox or conversation that is gone is unavailable."""
        try:
            return await in_thread(call)
        except UNAVAILABLE as exc:
            raise WorkspaceUnavailableError(f"workspace {self.conversation_id}: {exc}") from exc


def _entry(found: SandboxEntry, path: str) -> FileEntry:
    """pydantic-ai's entry for a sandbox entry, its path as the caller named it."""
    return FileEntry(name=found.name, path=path, is_dir=found.is_dir, size=found.size)
