"""Tables read from the hostile results folder for ``export_table`` and ``render_table``, one row at a time.

:func:`open_table` accepts two kinds of source:

* a table file (``*.table.jsonl``, how spilled tables are written): streamed line by line from the descriptor
  :meth:`~sandbox_runtime.store.safe_paths.ResultsRoot.open_regular` opened, never read whole, so memory does not
  grow with the row count; the byte cap is enforced while reading too (the sandbox may grow the file);
* any other regular file (JSON, CSV, TSV, Markdown, text): read whole (at most ``max_bytes``), decoded as UTF-8,
  parsed as JSON when it starts with ``[``/``{``, then recognised with
  :func:`~sandbox_runtime.spill.tables.recognise_table`.

:func:`sort_rows` sorts a row stream type-aware and stably with bounded memory: runs of ``memory_rows`` rows are
sorted in memory, written to anonymous host temporary files (never in the results folder) and merged with
:func:`heapq.merge`. NULLs always come last, in source order, whatever the direction.
"""

from __future__ import annotations

import codecs
import datetime as dt
import heapq
import io
import itertools
import json
import logging
import os
import pickle
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, get_args

from sandbox_runtime.errors import FileTooLarge, InvalidToolArguments
from sandbox_runtime.spill.cells import Cell, ColumnType
from sandbox_runtime.spill.jsonio import loads, paused_gc
from sandbox_runtime.spill.tables import TABLE_FORMAT, Table, TableFileError, iter_table_file, recognise_table
from sandbox_runtime.store.capped import CappedReader
from sandbox_runtime.store.safe_paths import ResultsRoot, display_name

if TYPE_CHECKING:
    pass

