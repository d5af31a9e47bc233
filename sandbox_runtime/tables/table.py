"""Recognising tables in tool results, and the typed, line-oriented file they are written as.

Shapes recognised: a JSON array of objects; a ``{"columns": [...], "rows": [[...]]}`` object;
CSV and TSV text; Markdown tables; Python-literal lists of dicts (some MCP servers print those; parsed with
``ast.literal_eval`` behind size and nesting gates, never ``eval``). Anything else is not a table, and
:func:`recognise_table` says why, so the caller writes it as JSON or text instead.

The file (``*.table.jsonl``): line 1 is a header object ``{"format": "sandbox-runtime.table", "version": 1,
"columns": [...], "column_types": [...]}``; every further line is one row as a JSON array. Numbers stay numbers,
dates and datetimes are ISO strings typed by their column, NULL is ``null``. Rows are written and read one at a
time, so memory does not grow with the row count.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import operator
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sandbox_runtime.tables.cells import Cell, ColumnType, clean_column, coerce, text_cell
from sandbox_runtime.tables.jsonio import dumps_compact, dumps_lines, loads

__all__ = [
    "TABLE_FORMAT",
    "Cell",
    "ColumnType",
    "Table",
    "TableFileError",
    "header_line",
    "iter_table_file",
    "markdown_cells",
    "markdown_rule",
    "recognise_table",
    "row_line",
    "table_file_bytes",
    "unique_names",
]

TABLE_FORMAT = "sandbox-runtime.table"
_LITERAL_MAX_CHARS = 5_000_000  # larger Python-literal text is not parsed (ast costs ~100x the text in memory)
_LITERAL_MAX_DEPTH = 64
_MD_RULE = re.compile(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?")
_MD_CELL_BORDER = re.compile(r"(?<!\\)\|")


class TableFileError(ValueError):
    """A table file is not in the format this module writes; the message says where and why."""


@dataclass(frozen=True)
class Table:
    """A recognised table: unique column names, typed values held column by column, and the shape it was found
    in. Column-major storage lets whole columns be checked and typed at C speed."""

    columns: tuple[str, ...]
    data: list[list[Cell]]  # one list per column, all of the same length
    column_types: tuple[ColumnType, ...]
    shape: str
    notes: tuple[str, ...] = ()

    @property
    def row_count(self) -> int:
        return len(self.data[0]) if self.data else 0

    def iter_rows(self) -> Iterator[tuple[Cell, ...]]:
        return zip(*self.data, strict=True)

    @property
    def rows(self) -> list[list[Cell]]:
        """Every row as a list (a copy; for small tables and tests)."""
        return [list(row) for row in self.iter_rows()]


# recognition --------------------------------------------------------------------------------------------
def recognise_table(result: object) -> Table | str:
    """The table in ``result`` (a parsed JSON value or a text), or the reason it is not one."""
    if isinstance(result, str):
        return _from_text(result)
    return _from_value(result, shape_prefix="json")


def _from_value(value: object, shape_prefix: str) -> Table | str:
    if isinstance(value, list):
        return _from_records(value, shape_prefix)
    if isinstance(value, dict) and set(value) >= {"columns", "rows"}:
        return _from_columns_rows(value["columns"], value["rows"], shape_prefix)
    return "not a list of objects or a {columns, rows} object"


def _from_records(value: list[Any], shape_prefix: str) -> Table | str:
    if not value:
        return "an empty list has no columns"
    if set(map(type, value)) != {dict}:
        return "a list whose items are not all objects"
    first = tuple(value[0])
    width = len(first)
    try:
        # the common case: every record has the same keys (same count, and each column found in every record)
        if not all(isinstance(k, str) for k in first) or set(map(len, value)) != {width}:
            raise KeyError(first)
        data = [list(map(operator.itemgetter(name), value)) for name in first]
        names = first
    except KeyError:
        columns: dict[str, None] = {}
        for record in value:
            for key in record:
                columns.setdefault(str(key), None)
        names = tuple(columns)
        data = [[record.get(name) for record in value] for name in names]
    return _typed(names, data, f"{shape_prefix}_records", ())


def _from_columns_rows(raw_columns: object, raw_rows: object, shape_prefix: str) -> Table | str:
    if not isinstance(raw_columns, list) or not isinstance(raw_rows, list):
        return "'columns' and 'rows' must both be lists"
    names, notes = unique_names([_column_name(c) for c in raw_columns])
    if not names:
        return "'columns' is empty"
    for number, row in enumerate(raw_rows, start=1):
        if not isinstance(row, list) or len(row) != len(names):
            return f"row {number} has {len(row) if isinstance(row, list) else 'no'} cells for {len(names)} columns"
    return _typed(names, _transpose(raw_rows, len(names)), f"{shape_prefix}_columns_rows", notes)


def _column_name(column: object) -> str:
    if isinstance(column, dict) and "name" in column:
        return str(column["name"])
    return str(column)


def _from_text(text: str) -> Table | str:
    stripped = text.strip()
    if not stripped:
        return "empty text"
    if stripped[0] in "[{":
        return _from_json_like(stripped)
    lines = [line for line in stripped.splitlines() if line.strip()]
    if len(lines) >= 2 and lines[0].lstrip().startswith("|") and markdown_rule(lines[1]):
        return _markdown(lines)
    for delimiter, shape in (("\t", "tsv"), (",", "csv")):
        table = _delimited(stripped, delimiter, shape)
        if isinstance(table, Table):
            return table
    return "text without a recognisable table (JSON, CSV/TSV or Markdown)"


def _from_json_like(text: str) -> Table | str:
    try:
        return _from_value(json.loads(text, parse_constant=_reject_constant), shape_prefix="json")
    except (ValueError, RecursionError):
        value = _python_literal(text)
    if value is not None:
        return _from_value(value, shape_prefix="python")
    return "text that starts like JSON but is neither JSON nor a Python literal (or is too large or deep)"


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _python_literal(text: str) -> object | None:
    """A list or dict written as a Python literal; None when it is not one or is too large or deep."""
    if len(text) > _LITERAL_MAX_CHARS or _nesting(text) > _LITERAL_MAX_DEPTH:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, list | dict) else None


def _nesting(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in "[{(":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]})":
            depth -= 1
    return deepest


def markdown_rule(line: str) -> bool:
    """Whether ``line`` is the rule under a Markdown table's header (``| --- | :-: |``)."""
    return _MD_RULE.fullmatch(line.strip()) is not None


