"""``write_file`` and ``edit_file``: text files in the results folder, written once and changed in place.

A long script is written once with ``write_file`` and then changed with ``edit_file`` by exact string
replacement, so it is never retyped and the parts not meant to change cannot drift. Both go through the safe
path resolver (no link is followed, nothing outside the results folder) and publish atomically: a reader sees the
old file or the new one, never half of either.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.errors import InvalidToolArguments, PathExists
from sandbox_runtime.policy import Policy
from sandbox_runtime.store.safe_paths import ResultsRoot

__all__ = [
    "EDIT_FILE_DESCRIPTION",
    "EditFileArgs",
    "FileWritten",
    "WriteFileArgs",
    "edit_file",
    "write_file",
    "write_file_description",
]

logger = logging.getLogger(__name__)


def write_file_description(policy: Policy) -> str:
    """What the model is told of ``write_file``, with the policy's results folder."""
    return (
        f"Create a text file in the results folder ({policy.sandbox.results_mount_path}), e.g. a script that builds "
        "a report; run it with run_python's script_path. Fails if the file exists unless overwrite is true. Change "
        "an existing file with edit_file instead of writing it again."
    )


EDIT_FILE_DESCRIPTION = (
    "Change a text file in the results folder by exact string replacement: `old` must occur exactly `count` "
    "times (default 1) and is replaced by `new`. Use it to fix a script instead of retyping it; include enough "
    "surrounding text in `old` to make it unique."
)


class WriteFileArgs(BaseModel):
    """Arguments of ``write_file``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="Where to write, e.g. /mnt/results/scripts/report.py or scripts/report.py.")
    content: str = Field(description="The whole text of the file.")
    overwrite: bool = Field(False, description="Replace the file if it exists.")


class EditFileArgs(BaseModel):
    """Arguments of ``edit_file``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="The file to change, in the results folder.")
    old: str = Field(min_length=1, description="The exact text to replace (whitespace and newlines count).")
    new: str = Field(description="The text to put in its place.")
    count: int = Field(1, ge=1, description="How many times `old` must occur; all of them are replaced.")


class FileWritten(BaseModel):
    """What was written: the sandbox path and the new size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    bytes: int
    lines: int
    message: str


def _encode(text: str, what: str, max_bytes: int) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > max_bytes:
        raise InvalidToolArguments(f"{what}: the text is {len(data):,} bytes, more than the cap of {max_bytes:,}")
    return data


def write_file(root: ResultsRoot, args: WriteFileArgs, *, max_bytes: int) -> FileWritten:
    """Create (or with ``overwrite`` replace) a text file; at most ``max_bytes`` bytes."""
    data = _encode(args.content, "write_file", max_bytes)
    try:
        path = (root.replace_file if args.overwrite else root.create_file)(args.path, data)
    except PathExists as exc:
        raise PathExists(f"{exc}; pass overwrite=true to replace it, or change it with edit_file") from exc
    lines = args.content.count("\n") + (not args.content.endswith("\n") and bool(args.content))
    return FileWritten(path=path, bytes=len(data), lines=lines, message=f"Wrote {path} ({len(data):,} bytes).")


def edit_file(root: ResultsRoot, args: EditFileArgs, *, max_bytes: int) -> FileWritten:
    """Replace ``old`` by ``new``; ``old`` must occur exactly ``count`` times or nothing is written."""
    text = root.read_text(args.path, max_bytes=max_bytes)
    found = text.count(args.old)
    shown = root.sandbox_path(root.parse(args.path))
    if found != args.count:
        hint = "it does not occur" if found == 0 else f"it occurs {found:,} times"
        raise InvalidToolArguments(
            f"edit_file: `old` must occur exactly {args.count:,} time{'s' * (args.count != 1)} in {shown}, but "
            f"{hint}; nothing was changed. Copy `old` exactly from the file (read_file shows it), with enough "
            f"surrounding text to make it unique, or set count."
        )
    changed = text.replace(args.old, args.new)
    data = _encode(changed, "edit_file", max_bytes)
    path = root.replace_file(args.path, data)
    lines = changed.count("\n") + (not changed.endswith("\n") and bool(changed))
    return FileWritten(
        path=path,
        bytes=len(data),
        lines=lines,
        message=f"Replaced {args.count:,} occurrence{'s' * (args.count != 1)} in {path} ({len(data):,} bytes now).",
    )
