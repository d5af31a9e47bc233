"""``export_table``: a table from the results folder written as CSV or XLSX to ``exports/``, by path.

The rows never pass through the model: the source is a spilled result or any table file in the results folder
(:func:`~sandbox_runtime.tables.source.open_table`). Columns can be chosen, ordered and renamed, the rows
sorted (type-aware, stable, NULLs last, bounded memory) and a row range taken. Filtering and grouping belong in
SQL (run the query again with WHERE / GROUP BY) and are deliberately not here.

No formula is ever made from data (SECURITY.md): in CSV a text cell that a spreadsheet would read as a formula
— ``= + - @`` first once leading white space and invisible characters are skipped and full-width forms folded,
or TAB, CR or LF first — gets a leading apostrophe; XLSX cells are written typed (text always as text,
XlsxWriter's string conversions off). Both count those cells as guarded; the writers are in
:mod:`~sandbox_runtime.tables.writers`. The source is read within the caps of
:class:`~sandbox_runtime.tables.source.TableLimits` (line, cell, nesting) and sorted within a row and a
byte budget, so memory stays bounded whatever the file's shape. The
file is built in a host temporary folder, then published with
:meth:`~sandbox_runtime.store.safe_paths.ResultsRoot.create_file` from it in chunks: nothing half-written is
ever visible, memory stays bounded, and an existing name gets ``-2``, ``-3`` … (nothing is overwritten).
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import logging
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.errors import InvalidToolArguments, PathExists, PathNotFound
from sandbox_runtime.policy import Policy
from sandbox_runtime.store.safe_paths import ResultsRoot, display_name
from sandbox_runtime.tables.cells import Cell, ColumnType
from sandbox_runtime.tables.source import (
    TABLE_FILE_SUFFIX,
    TableLimits,
    TableSource,
    column_listing,
    open_table,
    select_columns,
    sort_rows,
)
from sandbox_runtime.tables.writers import (
    XLSX_MAX_COLUMNS,
    XLSX_MAX_DATA_ROWS,
    CellTally,
    ExportFormat,
    open_sheet,
    plural,
)

__all__ = [
    "ExportColumn",
    "ExportFormat",
    "ExportResult",
    "ExportSort",
    "ExportTableArgs",
    "export_table",
    "export_table_description",
]

logger = logging.getLogger(__name__)


def export_table_description(policy: Policy) -> str:
    """What the model is told of ``export_table``, with the policy's results folder."""
    return (
        f"Export a table to a CSV or XLSX file in {policy.sandbox.results_mount_path}/exports/ by path: `source` is "
        "a saved tool result or a table file (.table.jsonl, JSON, CSV/TSV, Markdown) — never copy rows into the "
        "call. Choose, order and rename columns (`columns`: names or {name, header}), sort by one column "
        "(`sort`), and take a row range (`start`, 0-based, and `count`). Filtering and grouping are not here on "
        "purpose: run the SQL query again with WHERE / GROUP BY and export that result."
    )


_EXPORTS = "exports"
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_STEM_MAX_CHARS = 100  # characters of a file name before the suffix and extension
_LISTED_EXPORTS = 100_000  # names of exports/ read to pick a free name (more are found by retrying)
_PUBLISH_ATTEMPTS = 16  # names tried when exports/ changes while publishing
_PUBLISH_CHUNK = 1 << 20  # bytes per chunk copied from the host temporary file
_TIMES = "\u00d7"  # the multiplication sign (U+00D7) between the row and the column count


class ExportColumn(BaseModel):
    """One column to write, with the header to write for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="A column of the source.")
    header: str | None = Field(None, description="The header to write instead of the name.")


class ExportSort(BaseModel):
    """How to order the rows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    column: str = Field(description="The column to sort by (a source column name, or a header given in columns).")
    direction: Literal["asc", "desc"] = Field("asc", description="asc or desc; empty cells (NULL) always last.")


