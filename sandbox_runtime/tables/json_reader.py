"""A whole-JSON table file (an array of objects, or a ``{"columns": [...], "rows": [[...]]}`` object) read for
``export_table`` and ``render_table`` without parsing it into Python objects at once.

The file is read whole — at most ``store.read_max_bytes`` (64 MiB by default) — into one buffer, which stays the
only large thing in memory: its rows are found in the bytes by a scanner (one regular expression matches a run of
up to 1,024 flat rows at C speed; nested rows are walked token by token) and decoded a run at a time (about
1 MiB, or one row), once to type the columns (:class:`~sandbox_runtime.tables.cells.ColumnTyper`) and once more
to yield them. Peak memory is the file's bytes plus one run of rows as Python objects, about 1x the file plus a
few MiB; a parse into Python objects at once costs 10-20x the text (more for tiny rows: over 1 GB for 64 MiB).

Caps: a row (one item of the array) at most ``TableLimits.line_max_bytes``; a cell at most
``TableLimits.cell_max_chars`` characters; nesting at most ``TableLimits.nesting_max`` levels (the array is
level 1); records at most 100,000 distinct keys. Past a cap is a :class:`~sandbox_runtime.errors.BadTableFile`.
Text that starts like JSON but is not JSON is recognised the general way when it is small (1 MiB at most: a
Python literal of a list of dicts, which some tools print), else it is not a table and the reason says where.
"""

from __future__ import annotations

import codecs
import json
import operator
import re
from collections.abc import Iterator
from typing import Any

import msgspec

from sandbox_runtime.errors import BadTableFile, InvalidToolArguments
from sandbox_runtime.tables.cells import Cell, ColumnType, ColumnTyper, as_cells, finish_column
from sandbox_runtime.tables.lines import TableLimits, TableSource
from sandbox_runtime.tables.table import Table, recognise_table, unique_names

__all__ = ["LITERAL_MAX_BYTES", "RECORD_KEYS_MAX", "json_table"]

LITERAL_MAX_BYTES = 1 << 20  # text that is not JSON is tried as a Python literal up to this size (ast: ~100x)
RECORD_KEYS_MAX = 100_000  # distinct keys (columns) of an array of objects
_BATCH_BYTES = 1 << 20  # bytes of the file decoded at once (a run of rows), unless one row is larger
_RUN_SIZES = (1024, 128, 16, 2)  # rows a run may hold at most, tried in this order as rows grow larger
_VALIDATE_CHUNK = 1 << 20
_STRING = rb'"(?:[^"\\]++|\\.)*+"'
_FLAT = re.compile(
    rb"\{(?:[^{}\[\]\"]++|" + _STRING + rb")*+\}|\[(?:[^{}\[\]\"]++|" + _STRING + rb")*+\]|" + _STRING
    + rb"|[-+.0-9A-Za-z]++"
)  # fmt: skip
_RUNS = {
    size: re.compile(rb"(?:[ \t\n\r]*+(?:" + _FLAT.pattern + rb")[ \t\n\r]*+,){1,%d}+" % size) for size in _RUN_SIZES
}  # up to `size` flat items, each followed by a comma: a run ends where an item does
_TOKEN = re.compile(_STRING + rb"|[\[\]{}]")
_SPACE = re.compile(rb"[ \t\n\r]*+")
_OPEN = frozenset(b"[{")


class _NotJson(ValueError):
    """The text is not JSON; the message says where."""


class _Progress:
    """Bytes of rows decoded so far, in both passes (only grows)."""

    def __init__(self) -> None:
        self.read = 0

    def __call__(self) -> int:
        return self.read


