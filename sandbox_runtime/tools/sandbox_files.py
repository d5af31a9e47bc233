"""Reading and writing a file in the conversation's sandbox for a host program (``Conversation.read_bytes`` /
``write_bytes``): done inside the sandbox, as the code's uid (the image's ``files.py``, run as a command), so the
sandbox's own permissions hold as they do for the code, and the quota as it does for any write.

Paths are absolute, or relative to the results folder. A read may name any file the code's uid may read (the
sandbox's own files: what its code can read anyway); a write goes beneath the results folder or ``/tmp`` (what
the code's uid may write), a link that leads out of them refused (``UnsafeFileType``), a path elsewhere too
(``PathOutsideResults``). A FIFO, a socket or a device is never read or written (``UnsafeFileType``); a file over
the read cap is ``FileTooLarge``. Anything else the sandbox
refuses comes back as Python's own exception for it (``FileNotFoundError``, ``PermissionError``,
``IsADirectoryError``, ``NotADirectoryError``, or ``OSError`` with its errno, a full disk's included), with the
sandbox path in the message.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.control import CallControl
from sandbox_runtime.conversations.handle import SandboxHandle
from sandbox_runtime.errors import FileTooLarge, PathOutsideResults, SandboxError, UnsafeFileType
from sandbox_runtime.sandbox.run_protocol import FILES, PYTHON
from sandbox_runtime.sandbox.runs import CommandStreams, OutputSink
from sandbox_runtime.tools.command import CommandArgs, CommandResult, in_sandbox, run_command

__all__ = [
    "SandboxEntry",
    "read_sandbox_file",
    "sandbox_file_operation",
    "sandbox_path",
    "write_sandbox_file",
]

_TMP = "/tmp"  # the sandbox's own /tmp, a tmpfs of its own
_FAILED_EXIT = 3  # files.py's word for a refusal or an OSError, told on stderr
_REFUSALS = {"outside": PathOutsideResults, "link_out": UnsafeFileType, "not_regular": UnsafeFileType}


def sandbox_path(handle: SandboxHandle, path: str, *, writing: bool) -> str:
    """``path`` as the sandbox names it: absolute (a relative one is in the results folder); one to write is
    normalised and must be beneath the results folder or /tmp."""
    results = handle.policy.sandbox.results_mount_path.rstrip("/")
    if not path or "\x00" in path:
        raise PathOutsideResults(f"not a path: {path!r}")
    absolute = in_sandbox(handle, path)
    if not writing:
        return absolute  # as given: its links and ``..`` are the sandbox's to resolve, in that order
    absolute = posixpath.normpath(absolute)
    if not any(absolute == root or absolute.startswith(root + "/") for root in _writable(handle)):
        raise PathOutsideResults(f"{path} is outside {results} and {_TMP} (the folders the sandbox's code may write)")
    return absolute


def _writable(handle: SandboxHandle) -> tuple[str, str]:
    return handle.policy.sandbox.results_mount_path.rstrip("/"), _TMP


def read_sandbox_file(
    handle: SandboxHandle, path: str, sink: OutputSink, *, max_bytes: int, control: CallControl | None = None
) -> str:
    """Give the bytes of the file at ``path`` to ``sink`` as they come (never held whole), read as the code's uid;
    its sandbox path. A file over ``max_bytes`` raises FileTooLarge once the sink has taken that many bytes."""
    where = sandbox_path(handle, path, writing=False)
    args = CommandArgs(argv=_files("read", where, ("/",)), stdout_max_bytes=max_bytes, stderr_max_bytes=64 * 1024)
    result = run_command(handle, args, CommandStreams(stdout=sink), control=control)
    if result.status == "output_limit":
        raise FileTooLarge(f"{where} is larger than {max_bytes} bytes, the cap of this read")
    _raise_for(result, where)
    return where


def write_sandbox_file(
    handle: SandboxHandle, path: str, chunks: Iterator[bytes], *, control: CallControl | None = None
) -> str:
    """Write ``chunks`` to the file at ``path`` as the code's uid (created or emptied first, parents made); its
    sandbox path."""
    where = sandbox_path(handle, path, writing=True)
    args = CommandArgs(argv=_files("write", where, _writable(handle)), stderr_max_bytes=64 * 1024, with_input=True)
    _raise_for(run_command(handle, args, CommandStreams(chunks), control=control), where)
    return where


class SandboxEntry(BaseModel):
    """A file or folder in the sandbox, as ``stat`` sees it (links followed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    path: str = Field(description="As the sandbox names it (absolute).")
    is_dir: bool
    size: int | None = Field(description="Bytes of a regular file; None for anything else.")


# what each operation looks at (``/``: anything the code's uid may read) or changes (the writable folders)
Operation = Literal["stat", "list", "exists", "realpath", "mkdir", "remove"]
_CHANGES: frozenset[Operation] = frozenset({"mkdir", "remove"})


def sandbox_file_operation(
    handle: SandboxHandle, operation: Operation, path: str, *, control: CallControl | None = None
) -> object:
    """One of the image's file operations at ``path`` (see ``files.py``), as the code's uid; the JSON it printed
    (None for one that prints nothing), or its error as Python's own."""
    changes = operation in _CHANGES
    where = sandbox_path(handle, path, writing=changes)
    roots = _writable(handle) if changes else ("/",)
    result = run_command(handle, CommandArgs(argv=_files(operation, where, roots)), control=control)
    _raise_for(result, where)
    return json.loads(result.stdout) if result.stdout else None


def _files(operation: str, where: str, roots: tuple[str, ...]) -> list[str]:
    return [PYTHON, "-I", "-S", FILES, operation, where, *roots]


def _raise_for(result: CommandResult, where: str) -> None:
    """Nothing when the helper did what it was asked; else the error it reported, as Python's own."""
    if result.status == "ok":
        return
    if result.exit_code == _FAILED_EXIT:
        try:
            said = json.loads(result.stderr.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            said = None
        if isinstance(said, dict):
            refused = _REFUSALS.get(str(said.get("refused")))
            if refused is not None:
                raise refused(str(said.get("message")))
            number = said.get("errno")
            if isinstance(number, int):
                raise OSError(number, str(said.get("message", "")).split(":", 1)[0], where)
    said_text = result.stderr.decode("utf-8", "replace")[-500:]
    raise SandboxError(
        f"the file operation on {where} ended {result.status} (exit code {result.exit_code}): {said_text}"
    )
