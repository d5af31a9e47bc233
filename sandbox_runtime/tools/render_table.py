"""``render_table``: a few rows of a table shown to the user as Markdown, from a path or from inline rows.

It is for showing, not for moving data, and bounds what it returns (it is never spilled or budgeted):

* at most ``max_rows`` rows (``tools.render_rows_max``, 2,000 by default): a larger range is refused with the way
  out — show only the rows needed (``start``/``count``) and build a file of the full set with ``export_table``
  from the path;
* at most ``max_cell_chars`` characters of a cell (``tools.render_cell_max_chars``, 500): the rest is cut and a
  marker says how many characters were left out;
* at most ``max_chars`` characters in all (``tools.render_max_chars``, 100,000): once the next row would not fit,
  no more rows are added (nor read) and a marker after the table names the rows shown and the next step
  (``start`` for the next rows, or ``export_table`` from the path).

The source is read with :func:`~sandbox_runtime.tables.source.open_table` within its line, cell and nesting
caps (a table file is streamed; reading stops after the range). Cells: ``|`` is escaped, line breaks become
``<br>``, NULL is empty, dates are ISO.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.policy import Policy
from sandbox_runtime.store.safe_paths import ResultsRoot, display_name
from sandbox_runtime.tables.cells import Cell, cell
from sandbox_runtime.tables.source import TableLimits, open_table, select_columns

__all__ = [
    "DEFAULT_MAX_CELL_CHARS",
    "DEFAULT_MAX_CHARS",
    "DEFAULT_MAX_ROWS",
    "RenderTableArgs",
    "RenderTableResult",
    "markdown_cell",
    "render_table",
    "render_table_description",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 2000
DEFAULT_MAX_CELL_CHARS = 500
DEFAULT_MAX_CHARS = 100_000
_HEADER_ROOM_CHARS = 1000  # what the header may leave at least: the marker and a row
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def render_table_description(policy: Policy) -> str:
    """What the model is told of ``render_table``, with the policy's row cap."""
    return (
        "Show a table to the user as Markdown: give `source` (the path of a saved result or a table file) or inline "
        "`rows` (a list of lists) with `columns` (their names). With a source, `columns` picks and orders columns. "
        f"`start` (0-based) and `count` choose the rows; at most {policy.tools.render_rows_max:,} rows are rendered, "
        "long cells are cut and a long table stops at a marker saying which rows it shows. To hand over more rows, "
        "build a CSV or XLSX file with export_table from the path instead."
    )


class RenderTableArgs(BaseModel):
    """Arguments of ``render_table``: ``source`` or ``rows`` with ``columns``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str | None = Field(None, description="The table's path in the results folder.")
    rows: list[list[Any]] | None = Field(None, description="Inline rows (lists of cells); needs `columns`.")
    columns: list[str] | None = Field(
        None, min_length=1, description="With `source`: the columns to show, in order. With `rows`: their names."
    )
    start: int = Field(0, ge=0, description="First row to show, 0-based (default 0).")
    count: int | None = Field(None, ge=0, description="Most rows to show (default: all from start, up to 2,000).")


class RenderTableResult(BaseModel):
    """The Markdown table and what it shows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    markdown: str
    rows: int
    columns: list[str]
    path: str | None = None
    cut_cells: int = 0
    stopped_at_chars: bool = False  # rows of the range were left out to keep within the character cap
    next_start: int | None = None  # where the rows left out begin
    message: str


