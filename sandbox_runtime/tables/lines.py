"""Bounded reading of a table file the sandbox wrote: the caps every host-side table reader keeps.

A reader holds one line (a JSON Lines record, a CSV row, one element of a JSON array) at a time, never more than
:attr:`TableLimits.line_max_bytes` of it, so its peak memory is bounded by that cap whatever the file's shape:
a tool holds at most two rows in flight (the one it writes, the one read next), each as its bytes and its cells,
about 4x the line cap (64 MiB at the default 16 MiB; measured by ``bench/bench_table_memory.py``), and a file of
ordinary rows costs a few MiB however large it is.
A line past the cap, a cell past :attr:`TableLimits.cell_max_chars`, and nesting deeper than
:attr:`TableLimits.nesting_max` (or deeper than the JSON parser goes) are :class:`~sandbox_runtime.errors.BadTableFile`
errors naming the line and the cap.

:class:`LineReader` reads the opened file from its start again on every pass (readers that type columns first
read twice) with ``os.pread`` in chunks of 256 KiB, within the file's byte cap also while the sandbox grows it. A
line longer than a chunk is measured first (looking ahead for its end, chunk by chunk, without keeping them) and
read in one piece only when it is within the cap: a line past the cap never costs more than a chunk.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sandbox_runtime.errors import BadTableFile, FileTooLarge
from sandbox_runtime.policy import ToolsPolicy
from sandbox_runtime.tables.cells import Cell, ColumnType, cell
from sandbox_runtime.tables.jsonio import nesting_depth

__all__ = ["LineReader", "TableLimits", "TableSource", "check_cells"]

_READ_CHUNK = 1 << 18  # bytes per read of the file (a block of lines is about this much)
_FIELDS = ToolsPolicy.model_fields


@dataclass(frozen=True)
class TableLimits:
    """The caps of a host-side table reader (``ToolsPolicy``'s ``table_line_max_bytes``,
    ``table_cell_max_chars`` and ``json_nesting_max``; the defaults are the policy's)."""

    line_max_bytes: int = _FIELDS["table_line_max_bytes"].default
    cell_max_chars: int = _FIELDS["table_cell_max_chars"].default
    nesting_max: int = _FIELDS["json_nesting_max"].default

    @classmethod
    def from_policy(cls, tools: ToolsPolicy) -> TableLimits:
        return cls(tools.table_line_max_bytes, tools.table_cell_max_chars, tools.json_nesting_max)

    def line_too_long(self, shown: str, where: str, size: int | None = None) -> BadTableFile:
        """A line (a record, a row) past the line cap; ``size`` in bytes when it is known."""
        length = f"{size:,} bytes, " if size is not None else ""
        return BadTableFile(
            f"{shown}: {where} is {length}longer than the cap of {self.line_max_bytes:,} bytes a line of a table "
            "file may have (policy tools.table_line_max_bytes); write the table with one row per line and shorter "
            "cells, or read it in a run_python script"
        )

    def cell_too_long(self, shown: str, where: str, chars: int) -> BadTableFile:
        return BadTableFile(
            f"{shown}: {where} has a cell of {chars:,} characters, longer than the cap of {self.cell_max_chars:,} "
            "characters a cell of a table file may have (policy tools.table_cell_max_chars); keep long text in "
            "files of its own, or read it in a run_python script"
        )

    def too_deep(self, shown: str, where: str, parser: RecursionError | None = None) -> BadTableFile:
        """Nesting past the cap; ``parser`` when the JSON parser itself gave up (``RecursionError``)."""
        deeper = " (deeper than the JSON parser goes)" if parser is not None else ""
        return BadTableFile(
            f"{shown}: {where} nests arrays and objects deeper than the cap of {self.nesting_max} levels{deeper} "
            "(policy tools.json_nesting_max); flatten the nested values, or read the file in a run_python script"
        )


def _nothing_read() -> int:
    return 0


@dataclass
class TableSource:
    """An opened table: its sandbox path, columns, column types, and its rows as a stream (read once).

    ``row_count`` is known before reading (a recognised file's length, or the line count of a table file; the
    stream itself stays the truth if the sandbox changes the file meanwhile). ``shape`` is ``table_file`` or the
    shape the file was recognised as (``json_records``, ``csv``, ``markdown``, …). ``consumed`` tells how many
    bytes of the source were read so far (it only grows; a sort sizes its runs by it).
    """

    path: str
    columns: tuple[str, ...]
    column_types: tuple[ColumnType, ...]
    rows: Iterator[list[Cell]]
    shape: str
    row_count: int
    notes: tuple[str, ...] = ()
    consumed: Callable[[], int] = field(default=_nothing_read)


def check_cells(row: list[Any], limits: TableLimits, shown: str, where: str) -> None:
    """Every cell of ``row`` within the cell cap, and no nesting past the nesting cap; a nested cell (a list or
    dict, which a table file should not hold) becomes its compact JSON text in place."""
    for index, value in enumerate(row):
        text = value
        if isinstance(value, list | dict):
            if nesting_depth(value) >= limits.nesting_max:  # the row itself is the first level
                raise limits.too_deep(shown, where)
            row[index] = text = cell(value)
        if isinstance(text, str) and len(text) > limits.cell_max_chars:
            raise limits.cell_too_long(shown, where, len(text))


class LineReader:
    """The lines of an opened file, read from its start on every call of :meth:`lines`, each at most the line
    cap long: a longer one raises :class:`BadTableFile` naming its number, found without holding it (the reader
    looks ahead for its end first), so a line costs memory only when it is within the cap."""

    def __init__(self, file: io.FileIO, *, max_bytes: int, limits: TableLimits, shown: str) -> None:
        self._fd, self._max_bytes, self._limits, self._shown = file.fileno(), max_bytes, limits, shown
        self._read = 0  # bytes handed out in all passes

    def lines(self, *, keep_ends: bool = True) -> Iterator[bytes]:
        """Every line, with its line break unless ``keep_ends`` is false (the last one may have none)."""
        for _block, lines, broken in self.blocks():
            if not keep_ends:
                yield from lines
                continue
            for line in lines[:-1]:
                yield line + b"\n"
            yield lines[-1] + b"\n" if broken else lines[-1]

    def blocks(self) -> Iterator[tuple[bytes, list[bytes], bool]]:
        """The file from its start in blocks of whole lines (about a chunk each, or one long line): the block's
        bytes without its last line break, its lines without their breaks, and whether the last one had one.
        A chunk is split at C speed; a line longer than a chunk is measured before it is read."""
        content_cap = self._limits.line_max_bytes  # a line's bytes without its CR LF
        rest, offset, number = b"", 0, 0  # offset: where the file's next read starts; number: lines so far
        while True:
            chunk = self._pread(_READ_CHUNK, offset)
            if not chunk:
                if rest:
                    self._check(rest, number + 1)
                    self._read += len(rest)
                    yield rest, [rest], False
                return
            if len(rest) + len(chunk) > _READ_CHUNK and b"\n" not in chunk:  # a long line: how long?
                line_start = offset - len(rest)
                length, broken = self._line_length(line_start, content_cap + 2, number + 1)
                body = self._pread(length - broken, line_start)  # read without its LF: no copy to cut it off
                offset, rest = line_start + length, b""
                number += 1
                self._check(body, number)
                self._read += length
                yield body, [body], broken
                continue
            offset += len(chunk)
            self._read += len(chunk)
            data = rest + chunk if rest else chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            block, rest = data[:cut], data[cut + 1 :]
            lines = block.split(b"\n")
            if max(map(len, lines)) > content_cap:
                for index, line in enumerate(lines, start=number + 1):
                    self._check(line, index)
            number += len(lines)
            yield block, lines, True

    def _pread(self, size: int, offset: int) -> bytes:
        if offset + size > self._max_bytes + 1:
            size = self._max_bytes + 1 - offset
        chunk = os.pread(self._fd, size, offset) if size > 0 else b""
        if offset + len(chunk) > self._max_bytes:
            raise FileTooLarge(f"{self._shown} grew past the cap of {self._max_bytes:,} bytes while it was read")
        return chunk

    def _line_length(self, line_start: int, cap: int, number: int) -> tuple[int, bool]:
        """The length of the line starting at ``line_start`` (with its LF) and whether it has one, looked for
        chunk by chunk without keeping them; past the cap is an error."""
        at = line_start
        while at - line_start <= cap:
            chunk = self._pread(_READ_CHUNK, at)
            found = chunk.find(b"\n")
            if found >= 0 or not chunk:
                length = at + found + 1 - line_start if found >= 0 else at - line_start
                if length > cap:
                    break
                return length, found >= 0
            at += len(chunk)
        raise self._limits.line_too_long(self._shown, f"line {number:,}")

    def _check(self, line: bytes, number: int) -> None:
        """A line without its LF within the cap (a CR before the LF does not count)."""
        cap = self._limits.line_max_bytes
        if len(line) > cap and len(line) - line.endswith(b"\r") > cap:
            raise self._limits.line_too_long(self._shown, f"line {number:,}")

    def consumed(self) -> int:
        """Bytes read so far (a chunk at a time), in all passes together (a sort sizes its runs by the
        difference)."""
        return self._read