class _Scanner:
    """Finds runs of the items of a JSON array in ``data`` without decoding them, keeping the row and nesting
    caps; decodes a run as one array."""

    def __init__(self, data: bytes | memoryview, limits: TableLimits, shown: str) -> None:
        self.data, self.limits, self.shown = data, limits, shown
        self.end = 0  # after runs(): the position after the array's "]"

    def space(self, pos: int) -> int:
        found = _SPACE.match(self.data, pos)
        return found.end() if found else pos

    def runs(self, pos: int, depth: int, what: str) -> Iterator[tuple[int, int]]:
        """Spans of consecutive items of the array whose ``[`` is at ``pos`` (the array sits at nesting level
        ``depth``): ``data[start:end]`` is one or more whole items with the commas between them, within the row
        cap each and about 1 MiB together. After the last one :attr:`end` is the position after the ``]``."""
        data, cap = self.data, self.limits.line_max_bytes
        flat_allowed = depth + 1 <= self.limits.nesting_max
        pos = self.space(pos + 1)
        if data[pos : pos + 1] == b"]":
            self.end = pos + 1
            return
        size = 0  # index into _RUN_SIZES
        while True:
            run = _RUNS[_RUN_SIZES[size]].match(data, pos) if flat_allowed else None
            if run is not None:
                span = run.end() - pos
                if span > _BATCH_BYTES and size + 1 < len(_RUN_SIZES):
                    size += 1  # larger rows: fewer per run
                    continue
                if span <= cap:
                    yield pos, run.end() - 1  # without the last comma
                    pos = run.end()
                    if span < _BATCH_BYTES // 8 and size:
                        size -= 1
                    continue
            pos = self.space(pos)  # one item on its own: nested, the last one, or a large one
            end = self.value_end(pos, depth, f"{what} at byte {pos:,}")
            yield pos, end
            pos = self.space(end)
            separator = data[pos : pos + 1]
            if separator == b"]":
                self.end = pos + 1
                return
            if separator != b",":
                raise _NotJson(f"expected ',' or ']' at byte {pos:,}")
            pos += 1

    def value_end(self, pos: int, depth: int, where: str) -> int:
        """The end of the JSON value at ``pos``, held in a container at nesting level ``depth``."""
        flat = _FLAT.match(self.data, pos)
        if flat is not None:
            end = flat.end()
            if self.data[pos] in _OPEN and depth + 1 > self.limits.nesting_max:
                raise self.limits.too_deep(self.shown, where)
        elif pos < len(self.data) and self.data[pos] in _OPEN:
            end = self._nested_end(pos, depth, where)
        else:
            raise _NotJson(f"no JSON value at byte {pos:,}")
        if end - pos > self.limits.line_max_bytes:
            raise self.limits.line_too_long(self.shown, where, end - pos)
        return end

    def _nested_end(self, pos: int, depth: int, where: str) -> int:
        level = depth
        for token in _TOKEN.finditer(self.data, pos):
            if token.start() - pos > self.limits.line_max_bytes:
                raise self.limits.line_too_long(self.shown, where)
            char = self.data[token.start()]
            if char in _OPEN:
                level += 1
                if level > self.limits.nesting_max:
                    raise self.limits.too_deep(self.shown, where)
            elif char in b"]}":
                level -= 1
                if level == depth:
                    return token.end()
        raise _NotJson(f"the value at byte {pos:,} never ends")

    def decode(self, start: int, end: int, where: str) -> Any:
        """The JSON value ``data[start:end]``."""
        return _decode(self.data[start:end], self.limits, self.shown, where)

    def decode_run(self, start: int, end: int, where: str) -> list[Any]:
        """The items of a run, as a list."""
        items: list[Any] = _decode(b"[" + self.data[start:end] + b"]", self.limits, self.shown, where)
        return items


def _decode(piece: bytes | memoryview, limits: TableLimits, shown: str, where: str) -> Any:
    try:
        return msgspec.json.decode(piece)
    except msgspec.DecodeError:
        pass  # lone surrogates, NaN, numbers out of range: the standard library takes them
    except RecursionError as exc:
        raise limits.too_deep(shown, where, exc) from exc
    try:
        return json.loads(bytes(piece).decode("utf-8", "surrogatepass"))
    except RecursionError as exc:
        raise limits.too_deep(shown, where, exc) from exc
    except ValueError as exc:
        raise _NotJson(f"{where} is not JSON ({exc})") from exc