__all__ = [
    "ACCEPTED_FORMATS",
    "TABLE_FILE_SUFFIX",
    "SortedRows",
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
_READ_CHUNK = 1 << 20  # bytes per read of a table file
_BATCH_ROWS = 1024  # rows per pickled batch in a sort run (what one run holds in memory while merged)
_MAX_FAN_IN = 64  # sort runs merged at once (open temporary files); more runs are merged in passes
_LISTED_COLUMNS = 100  # column names shown in an error at most
_COLUMN_TYPES = frozenset(get_args(ColumnType))
_PLAIN_RANK: dict[type, int] = {bool: 0, int: 1, float: 1, str: 3}  # exact types; subclasses take the long way


@dataclass
class TableSource:
    """An opened table: its sandbox path, columns, column types, and its rows as a stream (read once).

    ``row_count`` is known before reading (a recognised file's length, or the line count of a table file; the
    stream itself stays the truth if the sandbox changes the file meanwhile). ``shape`` is ``table_file`` or the
    shape :func:`recognise_table` found (``json_records``, ``csv``, ``markdown``, …).
    """

    path: str
    columns: tuple[str, ...]
    column_types: tuple[ColumnType, ...]
    rows: Iterator[list[Cell]]
    shape: str
    row_count: int
    notes: tuple[str, ...] = ()


@contextmanager
def open_table(
    root: ResultsRoot, path: str, *, max_bytes: int, max_stream_bytes: int | None = None
) -> Iterator[TableSource]:
    """Open ``path`` (in the results folder) as a table; its rows are readable until the context ends.

    A whole-read file is capped at ``max_bytes``; a table file, streamed in constant memory, at
    ``max_stream_bytes`` (default: ``max_bytes``).

    Raises :class:`InvalidToolArguments` when the file is not a table (naming the accepted formats and why),
    is not UTF-8, or is a corrupt table file (naming the line); path errors come from ``ResultsRoot``.
    """
    components = root.parse(path)
    sandbox = root.sandbox_path(components)
    shown = display_name(sandbox)
    if components[-1].endswith(TABLE_FILE_SUFFIX):
        cap = max_bytes if max_stream_bytes is None else max_stream_bytes
        with root.open_regular(components, max_bytes=cap) as (file, _st):
            yield _table_file(file, sandbox, shown, cap)
        return
    yield _whole_file(root.read_bytes(components, max_bytes=max_bytes), sandbox, shown)


# table files ---------------------------------------------------------------------------------------------
def _table_file(file: io.FileIO, sandbox: str, shown: str, max_bytes: int) -> TableSource:
    row_count = max(0, _count_lines(file.fileno(), max_bytes, shown) - 1)
    lines = _decoded_lines(io.BufferedReader(CappedReader(file, max_bytes, shown), _READ_CHUNK), shown)
    first = next(lines, None)
    if first is None:
        raise InvalidToolArguments(f"{shown} is empty, not a table file; {_accepted()}")
    columns, types = _header(first, shown)
    rows = _checked_rows(iter_table_file(itertools.chain([first], lines)), shown)
    return TableSource(sandbox, columns, types, rows, "table_file", row_count)


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


def _decoded_lines(binary: Iterable[bytes], shown: str) -> Iterator[str]:
    # surrogatepass: table files keep lone surrogates of their source that way (spill.tables writes them so)
    for number, raw in enumerate(binary, start=1):
        try:
            yield raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise InvalidToolArguments(
                f"{shown} is not a valid table file: line {number:,} is not UTF-8 (invalid byte at offset "
                f"{exc.start:,} of the line)"
            ) from exc


def _header(line: str, shown: str) -> tuple[tuple[str, ...], tuple[ColumnType, ...]]:
    def bad(problem: str) -> InvalidToolArguments:
        return InvalidToolArguments(f"{shown} is not a valid table file: line 1: {problem}")

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


def _checked_rows(
    found: Iterator[tuple[tuple[str, ...], tuple[ColumnType, ...], list[Cell]]], shown: str
) -> Iterator[list[Cell]]:
    try:
        for _columns, _types, row in found:
            yield row
    except TableFileError as exc:
        raise InvalidToolArguments(f"{shown} is not a valid table file: {exc}") from exc


# other files ---------------------------------------------------------------------------------------------
def _accepted() -> str:
    return f"accepted are {ACCEPTED_FORMATS} (for Excel or Parquet files use run_python)"


def _whole_file(data: bytes, sandbox: str, shown: str) -> TableSource:
    data = data.removeprefix(codecs.BOM_UTF8)
    if b"\x00" in data:
        raise InvalidToolArguments(f"{shown} is binary (it holds NUL bytes), not a table; {_accepted()}")
    try:
        text = data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise InvalidToolArguments(
            f"{shown} is not UTF-8 text (invalid byte at offset {exc.start:,}), so not a table; {_accepted()}"
        ) from exc
    value: object = text
    stripped = text.strip()
    with paused_gc():
        if stripped[:1] in ("[", "{"):
            try:
                value = loads(stripped)
            except (ValueError, RecursionError):
                value = text  # recognise_table tries a Python literal and says why it is not a table
        found = recognise_table(value)
    if not isinstance(found, Table):
        raise InvalidToolArguments(f"{shown} is not a table ({found}); {_accepted()}")
    rows = (list(row) for row in found.iter_rows())
    return TableSource(sandbox, found.columns, found.column_types, rows, found.shape, found.row_count, found.notes)


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


# sorting -------------------------------------------------------------------------------------------------
def sort_key(value: Cell) -> tuple[int, Any]:
    """A key that orders any two non-NULL cells: booleans, then numbers (ints and floats together), then dates
    and datetimes (a date is its midnight; aware datetimes in UTC), then text by code point."""
    rank = _PLAIN_RANK.get(type(value))
    if rank is not None:
        return rank, value
    if isinstance(value, bool):
        return 0, value
    if isinstance(value, int | float):
        return 1, value
    if isinstance(value, dt.datetime):
        if value.utcoffset() is not None:
            value = value.astimezone(dt.UTC)
        return 2, value.replace(tzinfo=None)
    if isinstance(value, dt.date):
        return 2, dt.datetime(value.year, value.month, value.day)
    return 3, str(value)


@dataclass
class SortedRows:
    """Sorted rows (iterate once) and how many rows the source had."""

    total: int
    rows: Iterator[list[Cell]]


@contextmanager
def sort_rows(
    rows: Iterable[list[Cell]],
    position: int,
    *,
    descending: bool,
    memory_rows: int,
    tmp_dir: str | None = None,
) -> Iterator[SortedRows]:
    """Sort ``rows`` by the cell at ``position``: stable, NULLs last in source order, at most ``memory_rows``
    rows in memory at once (runs spill to anonymous temporary files in ``tmp_dir``, removed on exit)."""
    if memory_rows < 1:
        raise ValueError("memory_rows must be >= 1")

    def key(row: list[Cell]) -> tuple[int, Any]:
        return sort_key(row[position])

    with ExitStack() as stack:

        def new_run() -> IO[bytes]:
            return stack.enter_context(tempfile.TemporaryFile(dir=tmp_dir, prefix="sandbox-runtime-sort-"))

        runs: list[IO[bytes]] = []
        nulls: IO[bytes] | None = None
        null_batch: list[list[Cell]] = []
        chunk: list[list[Cell]] = []
        total = 0
        for row in rows:
            total += 1
            if row[position] is None:
                null_batch.append(row)
                if len(null_batch) >= _BATCH_ROWS:
                    nulls = nulls or new_run()
                    _dump(nulls, null_batch)
                    null_batch = []
            else:
                chunk.append(row)
                if len(chunk) >= memory_rows:
                    chunk.sort(key=key, reverse=descending)
                    runs.append(_write_run(new_run(), chunk))
                    chunk = []
        chunk.sort(key=key, reverse=descending)
        if runs and chunk:
            runs.append(_write_run(new_run(), chunk))
            chunk = []
        while len(runs) > _MAX_FAN_IN:  # merge consecutive groups so source order still breaks ties
            runs = [
                _write_run(new_run(), heapq.merge(*map(_read_run, group), key=key, reverse=descending))
                for group in (runs[i : i + _MAX_FAN_IN] for i in range(0, len(runs), _MAX_FAN_IN))
            ]
        logger.debug("sorted %d rows in %d runs of at most %d rows", total, len(runs), memory_rows)
        ordered: Iterator[list[Cell]] = (
            heapq.merge(*map(_read_run, runs), key=key, reverse=descending) if runs else iter(chunk)
        )
        tail = itertools.chain(_read_run(nulls) if nulls is not None else (), null_batch)
        yield SortedRows(total, itertools.chain(ordered, tail))


def _dump(file: IO[bytes], batch: list[list[Cell]]) -> None:
    pickle.dump(batch, file, protocol=pickle.HIGHEST_PROTOCOL)


def _write_run(file: IO[bytes], rows: Iterable[list[Cell]]) -> IO[bytes]:
    """Write ``rows`` to ``file`` in pickled batches; the file is rewound for :func:`_read_run`."""
    batch: list[list[Cell]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= _BATCH_ROWS:
            _dump(file, batch)
            batch = []
    if batch:
        _dump(file, batch)
    file.flush()
    return file


def _read_run(file: IO[bytes]) -> Iterator[list[Cell]]:
    file.seek(0)
    while True:
        try:
            batch: list[list[Cell]] = pickle.load(file)  # noqa: S301  (our own anonymous host temporary file)
        except EOFError:
            return
        yield from batch
