"""CSV, TSV and Markdown tables streamed from a file the sandbox wrote: typed in one pass, read in a second.

Recognised as :func:`~sandbox_runtime.tables.table.recognise_table` recognises text (a Markdown table when the
first two non-blank lines are a ``|`` header and its rule; else TSV, then CSV, with a header line of at least two
columns and rows all as wide), and typed the same way (:class:`~sandbox_runtime.tables.cells.ColumnTyper` gives
the types :func:`~sandbox_runtime.tables.cells.clean_column` would). Nothing is read whole: the first pass keeps
one batch of rows (1,024 rows or 1 MiB of the file) to type the columns, the second yields one row at a time.
Blank lines, and lines of spaces only, are skipped.

Caps: a line (and a CSV record, which a quoted field may spread over several lines) at most
``TableLimits.line_max_bytes``; a cell at most ``TableLimits.cell_max_chars`` characters, and for CSV and TSV at
most Python's ``csv.field_size_limit()`` (131,072 by default: the lower of the two holds). Past a cap is a
:class:`~sandbox_runtime.errors.BadTableFile`; text that is not a table is the reason why (a ``str``).
"""

from __future__ import annotations

import codecs
import csv
from collections.abc import Iterator
from dataclasses import dataclass

from sandbox_runtime.errors import BadTableFile, InvalidToolArguments
from sandbox_runtime.tables.cells import Cell, ColumnType, ColumnTyper, coerce, text_cell
from sandbox_runtime.tables.lines import LineReader, TableLimits, TableSource
from sandbox_runtime.tables.table import markdown_cells, markdown_rule, unique_names

__all__ = ["text_table"]

_BATCH_ROWS = 1024  # rows typed at once in the first pass
_BATCH_BYTES = 1 << 20  # bytes of the file typed at once at most (unless one row is larger)
_NOT_A_TABLE = "text without a recognisable table (JSON, CSV/TSV or Markdown)"


class _Lines:
    """The decoded lines of one pass, with the line number and the bytes of the record being read."""

    def __init__(self, reader: LineReader, limits: TableLimits, shown: str) -> None:
        self._raw = reader.lines()
        self._limits, self._shown = limits, shown
        self.number = 0  # lines read
        self.offset = 0  # bytes read
        self.record = 0  # bytes of the current record so far
        self.record_line = 1  # the line it started on

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        raw = next(self._raw)
        self.number += 1
        if self.number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
            self.offset += len(codecs.BOM_UTF8)
        if b"\x00" in raw:
            raise InvalidToolArguments(f"{self._shown} is binary (line {self.number:,} holds NUL bytes), not a table")
        try:
            text = raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise InvalidToolArguments(
                f"{self._shown} is not UTF-8 text (invalid byte at offset {self.offset + exc.start:,}), so not a table"
            ) from exc
        self.offset += len(raw)
        self.record += len(raw)
        cap = self._limits.line_max_bytes
        if self.record > cap and self.record - raw.endswith(b"\n") - raw.endswith(b"\r\n") > cap:
            where = f"the record starting on line {self.record_line:,}"
            raise self._limits.line_too_long(self._shown, where)
        return text

    def new_record(self) -> None:
        self.record, self.record_line = 0, self.number + 1


def _blank(fields: list[str]) -> bool:
    return not fields or (len(fields) == 1 and not fields[0].strip())


def _csv_records(lines: _Lines, delimiter: str, limits: TableLimits, shown: str) -> Iterator[tuple[int, list[str]]]:
    """(first line number, fields) of every non-blank record; a field past a cap raises :class:`BadTableFile`."""
    reader = csv.reader(lines, delimiter=delimiter)
    while True:
        lines.new_record()
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if "field limit" in str(exc):
                raise BadTableFile(
                    f"{shown}: line {lines.number:,} has a field longer than {csv.field_size_limit():,} characters "
                    "(Python's csv field limit, which caps CSV cells below policy tools.table_cell_max_chars); "
                    "keep long text in files of its own, or read it in a run_python script"
                ) from exc
            raise _NotThisShape(f"line {lines.number:,}: {exc}") from exc
        if _blank(fields):
            continue
        if lines.record > limits.cell_max_chars:
            longest = max(map(len, fields))
            if longest > limits.cell_max_chars:
                raise limits.cell_too_long(shown, f"the record starting on line {lines.record_line:,}", longest)
        yield lines.record_line, fields


def _markdown_records(lines: _Lines, limits: TableLimits, shown: str) -> Iterator[tuple[int, list[str]]]:
    for line in lines:
        lines.new_record()
        if not line.strip():
            continue
        fields = markdown_cells(line)
        if len(line) > limits.cell_max_chars and max(map(len, fields)) > limits.cell_max_chars:
            raise limits.cell_too_long(shown, f"line {lines.number:,}", max(map(len, fields)))
        yield lines.number, fields


