"""The CSV and XLSX writers of ``export_table``: rows of cells to a file, with no formula ever made from data.

:func:`open_sheet` gives a :class:`TableSheet` that writes a header and then rows, one at a time, to a file:

* CSV: UTF-8, ISO dates, ``true``/``false``, NULL as an empty field; a text cell a spreadsheet would take for
  a formula gets a leading apostrophe (SECURITY.md): one starting with TAB, CR or LF, or whose first visible
  character is ``= + - @`` once full-width and other compatibility forms are folded (NFKC: the full-width
  U+FF1D is ``=``). Leading white space (spaces, NBSP, ideographic space …) and invisible characters (BOM,
  zero-width space and joiners, bidirectional marks, every other Unicode format or control character, and the
  rest of Unicode's default-ignorable code points) are skipped, as a spreadsheet skips them;
* XLSX: one sheet of typed cells in row order (XlsxWriter's constant-memory mode, its string conversions off,
  so text is always text), the header bold and frozen, and a fixed document date so the same input gives the
  same bytes. Values Excel cannot hold exactly (long integers, dates before 1900, time zones) are written as
  text or in UTC; a datetime whose UTC time is past the range of dates (``9999-12-31T23:00:00-05:00``) as its
  ISO text.

Characters a format cannot hold are replaced with U+FFFD. Every such change is counted in a :class:`CellTally`,
whose :meth:`~CellTally.notes` describe them for the result message.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import re
import unicodedata
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import IO, Any, Literal, Protocol

import xlsxwriter  # type: ignore[import-untyped]  # XlsxWriter ships no py.typed marker

from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.tables.cells import Cell, cell

__all__ = [
    "XLSX_MAX_COLUMNS",
    "XLSX_MAX_DATA_ROWS",
    "CellTally",
    "ExportFormat",
    "TableSheet",
    "formula_like",
    "open_sheet",
    "plural",
]

ExportFormat = Literal["csv", "xlsx"]
XLSX_MAX_DATA_ROWS = 1_048_575  # Excel's 1,048,576 rows per sheet, less the header
XLSX_MAX_COLUMNS = 16_384
_XLSX_MAX_CHARS = 32_767  # characters in one Excel cell
_XLSX_MAX_EXACT_INT = 10**15  # Excel keeps 15 significant digits; larger integers are written as text
_XLSX_FIRST_YEAR = 1900  # Excel shows earlier dates as ####; they are written as ISO text
_XLSX_CREATED = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)  # fixed document date: the same input gives the same bytes
_XLSX_OPTIONS = {
    "constant_memory": True,
    "strings_to_formulas": False,
    "strings_to_urls": False,
    "strings_to_numbers": False,
}
_FORMULA_CHARS = frozenset("=+-@")  # what a formula starts with, once what precedes it is skipped and folded
_BREAKS_FIRST = ("\t", "\r", "\n")  # a cell starting with these is guarded as it is
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})  # controls, format characters, separators
# Unicode's default-ignorable code points outside those categories (DerivedCoreProperties.txt): the combining
# grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian variation selectors, variation selectors
_IGNORABLE = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]")
_SAFE_FIRST = frozenset(map(chr, range(0x21, 0x7F))) - _FORMULA_CHARS  # visible ASCII that starts no formula
_FOLD_CHARS = 8  # characters folded (NFKC) to read the first visible one: enough for any composition
_CSV_LONG_CHARS = 1 << 16  # a row with a text cell this long is written field by field
_CSV_QUOTED = re.compile('[,"\r\n]')  # what makes the csv module quote a field (excel dialect, QUOTE_MINIMAL)
_CSV_AS_IS = frozenset({int, type(None), dt.date})  # the csv module writes these right: 12, empty, 2026-01-31
_SURROGATES = re.compile("[\ud800-\udfff]")
_XLSX_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")  # C0 controls but TAB/LF/CR


def plural(count: int, unit: str) -> str:
    """``count`` with thousands separators and ``unit``, plural unless it is 1: ``1 row``, ``1,200 rows``."""
    return f"{count:,} {unit}{'s' * (count != 1)}"


@dataclass
class CellTally:
    """What the writers changed, for the message."""

    guarded: int = 0
    replaced: int = 0
    cut: int = 0
    long_numbers: int = 0
    early_dates: int = 0
    zoned: int = 0
    beyond_range: int = 0

    def notes(self) -> list[str]:
        found = [
            (self.replaced, "character", "the format cannot hold replaced with U+FFFD"),
            (self.cut, "text cell", f"cut to {_XLSX_MAX_CHARS:,} characters (Excel's cell limit)"),
            (self.long_numbers, "integer", "of 16 or more digits written as text (Excel keeps 15 digits)"),
            (self.early_dates, "date", f"before {_XLSX_FIRST_YEAR} written as ISO text (Excel has no earlier dates)"),
            (self.zoned, "datetime", "with a time zone written in UTC (Excel has no time zones)"),
            (self.beyond_range, "datetime", "whose UTC time is past the range of dates written as ISO text"),
        ]
        return [f"{plural(count, unit)} {what}" for count, unit, what in found if count]


def _invisible(char: str) -> bool:
    return char.isspace() or unicodedata.category(char) in _INVISIBLE_CATEGORIES or _IGNORABLE.match(char) is not None


def formula_like(text: str) -> bool:
    """Whether a spreadsheet opening ``text`` as a CSV cell could take it for a formula: it starts with TAB, CR
    or LF, or its first visible character, folded with NFKC, is ``= + - @``."""
    if text.startswith(_BREAKS_FIRST):
        return True
    for index, char in enumerate(text):
        if not _invisible(char):
            return unicodedata.normalize("NFKC", text[index : index + _FOLD_CHARS])[:1] in _FORMULA_CHARS
    return False


def _safe_text(value: object, tally: CellTally, *, xlsx: bool) -> str:
    """A text cell made safe: never a formula (CSV: a leading apostrophe; XLSX: text all the same), characters
    the format cannot hold replaced (lone surrogates; in XLSX also C0 controls but TAB/LF/CR), XLSX's cap kept."""
    text = value if isinstance(value, str) else str(cell(value))
    guard = formula_like(text)
    tally.guarded += guard
    unsafe = _XLSX_UNSAFE if xlsx else _SURROGATES
    if unsafe.search(text):
        text, replaced = unsafe.subn("\ufffd", text)
        tally.replaced += replaced
    if xlsx and len(text) > _XLSX_MAX_CHARS:
        text = text[:_XLSX_MAX_CHARS]
        tally.cut += 1
    return "'" + text if guard and not xlsx else text


