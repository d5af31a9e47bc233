"""Cells and column types: how one value of a result becomes a typed table cell.

A column's type is the type of its non-NULL values — ``integer``, ``number``, ``boolean``, ``date``,
``datetime``, ``string``, or ``empty`` — with integers and numbers making ``number`` and dates and datetimes
making ``datetime``; any other mix is ``string``. Text cells (CSV, Markdown) are parsed: empty and NULL are NULL,
numbers are numbers, codes with leading zeros stay text. Whole columns are checked at once where the values allow
(``map`` over C functions), which keeps a megabyte of records to a few milliseconds. :class:`ColumnTyper` finds
the same type batch by batch, for readers that never hold a column whole (the streaming table readers).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
from typing import Any, Literal

__all__ = [
    "Cell",
    "ColumnType",
    "ColumnTyper",
    "as_cells",
    "cell",
    "clean_column",
    "coerce",
    "date_like",
    "finish_column",
    "text_cell",
    "type_from_kinds",
    "value_type",
]

ColumnType = Literal["integer", "number", "boolean", "date", "datetime", "string", "empty"]
Cell = int | float | bool | str | dt.date | dt.datetime | None

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?")
_INTEGER = re.compile(r"[+-]?\d{1,18}")
_NUMBER = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_LEADING_ZERO = re.compile(r"[+-]?0\d")


def cell(value: object) -> Cell:
    """A value as a cell: scalars, dates and datetimes as they are (NaN/inf become NULL), decimals as numbers,
    nested values as compact JSON text, any other object as its text."""
    if value is None or isinstance(value, bool | int | str | dt.date):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        return None if not value.is_finite() else int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return str(value)


def date_like(text: str) -> bool:
    """Whether a text starts like an ISO date (YYYY-MM-DD): only a column whose first string does is looked at
    as dates."""
    return _DATE.match(text) is not None


def text_cell(text: str) -> Cell:
    """A CSV/Markdown cell: empty is NULL, numbers and booleans are parsed, everything else stays text."""
    value = text.strip()
    if not value or value.upper() in ("NULL", "NONE"):
        return None
    if _LEADING_ZERO.match(value):
        return text  # a code such as a postal code or an id, not a number
    if _INTEGER.fullmatch(value):
        return int(value)
    if _NUMBER.fullmatch(value):
        number = float(value)
        return number if math.isfinite(number) else None  # 1e999: out of range is NULL, as in any column
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return text


def value_type(value: Cell) -> ColumnType:
    """The kind of one non-NULL cell; strings that are ISO dates or datetimes count as those."""
    for kind_of, kind in _KIND_BY_CLASS:
        if isinstance(value, kind_of):
            return kind
    if isinstance(value, str):
        if _DATE.fullmatch(value) and _parse_date(value) is not None:
            return "date"
        if _DATETIME.fullmatch(value) and _parse_datetime(value) is not None:
            return "datetime"
    return "string"


# checked in this order: a datetime is also a date, a bool is also an int
_KIND_BY_CLASS: tuple[tuple[type, ColumnType], ...] = (
    (dt.datetime, "datetime"),
    (dt.date, "date"),
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
)


def type_from_kinds(kinds: set[ColumnType]) -> ColumnType:
    """A column's type from the types of its non-NULL values."""
    if not kinds:
        return "empty"
    if len(kinds) == 1:
        return next(iter(kinds))
    if kinds == {"integer", "number"}:
        return "number"
    if kinds == {"date", "datetime"}:
        return "datetime"
    return "string"


_SCALARS = frozenset({type(None), bool, int, str})
_NUMERIC = frozenset({type(None), int, float})
_KIND_OF_TYPE: dict[type, ColumnType] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    dt.date: "date",
    dt.datetime: "datetime",
}


def _all_finite(numbers: list[Any], *, has_null: bool) -> bool:
    """No NaN or infinity among the floats. A finite sum proves it at C speed (NaN and infinities propagate);
    otherwise, or with NULLs present, every float is looked at."""
    if not has_null:
        try:
            if math.isfinite(sum(numbers)):
                return True
        except OverflowError:
            pass
    return all(map(math.isfinite, [v for v in numbers if type(v) is float]))


def _all_iso_dates(column: list[Any]) -> bool:
    """Every value is a real date written exactly YYYY-MM-DD: then they become date objects (in place).

    At C speed: of the ISO forms ``date.fromisoformat`` takes, only YYYY-MM-DD and the week form YYYY-Www-D are
    10 characters long, and only the week form holds a ``W``. A value that does not parse (``2026-02-30``)
    keeps the whole column text.
    """
    if set(map(len, column)) != {10} or "W" in "".join(column):
        return False
    try:
        column[:] = list(map(dt.date.fromisoformat, column))
    except ValueError:
        return False
    return True


