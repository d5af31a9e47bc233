"""Tables read from the hostile results folder for ``export_table`` and ``render_table``, one row at a time.

:func:`open_table` accepts three kinds of source, and never holds one whole as Python objects:

* a table file (``*.table.jsonl``, how spilled tables are written): streamed line by line from the descriptor
  :meth:`~sandbox_runtime.store.safe_paths.ResultsRoot.open_regular` opened, up to ``max_stream_bytes``;
* CSV, TSV and Markdown text: streamed the same way, twice (types first, then rows;
  :mod:`~sandbox_runtime.tables.text_reader`);
* a JSON array of objects or a ``{columns, rows}`` object: read whole, at most ``max_bytes``
  (``store.read_max_bytes``), and its rows decoded one at a time from the bytes
  (:mod:`~sandbox_runtime.tables.json_reader`): about 1x the file in memory.

Every reader keeps the caps of :class:`~sandbox_runtime.tables.lines.TableLimits` — a line (a row) of at
most ``tools.table_line_max_bytes``, a cell of at most ``tools.table_cell_max_chars``, nesting of at most
``tools.json_nesting_max`` — so its peak memory is at most about 4x the line cap whatever the file's shape (a
whole-read JSON file adds its own bytes, at most ``store.read_max_bytes``), and a file
past a cap, or a corrupt table file, is a :class:`~sandbox_runtime.errors.BadTableFile` naming the line and the
cap. A file that is not a table at all is an :class:`~sandbox_runtime.errors.InvalidToolArguments` naming the
accepted formats. Lines are read with :meth:`io.BufferedReader.readline` given a limit, never unbounded.

Sorting lives in :mod:`~sandbox_runtime.tables.sort` (``sort_rows`` and ``sort_key`` are re-exported).
"""

from __future__ import annotations

import codecs
import io
import itertools
import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import get_args

import msgspec

from sandbox_runtime.errors import BadTableFile, FileTooLarge, InvalidToolArguments
from sandbox_runtime.store.safe_paths import ResultsRoot, display_name
from sandbox_runtime.tables.cells import Cell, ColumnType, coerce
from sandbox_runtime.tables.json_reader import json_table
from sandbox_runtime.tables.lines import LineReader, TableLimits, TableSource, check_cells
from sandbox_runtime.tables.sort import SortedRows, sort_key, sort_rows
from sandbox_runtime.tables.table import TABLE_FORMAT
from sandbox_runtime.tables.text_reader import text_table

__all__ = [
    "ACCEPTED_FORMATS",
    "TABLE_FILE_SUFFIX",
    "SortedRows",
    "TableLimits",
    "TableSource",
    "column_listing",
    "open_table",
    "select_columns",
    "sort_key",
    "sort_rows",
]

logger = logging.getLogger(__name__)

TABLE_FILE_SUFFIX = ".table.jsonl"
ACCEPTED_FORMATS = (
    "a table file (*.table.jsonl, as tool results are saved), a JSON array of objects or a {columns, rows} object, "
    "CSV or TSV text with a header line, or a Markdown table"
)
_READ_CHUNK = 1 << 20  # bytes per read when counting lines or looking for the first character
_LISTED_COLUMNS = 100  # column names shown in an error at most
_COLUMN_TYPES = frozenset(get_args(ColumnType))
_SCALARS = frozenset({type(None), bool, int, float, str})
_SPACE = b" \t\r\n\x0b\x0c"