class TableSheet(Protocol):
    """Where the rows go: the header first, then every row in order."""

    def header(self, names: Sequence[str]) -> None: ...

    def write(self, row: Sequence[Cell]) -> None: ...


class _CsvSheet:
    """UTF-8 CSV: a header line, ISO dates, ``true``/``false``, NULL as an empty field, formulas guarded.

    A row with a long cell (64 Ki characters or more) is written field by field, quoted as the csv module quotes
    (``QUOTE_MINIMAL``): the csv module builds a whole row in a buffer of 4 bytes a character, six times the row,
    which for a row at the line cap would be ~100 MB."""

    def __init__(self, file: IO[str], tally: CellTally) -> None:
        self._file = file
        self._csv = csv.writer(file)
        self._tally = tally
        self._long = False  # the row being written has a long cell

    def header(self, names: Sequence[str]) -> None:
        self._csv.writerow([_safe_text(name, self._tally, xlsx=False) for name in names])

    def write(self, row: Sequence[Cell]) -> None:
        # the common cells pass as they are: integers, NULL, finite floats (the csv module writes repr), and
        # short text whose first character is visible ASCII other than = + - @, holding no lone surrogate
        cells = [
            value
            if type(value) in _CSV_AS_IS
            or (type(value) is float and value - value == 0.0)
            or (
                type(value) is str
                and value[:1] in _SAFE_FIRST
                and len(value) < _CSV_LONG_CHARS
                and (value.isascii() or not _SURROGATES.search(value))
            )
            else self._cell(value)
            for value in row
        ]
        if self._long:
            self._long = False
            self._write_fields(cells)
        else:
            self._csv.writerow(cells)

    def _write_fields(self, cells: Sequence[object]) -> None:
        """One row written a field at a time, as ``csv.writer`` (excel dialect) writes it."""
        texts = ["" if value is None else value if isinstance(value, str) else str(value) for value in cells]
        if texts == [""]:
            self._file.write('""\r\n')  # a row of one empty field, told apart from an empty line
            return
        for index, text in enumerate(texts):
            if index:
                self._file.write(",")
            if _CSV_QUOTED.search(text):
                self._file.write('"')
                self._file.write(text.replace('"', '""'))
                self._file.write('"')
            else:
                self._file.write(text)
        self._file.write("\r\n")

    def _cell(self, value: Cell) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else ""
        if isinstance(value, int):
            return str(value)
        if isinstance(value, dt.date):
            return value.isoformat()
        self._long = self._long or len(value) >= _CSV_LONG_CHARS
        return _safe_text(value, self._tally, xlsx=False)