def _check_utf8(data: bytes, shown: str) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
    view = memoryview(data)
    for at in range(0, len(data), _VALIDATE_CHUNK):
        try:
            decoder.decode(view[at : at + _VALIDATE_CHUNK], final=at + _VALIDATE_CHUNK >= len(data))
        except UnicodeDecodeError as exc:
            raise InvalidToolArguments(
                f"{shown} is not UTF-8 text (invalid byte at offset {at + max(0, exc.start):,}), so not a table"
            ) from exc


def json_table(data: bytes, start: int, sandbox: str, shown: str, limits: TableLimits) -> TableSource | str:
    """The table in a whole-JSON file's bytes, whose value starts at ``start`` (after a BOM and white space),
    or why it is not one."""
    _check_utf8(data, shown)
    scanner = _Scanner(data, limits, shown)
    try:
        if data[start : start + 1] == b"[":
            return _records(scanner, start, sandbox)
        return _columns_rows(scanner, start, sandbox)
    except _NotJson as exc:
        if len(data) <= LITERAL_MAX_BYTES:
            return _general(data[start:].decode("utf-8", "surrogatepass"), sandbox)
        return (
            f"text that starts like JSON but is not JSON ({exc}), and is too large to be tried as a Python "
            f"literal (over {LITERAL_MAX_BYTES:,} bytes)"
        )


def _general(text: str, sandbox: str) -> TableSource | str:
    """A small text recognised as :func:`recognise_table` does (a Python literal of a list of dicts, say)."""
    found = recognise_table(text)
    if not isinstance(found, Table):
        return found
    rows = (list(row) for row in found.iter_rows())
    return TableSource(sandbox, found.columns, found.column_types, rows, found.shape, found.row_count, found.notes)


def _columns_of(batch: list[dict[str, Any]], names: dict[str, int], same_keys: bool) -> list[list[Any]]:
    """The batch's records as columns, in the order of ``names`` (a missing key is NULL)."""
    if same_keys:
        return [list(map(operator.itemgetter(name), batch)) for name in names]
    return [[record.get(name) for record in batch] for name in names]


def _check_cell_sizes(columns: list[list[Any]], limits: TableLimits, shown: str, where: str) -> None:
    for column in columns:
        longest = max((len(value) for value in as_cells(column) if type(value) is str), default=0)
        if longest > limits.cell_max_chars:
            raise limits.cell_too_long(shown, where, longest)


def _records(scanner: _Scanner, start: int, sandbox: str) -> TableSource | str:
    """An array of objects: the union of their keys in first-seen order, typed in runs."""
    limits, shown = scanner.limits, scanner.shown
    names: dict[str, int] = {}
    typers: list[ColumnTyper] = []
    count = 0
    progress = _Progress()
    for begin, end in scanner.runs(start, 1, "a record"):
        where = f"the records from record {count + 1:,}"
        batch = scanner.decode_run(begin, end, where)
        if set(map(type, batch)) != {dict}:
            return "a list whose items are not all objects"
        same = bool(names) and all(map(names.keys().__eq__, map(dict.keys, batch)))
        if not same:
            for record in batch:
                for key in record:
                    if key not in names:
                        if len(names) >= RECORD_KEYS_MAX:
                            raise BadTableFile(f"{shown}: its records have more than {RECORD_KEYS_MAX:,} keys")
                        names[key] = len(names)
                        typers.append(ColumnTyper())
        columns = _columns_of(batch, names, same)
        if end - begin > limits.cell_max_chars:
            _check_cell_sizes(columns, limits, shown, where)
        for typer, column in zip(typers, columns, strict=True):
            typer.add(column)
        count += len(batch)
        progress.read += end - begin
    _after(scanner)
    if not count:
        return "an empty list has no columns"
    types = tuple(typer.kind for typer in typers)

    def rows() -> Iterator[list[Cell]]:
        for begin, end in scanner.runs(start, 1, "a record"):
            batch = scanner.decode_run(begin, end, "records")
            same = all(map(names.keys().__eq__, map(dict.keys, batch)))
            progress.read += end - begin
            yield from _rows_of(_columns_of(batch, names, same), types)

    return TableSource(sandbox, tuple(names), types, rows(), "json_records", count, (), progress)