def render_table(
    root: ResultsRoot,
    args: RenderTableArgs,
    *,
    max_source_bytes: int,
    max_table_file_bytes: int | None = None,
    max_rows: int = DEFAULT_MAX_ROWS,
    max_cell_chars: int = DEFAULT_MAX_CELL_CHARS,
    max_chars: int = DEFAULT_MAX_CHARS,
    limits: TableLimits | None = None,
) -> RenderTableResult:
    """Render rows ``start`` … ``start + count - 1`` of the source (or of the inline rows) as a Markdown table of
    at most ``max_chars`` characters, each cell cut at ``max_cell_chars``; ``limits`` caps the source's lines,
    cells and nesting (default: the policy's defaults).

    Raises :class:`InvalidToolArguments` when the range holds more than ``max_rows`` rows, ``start`` is past
    the end, the header alone would fill the character cap, or the arguments do not name exactly one table.
    """
    if min(max_rows, max_cell_chars, max_chars) < 1:
        raise ValueError("max_rows, max_cell_chars and max_chars must be >= 1")
    if (args.source is None) == (args.rows is None):
        raise InvalidToolArguments("render_table: give either `source` (a path) or `rows` with `columns`, not both")
    caps = _Caps(max_rows, max_cell_chars, max_chars)
    if args.source is None:
        return _render_inline(args, caps)
    with open_table(
        root, args.source, max_bytes=max_source_bytes, max_stream_bytes=max_table_file_bytes, limits=limits
    ) as source:
        shown = display_name(source.path)
        names = list(args.columns) if args.columns is not None else list(source.columns)
        positions = select_columns(source, names, tool="render_table")
        rows = ([row[i] for i in positions] for row in source.rows)
        hint = _export_hint(source.path)
        drawn = _draw(names, rows, args, caps, source.row_count, shown, export_hint=hint)
    return _result(drawn, args, source.row_count, source.path, f"from {shown}")


@dataclass(frozen=True)
class _Caps:
    rows: int
    cell_chars: int
    chars: int


def _render_inline(args: RenderTableArgs, caps: _Caps) -> RenderTableResult:
    if args.columns is None or args.rows is None:
        raise InvalidToolArguments("render_table: inline `rows` need `columns` (the names of their cells)")
    width = len(args.columns)
    for number, row in enumerate(args.rows, start=1):
        if len(row) != width:
            raise InvalidToolArguments(
                f"render_table: row {number:,} has {len(row):,} cells, but there are {width:,} columns"
            )
    hint = (
        "to hand over all of them, write them to a file in the results folder with run_python and build a CSV "
        "with export_table from that path"
    )
    rows = ([cell(value) for value in row] for row in args.rows)
    drawn = _draw(list(args.columns), rows, args, caps, len(args.rows), "the inline table", export_hint=hint)
    return _result(drawn, args, len(args.rows), None, "from the inline rows")


def _export_hint(path: str) -> str:
    return (
        f"to hand over the full set, build a CSV of it with export_table "
        f'{{"source": "{display_name(path)}", "format": "csv"}} instead of rendering it'
    )


@dataclass
class _Drawn:
    """The lines drawn so far: the header and rule, then one line per row."""

    columns: list[str]
    lines: list[str]
    cell_chars: int
    rows: int = 0
    cut: int = 0
    stopped: bool = False
    marker: str = ""

    @property
    def chars(self) -> int:
        return sum(map(len, self.lines)) + len(self.lines)  # each line and its newline