class ExportTableArgs(BaseModel):
    """Arguments of ``export_table``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="The table's path, e.g. /mnt/results/spill/sql_query-1.table.jsonl.")
    format: ExportFormat = Field(description="csv or xlsx.")
    columns: list[str | ExportColumn] | None = Field(
        None, min_length=1, description="Columns to write, in this order: names or {name, header} (default: all)."
    )
    sort: ExportSort | None = Field(None, description="Sort by one column (default: source order).")
    start: int = Field(0, ge=0, description="First row to write, 0-based, after sorting (default 0).")
    count: int | None = Field(None, ge=0, description="Most rows to write (default: all from start).")
    filename: str | None = Field(
        None, description="A base name for the file (letters, digits, '.', '_', '-'); the extension follows format."
    )


class ExportResult(BaseModel):
    """The written file: its sandbox path, size, hash, and the rows and columns actually written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    format: ExportFormat
    bytes: int
    sha256: str
    rows: int
    columns: list[str]
    column_types: list[ColumnType]
    guarded_cells: int
    replaced_characters: int = 0
    cut_cells: int = 0
    notes: list[str] = Field(default_factory=list)
    message: str


def export_table(
    root: ResultsRoot,
    args: ExportTableArgs,
    *,
    max_source_bytes: int,
    max_table_file_bytes: int | None = None,
    sort_memory_rows: int = 100_000,
    tmp_dir: str | None = None,
    limits: TableLimits | None = None,
) -> ExportResult:
    """Write the chosen rows and columns of ``args.source`` to ``exports/`` and describe the new file.

    At most ``max_source_bytes`` of a whole-read source (JSON) are read, ``max_table_file_bytes`` of a streamed
    one (a table file, CSV, TSV, Markdown); ``limits`` caps its lines, cells and nesting (default: the policy's
    defaults). At most ``sort_memory_rows`` rows, and 32 MiB of the source, are held for sorting (more go to
    temporary files in ``tmp_dir``, host side). Bad arguments raise :class:`InvalidToolArguments`, a bad source
    :class:`~sandbox_runtime.errors.BadTableFile`.
    """
    if sort_memory_rows < 1:
        raise ValueError("sort_memory_rows must be >= 1")
    ext = "." + args.format
    stem = _stem_from_filename(args.filename) if args.filename is not None else None
    with ExitStack() as stack:
        source = stack.enter_context(
            open_table(
                root, args.source, max_bytes=max_source_bytes, max_stream_bytes=max_table_file_bytes, limits=limits
            )
        )
        shown = display_name(source.path)
        picked = _pick_columns(source, args.columns)
        if args.format == "xlsx" and len(picked) > XLSX_MAX_COLUMNS:
            raise InvalidToolArguments(
                f"export_table: an XLSX sheet holds at most {XLSX_MAX_COLUMNS:,} columns, not {len(picked):,}; "
                "choose fewer columns or use format csv"
            )
        rows, total = _ordered_rows(stack, source, picked, args.sort, sort_memory_rows, tmp_dir)
        wanted = _check_range(args, total, shown)
        work = stack.enter_context(tempfile.TemporaryDirectory(dir=tmp_dir, prefix="sandbox-runtime-export-"))
        built = os.path.join(work, "export" + ext)
        headers = [header for _index, header in picked]
        tally = CellTally()
        selected = itertools.islice(rows, args.start, None if args.count is None else args.start + args.count)
        with open_sheet(args.format, built, work, tally) as sheet:
            sheet.header(headers)
            written = 0
            for row in selected:
                sheet.write(row)
                written += 1
        path, chunks = _publish(root, stem or _default_stem(source.path), ext, built)
    logger.info("export_table %s -> %s: %d rows, %d bytes", shown, path, written, chunks.bytes)
    detail = _detail(args, written, total, wanted)
    guarded = f"{tally.guarded:,} cell{'s' * (tally.guarded != 1)} guarded against formulas"
    notes = [*source.notes, *tally.notes()]
    return ExportResult(
        path=path,
        format=args.format,
        bytes=chunks.bytes,
        sha256=chunks.sha256,
        rows=written,
        columns=headers,
        column_types=[source.column_types[index] for index, _header in picked],
        guarded_cells=tally.guarded,
        replaced_characters=tally.replaced,
        cut_cells=tally.cut,
        notes=notes,
        message=(
            f"Wrote {plural(written, 'row')} {_TIMES} {plural(len(headers), 'column')} ({chunks.bytes:,} bytes) to "
            f"{path}{detail}; {guarded}" + "".join(f"; {note}" for note in notes) + "."
        ),
    )


