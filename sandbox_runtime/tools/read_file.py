"""``read_file``: read a text file from the conversation's hostile results folder by line range, self-bounded.

The file is opened only through :class:`~sandbox_runtime.store.safe_paths.ResultsRoot` (no link followed, no
FIFO or device opened) and streamed: lines before ``offset`` are skipped in bounded pieces, reading stops once
the answer is complete, and never more than ``max_file_bytes`` are read even if the sandbox grows the file.
Lines end at ``\\n`` only (``\\r\\n`` and a missing final break are kept); UTF-8, invalid bytes become U+FFFD.

``text`` holds at most ``max_chars`` code points of content. When the cap or ``limit`` cuts a read short, a
marker line says which lines were shown and the ``offset`` to continue from. A line that does not fit is left
to the next page; one longer than the whole cap is cut at a code-point boundary and the marker says so.
"""

from __future__ import annotations

import io
import logging
import os
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.errors import InvalidToolArguments, UnsafeFileType
from sandbox_runtime.policy import Policy
from sandbox_runtime.store.capped import CappedReader
from sandbox_runtime.store.safe_paths import ResultsRoot, display_name
from sandbox_runtime.tables.source import ACCEPTED_FORMATS
from sandbox_runtime.tools.base import model_arguments

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_MAX_CHARS",
    "ReadFileArgs",
    "ReadFileResult",
    "parse_args",
    "read_file",
    "read_file_description",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_CHARS = 500_000
_SNIFF_BYTES = 8 * 1024  # a NUL byte in this many leading bytes marks the file as binary
_SKIP_CHARS = 64 * 1024  # lines before `offset` are skipped in pieces so one huge line never fills memory
_COUNT_MAX_BYTES = 8 * 1024 * 1024  # the marker names the total line count only for files up to this size


def read_file_description(policy: Policy) -> str:
    """What the model is told of ``read_file``, with the policy's results folder and read cap."""
    return (
        f"Read a text file from the results folder ({policy.sandbox.results_mount_path}/... or a path relative to "
        "it) by line range: `offset` is the first line to return (1-based, default 1) and `limit` the most lines to "
        f"return. One call returns at most {policy.tools.read_max_chars:,} characters; a read cut short ends with a "
        "marker line saying which lines were shown and the `offset` to continue from, so page through long files "
        "with offset/limit. "
        f"For tables — {ACCEPTED_FORMATS} — prefer export_table or render_table with the path; binary files are "
        "refused: inspect those, and Excel or Parquet tables, with run_python."
    )


class ReadFileArgs(BaseModel):
    """Arguments of ``read_file``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="A file in the results folder, e.g. /mnt/results/out/log.txt or out/log.txt.")
    offset: int = Field(1, ge=1, description="The first line to return, 1-based (default 1).")
    limit: int | None = Field(None, ge=1, description="The most lines to return (default: as many as fit).")


class ReadFileResult(BaseModel):
    """What was read. ``text`` is what the model sees: file content plus a marker line when cut short."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    text: str
    first_line: int
    last_line: int
    next_offset: int | None
    truncated: bool
    bytes: int


def parse_args(raw: dict[str, object] | ReadFileArgs) -> ReadFileArgs:
    """Validate arguments against the schema; errors name the field."""
    return model_arguments(ReadFileArgs, raw, "read_file")


def _skip(text: io.TextIOWrapper, count: int) -> int:
    """Skip ``count`` lines; return how many were skipped (fewer only when the file ends first)."""
    done, partial = 0, False
    while done < count:
        piece = text.readline(_SKIP_CHARS)
        if not piece:
            return done + int(partial)
        partial = not piece.endswith("\n")
        done += int(not partial)
    return done


def _take(text: io.TextIOWrapper, limit: int | None, max_chars: int) -> tuple[list[str], bool, bool | None]:
    """Read up to ``limit`` lines and ``max_chars`` characters.

    A line that does not fit whole is left to the next page, unless it is the only one: then it is cut (its
    content or just its line break did not fit). Returns the lines, whether the last one was cut, and whether
    more lines follow (None: unknown, the rest of a cut line was not read).
    """
    lines: list[str] = []
    budget = max_chars
    while budget > 0 and (limit is None or len(lines) < limit):
        line = text.readline(budget)
        if not line:
            return lines, False, False
        lines.append(line)
        budget -= len(line)
        if budget > 0 and not line.endswith("\n"):
            return lines, False, False  # the last line, without a final line break
    after = text.read(1)
    if not after or lines[-1].endswith("\n"):
        return lines, False, bool(after)
    if len(lines) > 1:
        lines.pop()
        return lines, False, True
    if after == "\n":  # the line's content fit, its line break did not
        return lines, True, bool(text.read(1))
    return lines, True, None