def _draw(
    columns: list[str],
    rows: Iterator[list[Cell]],
    args: RenderTableArgs,
    caps: _Caps,
    total: int,
    shown: str,
    *,
    export_hint: str,
) -> _Drawn:
    """The rows of the range drawn as Markdown lines until the character cap; refused before reading when the
    range holds more than ``caps.rows`` rows."""
    in_range = max(0, total - args.start) if args.count is None else min(max(0, total - args.start), args.count)
    too_many = InvalidToolArguments(
        f"render_table: the rows asked for ({in_range:,} from start={args.start:,}) of {shown} are more than the "
        f"{caps.rows:,} rows render_table shows. Show only the rows the user needs (set start and count, e.g. "
        f"count=50); {export_hint}"
    )
    if in_range > caps.rows:
        raise too_many
    if args.start > 0 and args.start >= total:
        raise InvalidToolArguments(
            f"render_table: start={args.start:,} is past the end: {shown} has {total:,} "
            f"row{'s' * (total != 1)} (start counts from 0)"
        )
    drawn = _Drawn(columns, [], caps.cell_chars)
    header = [_cut(markdown_text(name), caps.cell_chars, drawn) for name in columns]
    drawn.lines = [_line(map(_escape, header)), _line("---" for _ in columns)]
    room = caps.chars - drawn.chars
    if room < min(_HEADER_ROOM_CHARS, caps.chars // 2):
        raise InvalidToolArguments(
            f"render_table: the header of {len(columns):,} columns alone is {drawn.chars:,} characters, too close "
            f"to the {caps.chars:,} characters render_table returns; choose fewer columns with `columns`, or "
            f"{export_hint}"
        )
    stop = args.start + min(caps.rows + 1, in_range if args.count is not None else caps.rows + 1)
    for row in itertools.islice(rows, args.start, stop):
        if drawn.rows >= caps.rows:  # the file grew since it was counted
            raise too_many
        line = _line(_escape(_cut(markdown_text(value), caps.cell_chars, drawn)) for value in row)
        if len(line) + 1 > room:
            drawn.stopped = True
            break
        drawn.lines.append(line)
        drawn.rows += 1
        room -= len(line) + 1
    if drawn.stopped:
        _mark_stop(drawn, args, in_range, caps, export_hint)
    return drawn


def _mark_stop(drawn: _Drawn, args: RenderTableArgs, in_range: int, caps: _Caps, export_hint: str) -> None:
    """The marker after a table stopped at the character cap; rows give way until it fits too."""
    while True:
        shown = f"rows {args.start:,} to {args.start + drawn.rows - 1:,}" if drawn.rows else "no rows"
        drawn.marker = (
            f"[render_table stopped at its cap of {caps.chars:,} characters: shown are {shown} ({drawn.rows:,} of "
            f"the {in_range:,} rows asked for). Show the next rows with start={args.start + drawn.rows}, or "
            f"{export_hint}.]"
        )
        if drawn.rows == 0 or drawn.chars + 1 + len(drawn.marker) <= caps.chars:
            return
        drawn.lines.pop()
        drawn.rows -= 1


def markdown_text(value: Cell) -> str:
    """A cell's text before escaping: NULL empty, ISO dates, ``true``/``false``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def _cut(text: str, max_chars: int, drawn: _Drawn) -> str:
    if len(text) <= max_chars:
        return text
    drawn.cut += 1
    return f"{text[:max_chars]}…[{len(text) - max_chars:,} more characters]"


def _escape(text: str) -> str:
    return _LINE_BREAK.sub("<br>", text.replace("|", "\\|"))


def markdown_cell(value: Cell) -> str:
    """One cell as Markdown table text: NULL empty, ISO dates, ``true``/``false``, ``|`` escaped, breaks as
    ``<br>`` (whole; :func:`render_table` cuts long cells first)."""
    return _escape(markdown_text(value))


def _line(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _result(drawn: _Drawn, args: RenderTableArgs, total: int, path: str | None, origin: str) -> RenderTableResult:
    rows, columns = drawn.rows, drawn.columns
    span = f"rows {args.start:,} to {args.start + rows - 1:,}" if rows else "no rows"
    size = f"{rows:,} row{'s' * (rows != 1)} \u00d7 {len(columns):,} column{'s' * (len(columns) != 1)}"
    notes = ""
    if drawn.cut:
        notes += f"; {drawn.cut:,} cell{'s' * (drawn.cut != 1)} cut to {drawn.cell_chars:,} characters"
    if drawn.stopped:
        notes += f"; stopped at the character cap, the next rows start at start={args.start + rows}"
    message = f"Rendered {size} ({span} of {total:,}) {origin}{notes}."
    logger.debug("render_table %s: %d rows", path or "inline rows", rows)
    markdown = "\n".join(drawn.lines) + "\n" + (f"\n{drawn.marker}\n" if drawn.marker else "")
    return RenderTableResult(
        markdown=markdown,
        rows=rows,
        columns=list(columns),
        path=path,
        cut_cells=drawn.cut,
        stopped_at_chars=drawn.stopped,
        next_start=args.start + rows if drawn.stopped else None,
        message=message,
    )