# arguments ------------------------------------------------------------------------------------------------
def _clean_stem(raw: str) -> str:
    return _UNSAFE_NAME.sub("_", raw).strip("._-")[:_STEM_MAX_CHARS].rstrip("._-")


def _stem_from_filename(raw: str) -> str:
    if "/" in raw or "\\" in raw:
        raise InvalidToolArguments(
            f"export_table: filename {display_name(raw)!r} must be a base name without '/' or '\\'; "
            f"the file always goes to {_EXPORTS}/"
        )
    base = raw
    for extension in (".csv", ".xlsx"):
        if base.lower().endswith(extension):
            base = base[: -len(extension)]
            break
    stem = _clean_stem(base)
    if not stem:
        raise InvalidToolArguments(
            f"export_table: filename {display_name(raw)!r} has no usable characters; use letters, digits, '.', "
            "'_' and '-' (the extension follows format)"
        )
    return stem


def _default_stem(source_path: str) -> str:
    name = source_path.rsplit("/", 1)[-1]
    name = name[: -len(TABLE_FILE_SUFFIX)] if name.endswith(TABLE_FILE_SUFFIX) else os.path.splitext(name)[0]
    return _clean_stem(name) or "export"


def _pick_columns(source: TableSource, choices: Sequence[str | ExportColumn] | None) -> list[tuple[int, str]]:
    """(source position, header) of every column to write."""
    if choices is None:
        return list(enumerate(source.columns))
    names = [choice if isinstance(choice, str) else choice.name for choice in choices]
    positions = select_columns(source, names, tool="export_table")
    headers = [c if isinstance(c, str) else c.header if c.header is not None else c.name for c in choices]
    for name, header in zip(names, headers, strict=True):
        if not header.strip():
            raise InvalidToolArguments(
                f"export_table: the header for column {display_name(name)!r} is empty; give a non-empty header"
            )
    repeated = [header for header, times in Counter(headers).items() if times > 1]
    if repeated:
        raise InvalidToolArguments(
            f"export_table: every header must be unique, but {column_listing(repeated)} appear more than once; "
            "give each column its own header with {name, header}"
        )
    return list(zip(positions, headers, strict=True))


SORT_WIDTH_BASIS = 10  # the row width sort_memory_rows is counted in