def _count_lines(fd: int, size: int) -> int | None:
    """The number of lines of a small file (one bounded ``pread``); None for a large or a growing one."""
    if size > _COUNT_MAX_BYTES:
        return None
    data = os.pread(fd, size + 1, 0)
    if len(data) > size:
        return None
    return data.count(b"\n") + int(bool(data) and not data.endswith(b"\n"))


def read_file(
    root: ResultsRoot,
    raw: dict[str, object] | ReadFileArgs,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_file_bytes: int,
) -> ReadFileResult:
    """Read lines ``offset`` onwards of a text file in the results folder, at most ``max_chars`` characters."""
    if max_chars < 1:
        raise ValueError("max_chars must be >= 1")
    args = parse_args(raw)
    components = root.parse(args.path)
    path = root.sandbox_path(components)
    shown = display_name(path)
    with root.open_regular(components, max_bytes=max_file_bytes) as (file, st):
        head = os.pread(file.fileno(), _SNIFF_BYTES, 0)
        if b"\x00" in head:
            raise UnsafeFileType(
                f"{shown} looks binary ({st.st_size:,} bytes; a NUL byte in its first {len(head):,} bytes); "
                "read_file only reads text: use run_python to inspect it"
            )
        buffered = io.BufferedReader(CappedReader(file, max_file_bytes, shown))
        with io.TextIOWrapper(buffered, encoding="utf-8", errors="replace", newline="\n") as text:
            skipped = _skip(text, args.offset - 1)
            lines, cut, more = _take(text, args.limit, max_chars) if skipped == args.offset - 1 else ([], False, False)
        total = _count_lines(file.fileno(), st.st_size) if cut or more else None
    logger.debug("read_file %s offset=%d: %d lines, cut=%s, more=%s", shown, args.offset, len(lines), cut, more)
    if not lines and args.offset > 1:
        has = "is empty (0 lines)" if skipped == 0 else f"has {skipped:,} line{'' if skipped == 1 else 's'}"
        raise InvalidToolArguments(f"read_file: offset={args.offset} is past the end of {shown}, which {has}")
    content = "".join(lines)
    first, last = (args.offset, args.offset + len(lines) - 1) if lines else (0, 0)
    if more is None and total is not None:
        more = total > last
    next_offset = None if more is False else last + 1
    marker = _marker(first, last, total, content, cut, more, args.limit, max_chars) if cut or more else ""
    if not lines:
        marker = "(empty file, 0 lines)"
    elif marker and not content.endswith("\n"):
        marker = "\n" + marker
    return ReadFileResult(
        path=path,
        text=content + marker,
        first_line=first,
        last_line=last,
        next_offset=next_offset,
        truncated=bool(cut or more),
        bytes=st.st_size,
    )


def _marker(
    first: int,
    last: int,
    total: int | None,
    content: str,
    cut: bool,
    more: bool | None,
    limit: int | None,
    max_chars: int,
) -> str:
    """The line that ends a read cut short: what was shown, why it stopped, and how to continue."""
    span = f"lines {first:,}-{last:,}" if last > first else f"line {first:,}"
    of = f" of {total:,}" if total is not None else ""
    marker = f"[read_file: showed {span}{of} ({len(content):,} characters)"
    if cut:
        cut_at = len(content) - content.rfind("\n") - 1
        marker += (
            f"; line {last:,} was cut after {cut_at:,} characters by the cap of {max_chars:,} characters per call: "
            "read that line with run_python"
        )
    elif limit is None or last - first + 1 < limit:
        marker += f"; the cap of {max_chars:,} characters per call was reached"
    else:
        marker += f"; the limit of {limit:,} lines was reached"
    if more is False:
        return marker + "; no more lines follow.]"
    follow = "more lines may follow" if more is None else "more lines follow"
    if total is not None and total > last:
        follow = f"{total - last:,} more " + ("line follows" if total - last == 1 else "lines follow")
    return marker + f"; {follow}: continue with offset={last + 1}.]"