def _rows_of(columns: list[list[Any]], types: tuple[ColumnType, ...]) -> Iterator[list[Cell]]:
    finished = [finish_column(column, kind) for column, kind in zip(columns, types, strict=True)]
    return map(list, zip(*finished, strict=True))


def _columns_rows(scanner: _Scanner, start: int, sandbox: str) -> TableSource | str:
    """A ``{"columns": [...], "rows": [[...]]}`` object (other keys are ignored)."""
    limits, shown = scanner.limits, scanner.shown
    try:
        top = msgspec.json.decode(memoryview(scanner.data)[start:], type=dict[str, msgspec.Raw])
    except RecursionError as exc:
        raise limits.too_deep(shown, "the object", exc) from exc
    except msgspec.DecodeError as exc:
        raise _NotJson(str(exc)) from exc
    if not {"columns", "rows"} <= set(top):
        return "not a list of objects or a {columns, rows} object"
    raw_columns, raw_rows = memoryview(top["columns"]), memoryview(top["rows"])
    if len(raw_columns) > limits.line_max_bytes:
        raise limits.line_too_long(shown, "'columns'", len(raw_columns))
    columns_value = _decode(raw_columns, limits, shown, "'columns'")
    if not isinstance(columns_value, list) or bytes(raw_rows[:1]) != b"[":
        return "'columns' and 'rows' must both be lists"
    names, notes = unique_names([_column_name(c) for c in columns_value])
    if not names:
        return "'columns' is empty"
    rows_scanner = _Scanner(raw_rows, limits, shown)
    typers = [ColumnTyper() for _ in names]
    count = 0
    progress = _Progress()
    for begin, end in rows_scanner.runs(0, 2, "a row"):
        where = f"the rows from row {count + 1:,}"
        batch = rows_scanner.decode_run(begin, end, where)
        for number, row in enumerate(batch, start=count + 1):
            if not isinstance(row, list) or len(row) != len(names):
                cells = len(row) if isinstance(row, list) else "no"
                return f"row {number} has {cells} cells for {len(names)} columns"
        columns = [list(column) for column in zip(*batch, strict=True)] or [[] for _ in names]
        if end - begin > limits.cell_max_chars:
            _check_cell_sizes(columns, limits, shown, where)
        for typer, column in zip(typers, columns, strict=True):
            typer.add(column)
        count += len(batch)
        progress.read += end - begin
    types = tuple(typer.kind for typer in typers)

    def rows() -> Iterator[list[Cell]]:
        for begin, end in rows_scanner.runs(0, 2, "a row"):
            batch = rows_scanner.decode_run(begin, end, "rows")
            progress.read += end - begin
            yield from _rows_of([list(column) for column in zip(*batch, strict=True)], types)

    return TableSource(sandbox, names, types, rows(), "json_columns_rows", count, notes, progress)


def _column_name(column: object) -> str:
    if isinstance(column, dict) and "name" in column:
        return str(column["name"])
    return str(column)


def _after(scanner: _Scanner) -> None:
    """Nothing but white space may follow the top-level array."""
    rest = scanner.space(scanner.end)
    if rest != len(scanner.data):
        raise _NotJson(f"more text after the array ends, at byte {rest:,}")
