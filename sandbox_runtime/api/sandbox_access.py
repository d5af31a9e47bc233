"""What a host program does in a conversation's sandbox directly, beside the model's tools: commands
(:meth:`SandboxAccess.exec`) and files (read, streamed, written, listed, made, removed), each a call in the execution
record, done as the code's uid (see :mod:`~sandbox_runtime.tools.command` and
:mod:`~sandbox_runtime.tools.sandbox_files`). The framework adapters are built on these."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sandbox_runtime.api.command_input import CommandStdin, input_chunks
from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.models import CallFailure
from sandbox_runtime.pipeline.direct import Done, direct_call
from sandbox_runtime.sandbox.runs import CommandStreams, OutputSink
from sandbox_runtime.tools.base import ToolContext, model_arguments
from sandbox_runtime.tools.command import CommandArgs, CommandResult, check_command, run_command
from sandbox_runtime.tools.sandbox_files import (
    Operation,
    SandboxEntry,
    read_sandbox_file,
    sandbox_file_operation,
    write_sandbox_file,
)

if TYPE_CHECKING:
    from sandbox_runtime.api.runtime import Runtime

__all__ = ["SandboxAccess"]


class _Writable(Protocol):
    """A binary file, or anything else with its ``write``."""

    def write(self, data: bytes, /) -> object: ...


class SandboxAccess:
    """Commands and files of one conversation's sandbox, for :class:`~sandbox_runtime.api.conversation.Conversation`
    (which gives the runtime, the key and the check that the conversation still lives)."""

    runtime: Runtime
    key: str

    def _live(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: CommandStdin | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stdout_max_bytes: int | None = None,
        stderr_max_bytes: int | None = None,
        control: CallControl | None = None,
    ) -> CommandResult:
        """Run a command in the sandbox: ``argv[0]`` found on its ``PATH``, confined and ended as a script run is
        (see :mod:`~sandbox_runtime.tools.command`). ``stdin``: bytes, a binary file or byte chunks, streamed as
        the command reads them; ``cwd``: absolute, or relative to the results folder (its default); ``env``:
        variables laid over the sandbox's own; the caps default to ``[run] command_output_max_bytes``. A call in
        the execution record (its variables' names only), admitted in the tenant's run slot like any run;
        ``control`` cancels it and hears its progress. Bad arguments raise
        :class:`~sandbox_runtime.errors.InvalidToolArguments`."""
        raw = {
            "argv": list(argv),
            "cwd": cwd,
            "env": dict(env or {}),
            "timeout_s": timeout_s,
            "stdout_max_bytes": stdout_max_bytes,
            "stderr_max_bytes": stderr_max_bytes,
            "with_input": stdin is not None,
        }
        args = check_command(model_arguments(CommandArgs, raw, "exec"), self.runtime.policy)
        chunks = None if stdin is None else input_chunks(stdin)
        recorded = {**raw, "env": sorted(args.env)}

        def work(context: ToolContext) -> Done:
            result = run_command(context.sandbox, args, CommandStreams(chunks), control=control)
            summary = f"{result.status}, exit code {result.exit_code}, {len(result.stdout)}+{len(result.stderr)} bytes"
            return Done(result, summary, _COMMAND_FAILURES.get(result.status))

        result: CommandResult = self._direct("exec", recorded, work, _not_run, control)
        return result

    def read_bytes(self, path: str, *, max_bytes: int | None = None, control: CallControl | None = None) -> bytes:
        """The bytes of a file in the sandbox (any the code's uid may read; relative: in the results folder), read
        as the code's uid, at most ``max_bytes`` (``[store] read_max_bytes``: its default and largest). Errors are
        Python's own (``FileNotFoundError``, ``PermissionError``, ``IsADirectoryError``, ``NotADirectoryError``)
        with the sandbox path, or a :class:`~sandbox_runtime.errors.PathRejected` for a FIFO, socket or device or
        a file over the cap (see :mod:`~sandbox_runtime.tools.sandbox_files`)."""
        data = bytearray()
        self._read("read_bytes", path, data.extend, max_bytes, control)
        return bytes(data)

    def read_to(
        self,
        path: str,
        destination: _Writable | OutputSink,
        *,
        max_bytes: int | None = None,
        control: CallControl | None = None,
    ) -> int:
        """Stream a file in the sandbox into ``destination`` (a binary file, or a function taking each piece of
        bytes) as it is read, never held whole in this process; the number of bytes it took. Read as for
        :meth:`read_bytes`, with the same cap: over it, ``FileTooLarge`` once ``destination`` has taken
        ``max_bytes`` bytes. A ``destination`` that raises cancels the read
        (:class:`~sandbox_runtime.errors.SandboxError`, from its error)."""
        write = destination if callable(destination) else destination.write
        return self._read("read_to", path, write, max_bytes, control)

    def _read(
        self, tool: str, path: str, write: Callable[[bytes], object], max_bytes: int | None, control: CallControl | None
    ) -> int:
        """The file at ``path`` given to ``write`` as it is read, as the call ``tool``; the bytes it took."""
        cap = self.runtime.policy.store.read_max_bytes
        if max_bytes is not None and not 0 < max_bytes <= cap:
            raise InvalidToolArguments(f"{tool}: max_bytes is between 1 and read_max_bytes={cap}")
        taken = 0

        def sink(piece: bytes) -> None:
            nonlocal taken
            write(piece)
            taken += len(piece)

        def work(context: ToolContext) -> Done:
            where = read_sandbox_file(context.sandbox, path, sink, max_bytes=max_bytes or cap, control=control)
            return Done(taken, f"read {where}: {taken} bytes")

        read: int = self._direct(tool, {"path": path}, work, int, control)
        return read

    def write_bytes(self, path: str, data: CommandStdin, *, control: CallControl | None = None) -> str:
        """Write ``data`` (bytes, a binary file or byte chunks, streamed) to a file in the results folder or /tmp as
        the code's uid: created or emptied first, its missing folders made; the quota holds. Returns the sandbox
        path. Errors as for :meth:`read_bytes`, and ``PathOutsideResults`` for a path elsewhere, ``UnsafeFileType``
        for one through a link out of them; a full folder is an ``OSError`` with its errno."""
        chunks = input_chunks(data)

        def work(context: ToolContext) -> Done:
            where = write_sandbox_file(context.sandbox, path, chunks, control=control)
            return Done(where, f"wrote {where}")

        where: str = self._direct("write_bytes", {"path": path}, work, str, control)
        return where

    def stat(self, path: str, *, control: CallControl | None = None) -> SandboxEntry:
        """The file or folder at ``path`` in the sandbox (links followed), as the code's uid sees it."""
        return SandboxEntry.model_validate(self._file_operation("stat", path, control))

    def list_dir(self, path: str, *, control: CallControl | None = None) -> list[SandboxEntry]:
        """The entries of a folder in the sandbox, sorted by name (a broken or looping link is no folder)."""
        found = self._file_operation("list", path, control)
        return [SandboxEntry.model_validate(entry) for entry in found] if isinstance(found, list) else []

    def exists(self, path: str, *, control: CallControl | None = None) -> bool:
        """Whether anything is at ``path`` in the sandbox, for the code's uid (links followed)."""
        return self._file_operation("exists", path, control) is True

    def realpath(self, path: str, *, control: CallControl | None = None) -> str:
        """``path`` with every link resolved inside the sandbox (a missing part kept as it is)."""
        return str(self._file_operation("realpath", path, control))

    def make_dir(self, path: str, *, control: CallControl | None = None) -> None:
        """Make a folder in the results folder or /tmp, and its parents (nothing when it is there)."""
        self._file_operation("mkdir", path, control)

    def remove(self, path: str, *, control: CallControl | None = None) -> None:
        """Remove a file, a link (itself) or a folder with everything in it, in the results folder or /tmp."""
        self._file_operation("remove", path, control)

    def _file_operation(self, operation: Operation, path: str, control: CallControl | None) -> object:
        """One file operation as a call of its own (the record names it ``file_<operation>``); errors as for
        :meth:`read_bytes`."""

        def work(context: ToolContext) -> Done:
            found = sandbox_file_operation(context.sandbox, operation, path, control=control)
            return Done(found, f"{operation} {path}")

        return self._direct(f"file_{operation}", {"path": path}, work, lambda: None, control)

    def _direct(
        self,
        tool: str,
        recorded: dict[str, Any],
        work: Callable[[ToolContext], Done],
        not_run: Callable[[], object],
        control: CallControl | None,
    ) -> Any:
        """``work`` as a call of the conversation's own (see :func:`~sandbox_runtime.pipeline.direct.direct_call`),
        once the conversation is known to live."""
        with self._live():
            return direct_call(self.runtime.dispatcher, self.key, tool, recorded, work, not_run, control)


# a command that exited (0 or not) did what was asked; the runtime ending it is the call's failure
_COMMAND_FAILURES: dict[str, CallFailure] = {
    "cancelled": "cancelled",
    "timeout": "tool_error",
    "memory_limit": "tool_error",
    "output_limit": "tool_error",
    "quota_exceeded": "tool_error",
}


def _not_run() -> CommandResult:
    """A command cancelled before it got a run slot: nothing ran."""
    return CommandResult(
        status="cancelled", exit_code=None, stdout=b"", stderr=b"", truncated=False, duration_s=0.0, run_number=0
    )
