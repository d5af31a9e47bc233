"""JSON text spilled at C speed, without building the Python objects the file does not need (msgspec).

Two shapes take this path; everything else, and every input it declines, takes the general one
(:func:`~sandbox_runtime.tables.table.recognise_table` over a parsed value). Records come out byte for byte as the
general path writes them; other JSON keeps the tool's own spelling of the same values.

* **An array of records** (``[{...}, ...]``) is decoded into one struct per record, each column's type guessed
  from the first record and checked by the decoder as it reads: integers, booleans, strings, and ISO dates
  (YYYY-MM-DD, parsed in C). A column whose first value is a number, null, nested, or a datetime-looking text is
  decoded untyped and typed the general way. When a value does not fit its guess, every column is decoded
  untyped once more; a record with a key the first record lacks (or a key holding ``\\``, ``"`` or a control
  character), or text that is not JSON, is declined.
* **Any other JSON object or array** is validated and re-indented by ``msgspec.json.format`` straight from the
  text: one value per line, each string and number spelled exactly as the tool wrote it, ``\\u`` escapes too.
  Text made mostly of escapes (over half its characters; ``json.dumps`` writes Chinese or Russian prose that
  way) is declined, so that the general path writes those characters themselves and line tools find them (such
  text is string-heavy, which keeps parsing it cheap); so is an object with top-level ``columns`` and ``rows``
  (a table in the general path's eyes).

Text nested deeper than msgspec goes (it raises ``RecursionError``, not ``DecodeError``, at about 1,000 levels) is
declined too, whichever step meets it; the general path keeps such text as it is.

The general path parses into dicts, types every column from scratch and frees it all again; this one is two to
three times faster on a megabyte (``bench/bench_spill.py``). Tests compare the two file for file.
"""

from __future__ import annotations

import datetime as dt
import functools
import operator
import re
from typing import Any, Literal, NamedTuple

import msgspec
from msgspec.structs import astuple

from sandbox_runtime.tables.cells import ColumnType, clean_column, date_like
from sandbox_runtime.tables.jsonio import dumps_lines
from sandbox_runtime.tables.table import header_line

__all__ = ["SpillFile", "SpillFormat", "fast_json_file"]

SpillFormat = Literal["json", "table", "text"]

_COLUMNS_MAX = 1024  # a first record with more keys takes the general path
_ESCAPE_CHARS = 6  # \uXXXX
_ESCAPED_SHARE_MAX = 0.5  # text with more of its characters in \u escapes has them decoded (general path)
_FIRST_RECORD_TOKENS_MAX = 10_000  # tokens scanned to find where the first record ends
_OPENING = re.compile(r"\s*([\[{])\s*(\S?)")
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]]')
_UNNAMEABLE = re.compile(r'[\\"\x00-\x1f]')  # characters msgspec refuses in a field's JSON name
_JSON_SCALARS = frozenset({type(None), bool, int, float, str})
_CHECKED: dict[type, ColumnType] = {int: "integer", bool: "boolean", dt.date: "date", str: "string"}


class SpillFile(NamedTuple):
    """A spill file's format and bytes, and for a table its shape (None otherwise)."""

    kind: SpillFormat
    data: bytes
    rows: int | None = None
    columns: tuple[str, ...] | None = None
    column_types: tuple[ColumnType, ...] | None = None


def fast_json_file(text: str) -> SpillFile | None:
    """The spill file for ``text`` when it is JSON of a shape this path takes; None to use the general path."""
    opening = _OPENING.match(text)
    if opening is None:
        return None
    records = opening[1] == "[" and opening[2] == "{"
    if not records and _ESCAPE_CHARS * text.count("\\u") > _ESCAPED_SHARE_MAX * len(text):
        return None  # mostly escapes: the general path writes the characters themselves
    try:
        data = text.encode()
    except UnicodeEncodeError:  # lone surrogates: the general path writes them as it can
        return None
    try:
        return _records(data) if records else _reindented(data, is_object=opening[1] == "{")
    except RecursionError:  # nested past what msgspec (or a writer after it) goes: the general path keeps it as text
        return None