class _XlsxSheet:
    """One sheet of typed cells in row order (XlsxWriter's constant-memory mode), the header bold and frozen."""

    def __init__(self, book: Any, tally: CellTally) -> None:
        self._sheet = book.add_worksheet()
        self._bold = book.add_format({"bold": True})
        self._date = book.add_format({"num_format": "yyyy-mm-dd"})
        self._datetime = book.add_format({"num_format": "yyyy-mm-dd hh:mm:ss"})
        self._tally = tally
        self._row = 0

    def header(self, names: Sequence[str]) -> None:
        self._sheet.freeze_panes(1, 0)
        for column, name in enumerate(names):
            self._sheet.write_string(0, column, _safe_text(name, self._tally, xlsx=True), self._bold)
        self._row = 1

    def write(self, row: Sequence[Cell]) -> None:
        if self._row > XLSX_MAX_DATA_ROWS:
            raise InvalidToolArguments(
                f"export_table: the source grew past {XLSX_MAX_DATA_ROWS:,} rows while it was read, more than an "
                "XLSX sheet holds; export parts with start/count, or use format csv"
            )
        sheet, at = self._sheet, self._row
        for column, value in enumerate(row):
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                continue  # NULL is a blank cell
            if isinstance(value, bool):
                sheet.write_boolean(at, column, value)
            elif isinstance(value, int) and abs(value) >= _XLSX_MAX_EXACT_INT:
                self._tally.long_numbers += 1
                sheet.write_string(at, column, str(value))
            elif isinstance(value, int | float):
                sheet.write_number(at, column, value)
            elif isinstance(value, dt.date):
                self._write_date(at, column, value)
            else:
                sheet.write_string(at, column, _safe_text(value, self._tally, xlsx=True))
        self._row += 1

    def _write_date(self, at: int, column: int, value: dt.date) -> None:
        if isinstance(value, dt.datetime):
            if value.utcoffset() is not None:
                try:
                    value = value.astimezone(dt.UTC)
                except OverflowError:  # its UTC time is before year 1 or after year 9999
                    self._tally.beyond_range += 1
                    self._sheet.write_string(at, column, value.isoformat())
                    return
                self._tally.zoned += 1
            value = value.replace(tzinfo=None)
        if value.year < _XLSX_FIRST_YEAR:
            self._tally.early_dates += 1
            self._sheet.write_string(at, column, value.isoformat())
            return
        style = self._datetime if isinstance(value, dt.datetime) else self._date
        self._sheet.write_datetime(at, column, value, style)


@contextmanager
def open_sheet(fmt: ExportFormat, path: str, work: str, tally: CellTally) -> Iterator[TableSheet]:
    """A sheet writing ``path`` (XLSX temporary files go to ``work``); the file is complete once the context ends
    without an error. Cells changed on the way (guarded, replaced, cut, written as text) are counted in ``tally``."""
    if fmt == "csv":
        with open(path, "w", encoding="utf-8", newline="") as file:
            yield _CsvSheet(file, tally)
        return
    book = xlsxwriter.Workbook(path, {**_XLSX_OPTIONS, "tmpdir": work})
    book.set_properties({"created": _XLSX_CREATED})
    try:
        yield _XlsxSheet(book, tally)
    except BaseException:
        with suppress(Exception):
            book.close()  # closes its temporary files; the partial file is discarded with the folder
        raise
    book.close()