class _NotThisShape(ValueError):
    """The text is not a table of the shape tried (the message says why)."""


@dataclass(frozen=True)
class _Shape:
    name: str  # csv, tsv or markdown
    delimiter: str | None  # None for Markdown

    def records(self, lines: _Lines, limits: TableLimits, shown: str) -> Iterator[tuple[int, list[str]]]:
        """The rows after the header (and after a Markdown table's rule); the header first, on its own."""
        if self.delimiter is None:
            records = _markdown_records(lines, limits, shown)
            header = next(records, None)
            next(records, None)  # the rule under the header
        else:
            records = _csv_records(lines, self.delimiter, limits, shown)
            header = next(records, None)
        yield header if header is not None else (0, [])
        yield from records


@dataclass(frozen=True)
class _Scan:
    columns: tuple[str, ...]
    column_types: tuple[ColumnType, ...]
    notes: tuple[str, ...]
    rows: int


def _first_lines(reader: LineReader, limits: TableLimits, shown: str) -> list[str]:
    """The first two non-blank lines (fewer when the file has fewer)."""
    found: list[str] = []
    for line in _Lines(reader, limits, shown):
        if line.strip():
            found.append(line)
            if len(found) == 2:
                break
    return found


def _scan(reader: LineReader, shape: _Shape, limits: TableLimits, shown: str) -> _Scan:
    """The first pass: the header, the width of every row, and the column types."""
    lines = _Lines(reader, limits, shown)
    records = shape.records(lines, limits, shown)
    _number, header = next(records)
    if shape.delimiter is not None:
        if len(header) < 2:
            raise _NotThisShape(f"no {shape.delimiter!r} in the first line")
        header = [name.strip() for name in header]
    names, notes = unique_names(header)
    typers = [ColumnTyper() for _ in names]
    batch: list[list[Cell]] = []
    batch_from = lines.offset
    count = 0
    for number, fields in records:
        if len(fields) != len(names):
            raise _NotThisShape(f"line {number:,} has {len(fields):,} cells for {len(names):,} columns")
        batch.append([text_cell(field) for field in fields])
        count += 1
        if len(batch) >= _BATCH_ROWS or lines.offset - batch_from >= _BATCH_BYTES:
            _type(typers, batch)
            batch, batch_from = [], lines.offset
    _type(typers, batch)
    if shape.delimiter is not None and not count:
        raise _NotThisShape("a header line but no rows")
    return _Scan(names, tuple(typer.kind for typer in typers), notes, count)


def _type(typers: list[ColumnTyper], batch: list[list[Cell]]) -> None:
    if batch:
        for typer, column in zip(typers, zip(*batch, strict=True), strict=True):
            typer.add(list(column))


def _rows(reader: LineReader, shape: _Shape, scan: _Scan, limits: TableLimits, shown: str) -> Iterator[list[Cell]]:
    """The second pass: every row, typed by its column (a file changed since the first pass is an error)."""
    records = shape.records(_Lines(reader, limits, shown), limits, shown)
    next(records)  # the header
    dated = [(i, kind) for i, kind in enumerate(scan.column_types) if kind in ("date", "datetime")]
    width = len(scan.columns)
    try:
        for number, fields in records:
            if len(fields) != width:
                raise BadTableFile(
                    f"{shown} changed while it was read: line {number:,} now has {len(fields):,} cells for "
                    f"{width:,} columns"
                )
            row = [text_cell(field) for field in fields]
            for i, kind in dated:
                row[i] = coerce(row[i], kind)
            yield row
    except _NotThisShape as exc:
        raise BadTableFile(f"{shown} changed while it was read: {exc}") from exc


def text_table(reader: LineReader, sandbox: str, shown: str, limits: TableLimits) -> TableSource | str:
    """The CSV, TSV or Markdown table in the file, or why it is not one."""
    first = _first_lines(reader, limits, shown)
    if not first:
        return "empty text"
    shapes = [_Shape("tsv", "\t"), _Shape("csv", ",")]
    if len(first) == 2 and first[0].lstrip().startswith("|") and markdown_rule(first[1]):
        shapes = [_Shape("markdown", None)]
    reasons: list[str] = []
    for shape in shapes:
        try:
            scan = _scan(reader, shape, limits, shown)
        except _NotThisShape as exc:
            if shape.delimiter is None:
                return f"a Markdown table with rows of different widths ({exc})"
            reasons.append(f"as {shape.name.upper()}: {exc}")
            continue
        rows = _rows(reader, shape, scan, limits, shown)
        return TableSource(
            sandbox, scan.columns, scan.column_types, rows, shape.name, scan.rows, scan.notes, reader.consumed
        )
    return f"{_NOT_A_TABLE}; {'; '.join(reasons)}"