def _reindented(data: bytes, *, is_object: bool) -> SpillFile | None:
    try:
        pretty = msgspec.json.format(data, indent=2)
    except (msgspec.DecodeError, RecursionError):
        return None
    if is_object and b'\n  "columns": ' in pretty and b'\n  "rows": ' in pretty:
        return None  # maybe a {columns, rows} table
    return SpillFile("json", pretty + b"\n")


def _records(data: bytes) -> SpillFile | None:
    first = _first_record(data)
    if first is None or not 0 < len(first) <= _COLUMNS_MAX or any(map(_UNNAMEABLE.search, first)):
        return None
    names = tuple(first)
    guessed = tuple(_guess(value) for value in first.values())
    for checked in dict.fromkeys((guessed, (object,) * len(names))):  # the guess, then every column unchecked
        try:
            records = _decoder(names, checked).decode(data)
        except msgspec.ValidationError as exc:
            if "unknown field" in str(exc):
                return None  # the general path takes the union of the records' keys
            continue
        except (msgspec.DecodeError, RecursionError):
            return None
        rows = list(map(astuple, records))
        del records
        return _file(names, checked, rows)
    return None


def _first_record(data: bytes) -> dict[str, Any] | None:
    """The first record, found by scanning strings and brackets (bounded) and decoded on its own."""
    start, depth = data.index(b"{"), 0
    for count, token in enumerate(_TOKEN.finditer(data, start)):
        if count > _FIRST_RECORD_TOKENS_MAX:
            return None
        bracket = token[0][:1]
        if bracket in b"{[":
            depth += 1
        elif bracket in b"}]":
            depth -= 1
            if depth == 0:
                try:
                    first = msgspec.json.decode(data[start : token.end()])
                except (msgspec.DecodeError, RecursionError):
                    return None
                return first if isinstance(first, dict) else None
    return None


def _guess(value: object) -> type:
    """The type a column is checked against while decoding, from its first value (``object``: not checked)."""
    if isinstance(value, bool | int):
        return type(value)
    if isinstance(value, str):
        if not date_like(value):
            return str
        return dt.date if len(value) == 10 else object
    return object


@functools.lru_cache(maxsize=64)
def _decoder(names: tuple[str, ...], checked: tuple[type, ...]) -> msgspec.json.Decoder[list[Any]]:
    """A decoder of records with exactly these keys (a missing one is null), one struct per record."""
    fields = [(f"f{i}", kind | None if kind is not object else Any, None) for i, kind in enumerate(checked)]
    record = msgspec.defstruct(
        "Record", fields, rename={f"f{i}": name for i, name in enumerate(names)}, forbid_unknown_fields=True, gc=False
    )
    return msgspec.json.Decoder(list[record])  # type: ignore[valid-type]


def _file(names: tuple[str, ...], checked: tuple[type, ...], rows: list[tuple[Any, ...]]) -> SpillFile:
    """Type the unchecked columns the general way; rows whose cells that changes are rebuilt from the columns."""
    types: list[ColumnType] = []
    cleaned: dict[int, list[Any]] = {}
    for i, kind in enumerate(checked):
        if kind is not object:
            types.append(_CHECKED[kind])
            continue
        column = list(map(operator.itemgetter(i), rows))
        present = set(map(type, column))
        types.append(clean_column(column))
        if types[-1] == "datetime" or not present <= _JSON_SCALARS:  # normalised datetimes, nested values as text
            cleaned[i] = column
    if cleaned:
        columns = [cleaned[i] if i in cleaned else list(map(operator.itemgetter(i), rows)) for i in range(len(names))]
        rows = list(zip(*columns, strict=True))
    header = header_line(names, types).encode("utf-8", "surrogatepass")
    return SpillFile("table", dumps_lines(rows, prefix=header), len(rows), names, tuple(types))
