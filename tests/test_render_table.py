"""render_table: a few rows shown as Markdown, from a saved table or from inline rows (no Docker)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sandbox_runtime.errors import InvalidToolArguments, PathNotFound, PathOutsideResults, UnsafeFileType
from sandbox_runtime.policy import Policy, SpillPolicy
from sandbox_runtime.spill.spiller import spill_result
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tools.render_table import (
    RenderTableArgs,
    RenderTableResult,
    markdown_cell,
    render_table,
    render_table_description,
)

MAX_BYTES = 16 * 1024 * 1024


def _render(root: ResultsRoot, **kwargs: Any) -> RenderTableResult:
    return render_table(root, RenderTableArgs.model_validate(kwargs), max_source_bytes=MAX_BYTES)


@pytest.fixture
def spilled(root: ResultsRoot) -> str:
    records = [
        {"id": i, "city": f"City {i}", "day": dt.date(2024, 3, 1) + dt.timedelta(days=i), "score": i / 4 or None}
        for i in range(2_001)
    ]
    outcome = spill_result(
        root, records, tool="sql", call_id="r1", policy=SpillPolicy(), now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    )
    assert outcome.descriptor is not None
    return outcome.descriptor.path


def test_a_few_rows_of_a_saved_table_render_as_markdown_with_chosen_columns(root: ResultsRoot, spilled: str) -> None:
    result = _render(root, source=spilled, columns=["city", "day", "score"], start=0, count=3)

    assert result.markdown == (
        "| city | day | score |\n"
        "| --- | --- | --- |\n"
        "| City 0 | 2024-03-01 |  |\n"
        "| City 1 | 2024-03-02 | 0.25 |\n"
        "| City 2 | 2024-03-03 | 0.5 |\n"
    )
    assert (result.rows, result.columns, result.path) == (3, ["city", "day", "score"], spilled)
    assert result.message == f"Rendered 3 rows \u00d7 3 columns (rows 0 to 2 of 2,001) from {spilled}."


def test_inline_rows_with_columns_render_directly_with_pipes_and_line_breaks_escaped(root: ResultsRoot) -> None:
    result = _render(
        root,
        columns=["name", "note|kind", "n"],
        rows=[["a|b", "line 1\nline 2\r\nline 3", 1], [None, True, {"nested": [1, 2]}]],
    )

    lines = result.markdown.splitlines()
    assert lines[0] == "| name | note\\|kind | n |"
    assert lines[2] == "| a\\|b | line 1<br>line 2<br>line 3 | 1 |"
    assert lines[3] == '|  | true | {"nested":[1,2]} |'
    assert len(lines) == 4
    assert result.path is None


def test_cells_are_shown_as_text_nulls_empty_and_dates_iso() -> None:
    assert markdown_cell(None) == ""
    assert markdown_cell(dt.datetime(2024, 5, 6, 7, 8, 9)) == "2024-05-06T07:08:09"
    assert markdown_cell(dt.date(2024, 5, 6)) == "2024-05-06"
    assert markdown_cell(False) == "false"
    assert markdown_cell(-2.5) == "-2.5"
    assert markdown_cell("x\ry|z") == "x<br>y\\|z"


def test_more_than_2000_rows_are_refused_naming_export_table_and_the_path(root: ResultsRoot, spilled: str) -> None:
    with pytest.raises(InvalidToolArguments) as caught:
        _render(root, source=spilled)

    message = str(caught.value)
    assert "2,001" in message
    assert "2,000 rows" in message
    assert "start and count" in message
    assert "export_table" in message
    assert spilled in message
    assert _render(root, source=spilled, start=1).rows == 2_000  # exactly the cap is fine
    assert _render(root, source=spilled, count=2_000).rows == 2_000


def test_too_many_inline_rows_are_refused_too(root: ResultsRoot) -> None:
    with pytest.raises(InvalidToolArguments, match="2,001 from start=0"):
        _render(root, columns=["n"], rows=[[i] for i in range(2_001)])
    result = render_table(
        root, RenderTableArgs(columns=["n"], rows=[[i] for i in range(30)], start=25), max_source_bytes=1, max_rows=5
    )
    assert result.rows == 5
    assert result.markdown.splitlines()[-1] == "| 29 |"


def test_a_start_past_the_end_says_how_many_rows_there_are(root: ResultsRoot, spilled: str) -> None:
    with pytest.raises(InvalidToolArguments, match=r"start=2,001 is past the end: .* has 2,001 rows"):
        _render(root, source=spilled, start=2_001)
    with pytest.raises(InvalidToolArguments, match="start=3 is past the end: the inline table has 2 rows"):
        _render(root, columns=["n"], rows=[[1], [2]], start=3)


def test_bad_arguments_are_refused_with_the_reason(root: ResultsRoot, results: Path, spilled: str) -> None:
    with pytest.raises(InvalidToolArguments, match="either `source`"):
        _render(root, source=spilled, columns=["id"], rows=[[1]])
    with pytest.raises(InvalidToolArguments, match="either `source`"):
        _render(root, count=1)
    with pytest.raises(InvalidToolArguments, match="need `columns`"):
        _render(root, rows=[[1]])
    with pytest.raises(InvalidToolArguments, match="row 2 has 1 cells, but there are 2 columns"):
        _render(root, columns=["a", "b"], rows=[[1, 2], [3]])
    with pytest.raises(InvalidToolArguments, match=r"no column 'town'.*'city'"):
        _render(root, source=spilled, columns=["town"], count=1)
    with pytest.raises(ValidationError):
        RenderTableArgs.model_validate({"source": spilled, "count": -1})
    (results / "words.txt").write_text("no table here", encoding="utf-8")
    with pytest.raises(InvalidToolArguments, match="not a table"):
        _render(root, source="words.txt")
    with pytest.raises(PathOutsideResults):
        _render(root, source="/etc/passwd")
    with pytest.raises(PathNotFound):
        _render(root, source="spill/gone.table.jsonl")


def test_a_symlinked_source_is_refused(root: ResultsRoot, results: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps([{"secret": 1}]), encoding="utf-8")
    (results / "t.json").symlink_to(outside)
    with pytest.raises(UnsafeFileType):
        _render(root, source="t.json")


def test_csv_and_markdown_files_render_too(root: ResultsRoot, results: Path) -> None:
    (results / "a.csv").write_text("x,y\n1,hello\n2,world\n", encoding="utf-8")
    (results / "b.md").write_text("| k | v |\n|---|---|\n| a | 1 |\n", encoding="utf-8")
    assert _render(root, source="a.csv").markdown.splitlines()[-1] == "| 2 | world |"
    assert _render(root, source="b.md").markdown.splitlines()[-1] == "| a | 1 |"


def test_the_description_names_the_cap_and_export_table() -> None:
    for phrase in ("Markdown", "2,000 rows", "export_table", "start", "count", "columns"):
        assert phrase in render_table_description(Policy())