def _ordered_rows(
    stack: ExitStack,
    source: TableSource,
    picked: list[tuple[int, str]],
    sort: ExportSort | None,
    memory_rows: int,
    tmp_dir: str | None,
) -> tuple[Iterator[list[Cell]], int]:
    """The chosen columns of every row, sorted when asked, and the number of rows."""
    indices = [index for index, _header in picked]
    if sort is None:
        return ([row[i] for i in indices] for row in source.rows), source.row_count
    sort_index = _sort_column(source, picked, sort.column)
    keep = indices if sort_index in indices else [*indices, sort_index]
    # memory_rows counts rows of up to SORT_WIDTH_BASIS columns: wider rows hold more, so fewer fit in a run
    memory_rows = max(1, memory_rows * SORT_WIDTH_BASIS // max(SORT_WIDTH_BASIS, len(keep)))
    projected = ([row[i] for i in keep] for row in source.rows)
    ordered = stack.enter_context(
        sort_rows(
            projected,
            keep.index(sort_index),
            descending=sort.direction == "desc",
            memory_rows=memory_rows,
            tmp_dir=tmp_dir,
            consumed=source.consumed,
        )
    )
    width = len(indices)
    rows = ordered.rows if len(keep) == width else (row[:width] for row in ordered.rows)
    return rows, ordered.total


def _sort_column(source: TableSource, picked: list[tuple[int, str]], name: str) -> int:
    if name in source.columns:
        return source.columns.index(name)
    for index, header in picked:
        if header == name:
            return index
    raise InvalidToolArguments(
        f"export_table: cannot sort by {display_name(name)!r}: there is no such column in "
        f"{display_name(source.path)}; its {len(source.columns):,} columns are: {column_listing(source.columns)}"
    )


def _check_range(args: ExportTableArgs, total: int, shown: str) -> int:
    """How many rows the range holds; raises when ``start`` is past the end or XLSX cannot hold them."""
    if args.start > 0 and args.start >= total:
        last = f"; start counts from 0, so the last row is start={total - 1:,}" if total else ""
        raise InvalidToolArguments(
            f"export_table: start={args.start:,} is past the end: {shown} has {plural(total, 'row')}{last}"
        )
    wanted = max(0, total - args.start)
    wanted = wanted if args.count is None else min(wanted, args.count)
    if args.format == "xlsx" and wanted > XLSX_MAX_DATA_ROWS:
        raise InvalidToolArguments(
            f"export_table: an XLSX sheet holds at most {XLSX_MAX_DATA_ROWS:,} data rows (plus the header), but "
            f"this export would have {wanted:,}; export parts with start/count, or use format csv"
        )
    return wanted


def _detail(args: ExportTableArgs, written: int, total: int, wanted: int) -> str:
    parts: list[str] = []
    if args.start or args.count is not None:
        span = f"rows {args.start:,} to {args.start + written - 1:,}" if written else "no rows"
        parts.append(f"{span} of {total:,}")
    if args.sort is not None:
        parts.append(f"sorted by {display_name(args.sort.column)!r} {args.sort.direction}ending, NULLs last")
    if written != wanted:
        parts.append(f"the source changed while read: {wanted:,} rows were expected")
    return f" ({'; '.join(parts)})" if parts else ""


# publishing -----------------------------------------------------------------------------------------------
class _Chunks:
    """The built file in chunks, hashed and counted as they pass (again on every pass)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self.sha256 = ""
        self.bytes = 0

    def __iter__(self) -> Iterator[bytes]:
        digest = hashlib.sha256()
        self.bytes = 0
        with open(self._path, "rb") as file:
            while chunk := file.read(_PUBLISH_CHUNK):
                digest.update(chunk)
                self.bytes += len(chunk)
                yield chunk
        self.sha256 = digest.hexdigest()


def _taken_names(root: ResultsRoot) -> set[str]:
    try:
        return {entry.name for entry in root.list_dir(_EXPORTS, max_entries=_LISTED_EXPORTS)}
    except PathNotFound:
        return set()


def _publish(root: ResultsRoot, stem: str, ext: str, built: str) -> tuple[str, _Chunks]:
    """Publish ``built`` as ``exports/<stem><ext>``, or ``<stem>-2<ext>`` … when the name is taken."""
    taken = _taken_names(root)
    chunks = _Chunks(built)
    for _attempt in range(_PUBLISH_ATTEMPTS):
        name, number = stem + ext, 2
        while name in taken:
            name, number = f"{stem}-{number}{ext}", number + 1
        try:
            return root.create_file(f"{_EXPORTS}/{name}", chunks, mode=0o644), chunks
        except PathExists:
            taken.add(name)  # made since exports/ was listed
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise InvalidToolArguments(
                    f"export_table: the results folder is full (its disk quota is reached), so {_EXPORTS}/{name} "
                    "was not written; delete files you no longer need, or export fewer rows or columns"
                ) from exc
            raise
    raise InvalidToolArguments(
        f"export_table: no free name for {stem}{ext} in {_EXPORTS}/ after {_PUBLISH_ATTEMPTS} tries; "
        "pass another filename"
    )