def markdown_cells(line: str) -> list[str]:
    """The cells of one Markdown table line, stripped, ``\\|`` unescaped."""
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [cell.strip().replace("\\|", "|") for cell in _MD_CELL_BORDER.split(inner)]


def _markdown(lines: list[str]) -> Table | str:
    header = markdown_cells(lines[0])
    body = [markdown_cells(line) for line in lines[2:]]
    if any(len(row) != len(header) for row in body):
        return "a Markdown table with rows of different widths"
    names, notes = unique_names(header)
    return _typed(names, _transpose([[text_cell(c) for c in row] for row in body], len(names)), "markdown", notes)


def _delimited(text: str, delimiter: str, shape: str) -> Table | str:
    first_line = text.split("\n", 1)[0]
    if delimiter not in first_line:
        return f"not {shape}: no {delimiter!r} in the first line"
    try:
        rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
    except csv.Error as exc:
        return f"not {shape}: {exc}"
    rows = [row for row in rows if row]
    if len(rows) < 2 or len(rows[0]) < 2:
        return f"not {shape}: fewer than two lines or columns"
    if any(len(row) != len(rows[0]) for row in rows):
        return f"not {shape}: rows of different widths"
    names, notes = unique_names([name.strip() for name in rows[0]])
    return _typed(names, _transpose([[text_cell(c) for c in row] for row in rows[1:]], len(names)), shape, notes)


def unique_names(raw: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Column names made unique and non-empty (``name``, ``name_2``; ``column_3``), with a note per change."""
    names: list[str] = []
    notes: list[str] = []
    taken: set[str] = set()
    for index, name in enumerate(raw, start=1):
        candidate = name or f"column_{index}"
        base, suffix = candidate, 2
        while candidate in taken:
            candidate, suffix = f"{base}_{suffix}", suffix + 1
        if candidate != name:
            notes.append(f"column {index} {name!r} renamed {candidate!r}")
        taken.add(candidate)
        names.append(candidate)
    return tuple(names), tuple(notes)


def _transpose(rows: list[Any], width: int) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


def _typed(names: tuple[str, ...], data: list[list[Any]], shape: str, notes: tuple[str, ...]) -> Table:
    """Clean and type the values column by column (whole columns at C speed where the values allow)."""
    types = tuple(clean_column(column) for column in data)
    return Table(columns=names, data=data, column_types=types, shape=shape, notes=notes)


# the file ---------------------------------------------------------------------------------------------
def header_line(columns: Iterable[str], column_types: Iterable[ColumnType]) -> str:
    """Line 1 of a table file."""
    header = {"format": TABLE_FORMAT, "version": 1, "columns": list(columns), "column_types": list(column_types)}
    return json.dumps(header, ensure_ascii=False) + "\n"


def row_line(row: Iterable[Cell]) -> bytes:
    """One row of a table file (UTF-8, with its newline); dates and datetimes as ISO strings."""
    return dumps_compact(row if isinstance(row, list | tuple) else list(row)) + b"\n"


def table_file_bytes(table: Table) -> bytes:
    """The whole table file: the header line, then one line per row."""
    header = header_line(table.columns, table.column_types).encode("utf-8", "surrogatepass")
    return dumps_lines(list(table.iter_rows()), prefix=header)


def iter_table_file(lines: Iterable[str]) -> Iterator[tuple[tuple[str, ...], tuple[ColumnType, ...], list[Cell]]]:
    """Yield ``(columns, column_types, row)`` for every row, with dates and datetimes decoded by column type."""
    stream = iter(lines)
    try:
        header = json.loads(next(stream))
    except (StopIteration, ValueError, RecursionError) as exc:
        raise TableFileError("line 1: not a table header") from exc
    if not isinstance(header, dict) or header.get("format") != TABLE_FORMAT:
        raise TableFileError(f"line 1: not a {TABLE_FORMAT} header")
    columns = tuple(str(c) for c in header["columns"])
    types: tuple[ColumnType, ...] = tuple(header["column_types"])
    dated = [(i, kind) for i, kind in enumerate(types) if kind in ("date", "datetime")]  # only these change
    for number, line in enumerate(stream, start=2):
        try:
            row = loads(line)
        except ValueError as exc:
            raise TableFileError(f"line {number}: not a JSON row ({exc})") from exc
        except RecursionError as exc:  # msgspec and json give up on deep nesting this way, not as ValueError
            raise TableFileError(f"line {number}: nested deeper than the JSON parser allows") from exc
        if not isinstance(row, list) or len(row) != len(columns):
            raise TableFileError(f"line {number}: expected {len(columns)} cells")
        for i, kind in dated:
            row[i] = coerce(row[i], kind)
        yield columns, types, row
