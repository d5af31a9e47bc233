"""``render_table``: a few rows of a table shown to the user as Markdown, from a path or from inline rows.

It is for showing, not for moving data: at most ``max_rows`` rows (2,000 by default) are rendered. A larger
range is refused with the way out — show only the rows needed (``start``/``count``) and build a file of the full
set with ``export_table`` from the path. The source is read with
:func:`~sandbox_runtime.tools.table_source.open_table` (a table file is streamed; reading stops after the range).
Cells: ``|`` is escaped, line breaks become ``<br>``, NULL is empty, dates are ISO.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.spill.cells import Cell, cell
from sandbox_runtime.store.safe_paths import ResultsRoot, display_name
from sandbox_runtime.tools.table_source import open_table, select_columns

__all__ = [
    "DEFAULT_MAX_ROWS",
    "RENDER_TABLE_DESCRIPTION",
    "RenderTableArgs",
    "RenderTableResult",
    "markdown_cell",
    "render_table",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 2000
_LINE_BREAK = re.compile(r"\r\n|\r|\n")

RENDER_TABLE_DESCRIPTION = (
    "Show a table to the user as Markdown: give `source` (the path of a saved result or a table file) or inline "
    "`rows` (a list of lists) with `columns` (their names). With a source, `columns` picks and orders columns. "
    "`start` (0-based) and `count` choose the rows; at most 2,000 rows are rendered. To hand over more rows, "
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
    message: str


def render_table(
    root: ResultsRoot,
    args: RenderTableArgs,
    *,
    max_source_bytes: int,
    max_table_file_bytes: int | None = None,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> RenderTableResult:
    """Render rows ``start`` … ``start + count - 1`` of the source (or of the inline rows) as a Markdown table.

    Raises :class:`InvalidToolArguments` when the range holds more than ``max_rows`` rows, ``start`` is past
    the end, or the arguments do not name exactly one table.
    """
    if max_rows < 1:
        raise ValueError("max_rows must be >= 1")
    if (args.source is None) == (args.rows is None):
        raise InvalidToolArguments("render_table: give either `source` (a path) or `rows` with `columns`, not both")
    if args.source is None:
        return _render_inline(args, max_rows)
    with open_table(root, args.source, max_bytes=max_source_bytes, max_stream_bytes=max_table_file_bytes) as source:
        shown = display_name(source.path)
        names = list(args.columns) if args.columns is not None else list(source.columns)
        positions = select_columns(source, names, tool="render_table")
        rows = ([row[i] for i in positions] for row in source.rows)
        hint = _export_hint(source.path)
        taken = _take(rows, args, max_rows, source.row_count, shown, export_hint=hint)
    return _result(names, taken, args, source.row_count, source.path, f"from {shown}")


def _render_inline(args: RenderTableArgs, max_rows: int) -> RenderTableResult:
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
    taken = _take(rows, args, max_rows, len(args.rows), "the inline table", export_hint=hint)
    return _result(list(args.columns), taken, args, len(args.rows), None, "from the inline rows")


def _export_hint(path: str) -> str:
    return (
        f"to hand over the full set, build a CSV of it with export_table "
        f'{{"source": "{display_name(path)}", "format": "csv"}} instead of rendering it'
    )


def _take(
    rows: Iterator[list[Cell]], args: RenderTableArgs, max_rows: int, total: int, shown: str, *, export_hint: str
) -> list[list[Cell]]:
    """The rows of the range; refused before reading when it holds more than ``max_rows`` rows."""
    in_range = max(0, total - args.start) if args.count is None else min(max(0, total - args.start), args.count)
    too_many = InvalidToolArguments(
        f"render_table: the rows asked for ({in_range:,} from start={args.start:,}) of {shown} are more than the "
        f"{max_rows:,} rows render_table shows. Show only the rows the user needs (set start and count, e.g. "
        f"count=50); {export_hint}"
    )
    if in_range > max_rows:
        raise too_many
    if args.start > 0 and args.start >= total:
        raise InvalidToolArguments(
            f"render_table: start={args.start:,} is past the end: {shown} has {total:,} "
            f"row{'s' * (total != 1)} (start counts from 0)"
        )
    stop = None if args.count is None else args.start + args.count
    taken = list(itertools.islice(rows, args.start, None if stop is None else min(stop, args.start + max_rows + 1)))
    if len(taken) > max_rows:  # the file grew since it was counted
        raise too_many
    return taken


def markdown_cell(value: Cell) -> str:
    """One cell as Markdown table text: NULL empty, ISO dates, ``true``/``false``, ``|`` escaped, breaks as
    ``<br>``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = value.isoformat() if isinstance(value, dt.date) else str(value)
    return _LINE_BREAK.sub("<br>", text.replace("|", "\\|"))


def _line(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _result(
    columns: Sequence[str],
    rows: list[list[Cell]],
    args: RenderTableArgs,
    total: int,
    path: str | None,
    origin: str,
) -> RenderTableResult:
    lines = [_line(map(markdown_cell, columns)), _line("---" for _ in columns)]
    lines.extend(_line(map(markdown_cell, row)) for row in rows)
    span = f"rows {args.start:,} to {args.start + len(rows) - 1:,}" if rows else "no rows"
    size = f"{len(rows):,} row{'s' * (len(rows) != 1)} \u00d7 {len(columns):,} column{'s' * (len(columns) != 1)}"
    message = f"Rendered {size} ({span} of {total:,}) {origin}."
    logger.debug("render_table %s: %d rows", path or "inline rows", len(rows))
    return RenderTableResult(
        markdown="\n".join(lines) + "\n", rows=len(rows), columns=list(columns), path=path, message=message
    )