@contextmanager
def open_table(
    root: ResultsRoot,
    path: str,
    *,
    max_bytes: int,
    max_stream_bytes: int | None = None,
    limits: TableLimits | None = None,
) -> Iterator[TableSource]:
    """Open ``path`` (in the results folder) as a table; its rows are readable until the context ends.

    A JSON file, read whole, is capped at ``max_bytes``; a table file or CSV/TSV/Markdown text, streamed, at
    ``max_stream_bytes`` (default: ``max_bytes``). ``limits`` are the line, cell and nesting caps (default: the
    policy's defaults).

    Raises :class:`BadTableFile` for a corrupt table file or one past a cap (naming the line and the cap), and
    :class:`InvalidToolArguments` when the file is not a table (naming the accepted formats and why) or is not
    UTF-8; path errors come from ``ResultsRoot``.
    """
    limits = limits or TableLimits()
    components = root.parse(path)
    sandbox = root.sandbox_path(components)
    shown = display_name(sandbox)
    cap = max_bytes if max_stream_bytes is None else max_stream_bytes
    with root.open_regular(components, max_bytes=max(cap, max_bytes)) as (file, st):
        reader = LineReader(file, max_bytes=cap, limits=limits, shown=shown)
        if components[-1].endswith(TABLE_FILE_SUFFIX):
            if st.st_size > cap:
                raise FileTooLarge(f"{shown} is {st.st_size:,} bytes, more than the cap of {cap:,} bytes")
            yield _table_file(reader, file, sandbox, shown, cap, limits)
            return
        start = _first_character(file)
        if start is not None and os.pread(file.fileno(), 1, start) in (b"[", b"{"):
            found = _json_file(file, st.st_size, start, sandbox, shown, max_bytes, limits)
        else:
            if st.st_size > cap:
                raise FileTooLarge(f"{shown} is {st.st_size:,} bytes, more than the cap of {cap:,} bytes")
            found = text_table(reader, sandbox, shown, limits) if start is not None else "empty text"
        if isinstance(found, str):
            raise InvalidToolArguments(f"{shown} is not a table ({found}); {_accepted()}")
        yield found


def _accepted() -> str:
    return f"accepted are {ACCEPTED_FORMATS} (for Excel or Parquet files use run_python)"


def _first_character(file: io.FileIO) -> int | None:
    """The offset of the first byte that is not a UTF-8 BOM or white space; None for a blank file."""
    offset = len(codecs.BOM_UTF8) if os.pread(file.fileno(), 3, 0) == codecs.BOM_UTF8 else 0
    while chunk := os.pread(file.fileno(), _READ_CHUNK, offset):
        rest = chunk.lstrip(_SPACE)
        if rest:
            return offset + len(chunk) - len(rest)
        offset += len(chunk)
    return None


def _json_file(
    file: io.FileIO, size: int, start: int, sandbox: str, shown: str, max_bytes: int, limits: TableLimits
) -> TableSource | str:
    if size > max_bytes:
        raise FileTooLarge(
            f"{shown} is {size:,} bytes, more than the {max_bytes:,} bytes a JSON table may have (it is read whole; "
            "policy store.read_max_bytes); write large tables as CSV, which is streamed"
        )
    data = _read_whole(file, size, max_bytes, shown)
    if b"\x00" in data:
        raise InvalidToolArguments(f"{shown} is binary (it holds NUL bytes), not a table; {_accepted()}")
    return json_table(data, start, sandbox, shown, limits)


def _read_whole(file: io.FileIO, size: int, max_bytes: int, shown: str) -> bytes:
    """The file's bytes in one buffer (no chunks joined: 1x the file), at most ``max_bytes``."""
    data = os.pread(file.fileno(), min(size, max_bytes) + 1, 0)
    while len(data) <= max_bytes and (more := os.pread(file.fileno(), max_bytes + 1 - len(data), len(data))):
        data += more  # it grew since it was measured (or the read was short)
    if len(data) > max_bytes:
        raise FileTooLarge(f"{shown} grew past the cap of {max_bytes:,} bytes while it was read")
    return data


# table files ---------------------------------------------------------------------------------------------
def _table_file(
    reader: LineReader, file: io.FileIO, sandbox: str, shown: str, max_bytes: int, limits: TableLimits
) -> TableSource:
    row_count = max(0, _count_lines(file.fileno(), max_bytes, shown) - 1)
    blocks = reader.blocks()
    first = next(blocks, None)
    if first is None:
        raise BadTableFile(f"{shown} is empty, not a table file; {_accepted()}")
    block, lines, _broken = first
    columns, types = _header(_utf8(lines[0], 1, shown), shown)
    head = (block[len(lines[0]) + 1 :], lines[1:], _broken)  # the rows of the first block
    rows = _table_rows(itertools.chain([head], blocks), columns, types, shown, limits)
    return TableSource(sandbox, columns, types, rows, "table_file", row_count, (), reader.consumed)


def _count_lines(fd: int, max_bytes: int, shown: str) -> int:
    """Lines in the file (a last line without a break counts), read with ``pread`` so the stream is untouched."""
    offset = lines = 0
    last = b"\n"
    while chunk := os.pread(fd, min(_READ_CHUNK, max_bytes + 1 - offset), offset):
        lines += chunk.count(b"\n")
        last = chunk[-1:]
        offset += len(chunk)
        if offset > max_bytes:
            raise FileTooLarge(f"{shown} grew past the cap of {max_bytes:,} bytes while it was read")
    return lines + (last != b"\n")