def clean_column(column: list[Any]) -> ColumnType:
    """Make every value of ``column`` a cell (in place) and return the column's type; dates become objects."""
    present = set(map(type, column))
    if float in present and present <= _NUMERIC:
        if not _all_finite(column, has_null=type(None) in present):
            column[:] = map(cell, column)  # NaN and infinities become NULL
    elif not present <= _SCALARS:  # nested values and other objects become text
        column[:] = map(cell, column)
        present = set(map(type, column))
    if present == {str} and date_like(column[0]) and _all_iso_dates(column):
        return "date"
    kinds: set[ColumnType] = {_KIND_OF_TYPE[t] for t in present if t in _KIND_OF_TYPE}
    if str in present:
        kinds |= _string_kinds(column if present == {str} else [v for v in column if type(v) is str])
    kind = type_from_kinds(kinds)
    if kind in ("date", "datetime"):
        parse = dt.date.fromisoformat if kind == "date" else _parse_datetime
        column[:] = [parse(v) if isinstance(v, str) else v for v in column]
    return kind


def _string_kinds(strings: list[str]) -> set[ColumnType]:
    """The kinds of a column's strings: only a column whose first string looks like a date is looked at whole."""
    if not date_like(strings[0]):
        return {"string"}
    if all(map(_DATE.fullmatch, strings)):
        return {"date"} if all(map(_is_date, strings)) else {"string"}
    return {value_type(v) for v in strings}


def _is_date(text: str) -> bool:
    return _parse_date(text) is not None


def coerce(value: Cell, kind: ColumnType) -> Cell:
    """Dates and datetimes become date objects by their column's type; every other value keeps its own type."""
    if isinstance(value, str) and kind == "date":
        return _parse_date(value)
    if isinstance(value, str) and kind == "datetime":
        return _parse_datetime(value)
    return value


def _parse_date(text: str) -> dt.date | None:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        return None


def _parse_datetime(text: str) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


class ColumnTyper:
    """A column's type found from its values batch by batch, exactly as :func:`clean_column` finds it from all of
    them at once: a reader can type a column it never holds whole (memory stays one batch).

    :meth:`add` each batch of raw values in order (any JSON value or text cell; nothing is changed), then read
    :attr:`kind` and make the values cells with :func:`finish_column`.
    """

    __slots__ = ("_cleaned", "_look_at_strings", "_raw", "_seen_string", "_string_kinds")

    def __init__(self) -> None:
        self._raw: set[type] = set()  # the values' types as given
        self._cleaned: set[type] = set()  # their types as cells
        self._seen_string = False
        self._look_at_strings = False  # the column's first text looks like a date: each text is looked at
        self._string_kinds: set[ColumnType] = set()

    def add(self, values: list[Any]) -> None:
        """Take a batch of the column's values into account (in the column's order)."""
        self._raw |= set(map(type, values))
        values = as_cells(values)
        present = set(map(type, values))
        self._cleaned |= present
        if str not in present:
            return
        strings = values if present == {str} else [v for v in values if type(v) is str]
        if not self._seen_string:
            self._seen_string = True
            self._look_at_strings = date_like(strings[0])
            if not self._look_at_strings:
                self._string_kinds.add("string")
        if self._look_at_strings and "string" not in self._string_kinds:  # once text, always text
            if all(map(_DATE.fullmatch, strings)):
                self._string_kinds.add("date" if all(map(_is_date, strings)) else "string")
            else:
                self._string_kinds |= {value_type(v) for v in strings}

    @property
    def kind(self) -> ColumnType:
        """The column's type from every value added so far."""
        if float in self._raw and self._raw <= _NUMERIC:  # numbers and NULLs: a NaN made NULL still counts
            return type_from_kinds(_kinds_of(self._raw))
        return type_from_kinds(_kinds_of(self._cleaned) | self._string_kinds)


def _kinds_of(types: set[type]) -> set[ColumnType]:
    return {_KIND_OF_TYPE[t] for t in types if t in _KIND_OF_TYPE}


def as_cells(values: list[Any]) -> list[Any]:
    """``values`` as cells (:func:`cell` of each; the same list when they all are already): checked at C speed
    where the values allow, as :func:`clean_column` does."""
    present = set(map(type, values))
    if float in present and present <= _NUMERIC:
        return values if _all_finite(values, has_null=type(None) in present) else list(map(cell, values))
    return values if present <= _SCALARS else list(map(cell, values))


def finish_column(values: list[Any], kind: ColumnType) -> list[Cell]:
    """Raw values of a column typed by :class:`ColumnTyper` as the cells :func:`clean_column` makes of them."""
    values = as_cells(values)
    if kind in ("date", "datetime"):
        return [coerce(value, kind) for value in values]
    return values