def _utf8(raw: bytes, number: int, shown: str) -> str:
    # surrogatepass: table files keep lone surrogates of their source that way (tables.table writes them so)
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise BadTableFile(
            f"{shown} is not a valid table file: line {number:,} is not UTF-8 (invalid byte at offset "
            f"{exc.start:,} of the line)"
        ) from exc


def _header(line: str, shown: str) -> tuple[tuple[str, ...], tuple[ColumnType, ...]]:
    def bad(problem: str) -> BadTableFile:
        return BadTableFile(f"{shown} is not a valid table file: line 1: {problem}")

    try:
        header = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise bad("not a JSON header object") from exc
    if not isinstance(header, dict) or header.get("format") != TABLE_FORMAT:
        raise bad(f"not a {TABLE_FORMAT} header")
    columns, types = header.get("columns"), header.get("column_types")
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise bad("'columns' is not a list of names")
    if not isinstance(types, list) or len(types) != len(columns) or not set(types) <= _COLUMN_TYPES:
        raise bad(f"'column_types' is not a list of {len(columns)} known column types")
    return tuple(columns), tuple(types)


def _table_rows(
    blocks: Iterator[tuple[bytes, list[bytes], bool]],
    columns: tuple[str, ...],
    types: tuple[ColumnType, ...],
    shown: str,
    limits: TableLimits,
) -> Iterator[list[Cell]]:
    """Every row after the header: a JSON array of one cell per column, dates decoded by column type.

    A block whose lines each start with the one ``[`` it holds and which holds no ``{`` has no nested cell (two
    scans of the block at C speed); the rows of other blocks are looked at one by one."""
    width = len(columns)
    dated = [(i, kind) for i, kind in enumerate(types) if kind in ("date", "datetime")]  # only these change
    cell_max_chars = limits.cell_max_chars
    decode = msgspec.json.decode
    number = 1
    for block, lines, _broken in blocks:
        flat = b"{" not in block and block.count(b"[") == len(lines) == block.count(b"\n[") + block.startswith(b"[")
        for raw in lines:
            number += 1
            try:
                row = decode(raw)
            except (msgspec.DecodeError, RecursionError):
                row = _row(raw, number, shown, limits)
            if type(row) is not list or len(row) != width:
                raise BadTableFile(f"{shown} is not a valid table file: line {number:,}: expected {width} cells")
            if len(raw) > cell_max_chars or not (flat or set(map(type, row)) <= _SCALARS):
                check_cells(row, limits, shown, f"line {number:,}")  # a long line, or nested cells
            for i, kind in dated:
                row[i] = coerce(row[i], kind)
            yield row


def _row(raw: bytes, number: int, shown: str, limits: TableLimits) -> object:
    """A row msgspec refused: lone surrogates, NaN, numbers out of range go to the standard library; nesting
    deeper than the parser goes is a :class:`BadTableFile`."""
    where = f"line {number:,}"
    try:
        return json.loads(_utf8(raw, number, shown))
    except RecursionError as exc:
        raise limits.too_deep(shown, where, exc) from exc
    except ValueError as exc:
        raise BadTableFile(f"{shown} is not a valid table file: {where}: not a JSON row ({exc})") from exc


# columns -------------------------------------------------------------------------------------------------
def column_listing(columns: Sequence[str]) -> str:
    """The column names for an error message (at most 100, then how many more)."""
    shown = ", ".join(repr(display_name(c)) for c in columns[:_LISTED_COLUMNS])
    more = len(columns) - _LISTED_COLUMNS
    return shown + (f" … and {more:,} more" if more > 0 else "") if columns else "(none)"


def select_columns(source: TableSource, names: Sequence[str], *, tool: str) -> list[int]:
    """The position of every named column (a name may repeat); an unknown name lists the available ones."""
    position: dict[str, int] = {}
    for index, name in enumerate(source.columns):
        position.setdefault(name, index)
    found: list[int] = []
    for name in names:
        if name not in position:
            raise InvalidToolArguments(
                f"{tool}: there is no column {display_name(name)!r} in {display_name(source.path)}; "
                f"its {len(source.columns):,} columns are: {column_listing(source.columns)}"
            )
        found.append(position[name])
    return found
