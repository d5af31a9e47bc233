"""Issue 12: what the sandbox writes cannot push the host's table readers off their bounds.

Every host-side reader of a table file keeps a line cap, a cell cap and a nesting cap and holds no file whole as
Python objects; render_table bounds its characters; the CSV formula guard judges what a spreadsheet would see;
dates at the edge of the range export and sort. Real files in a results folder, and real Docker where the
tool path needs it.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import itertools
import json
import random
import re
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import openpyxl
import pytest

from sandbox_runtime import Runtime
from sandbox_runtime.errors import BadTableFile, FileTooLarge, InvalidToolArguments
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tables import sort as table_sort
from sandbox_runtime.tables import writers as table_writers
from sandbox_runtime.tables.cells import ColumnTyper, clean_column, finish_column
from sandbox_runtime.tables.source import TableLimits, open_table, sort_key, sort_rows
from sandbox_runtime.tables.table import Table, header_line, recognise_table, row_line
from sandbox_runtime.tables.writers import formula_like
from sandbox_runtime.tools.export_table import ExportResult, ExportTableArgs, export_table
from sandbox_runtime.tools.render_table import RenderTableArgs, RenderTableResult, render_table

MAX_BYTES = 64 * 1024 * 1024
MiB = 1024 * 1024
SMALL = TableLimits(line_max_bytes=1000, cell_max_chars=100, nesting_max=8)


def _export(root: ResultsRoot, limits: TableLimits | None = None, **kwargs: Any) -> ExportResult:
    args = ExportTableArgs.model_validate({"format": "csv", **kwargs})
    return export_table(root, args, max_source_bytes=MAX_BYTES, max_table_file_bytes=1 << 30, limits=limits)


def _render(root: ResultsRoot, limits: TableLimits | None = None, **kwargs: Any) -> RenderTableResult:
    args = RenderTableArgs.model_validate(kwargs)
    return render_table(root, args, max_source_bytes=MAX_BYTES, max_table_file_bytes=1 << 30, limits=limits)


def _host(results: Path, path: str) -> Path:
    return results / path.removeprefix("/mnt/results/")


def _csv_rows(path: Path) -> list[list[str]]:
    with path.open(encoding="utf-8", newline="") as file:
        return list(csv.reader(file))


def _table_file(results: Path, name: str, columns: list[str], types: list[Any], rows: list[list[Any]]) -> str:
    (results / name).write_bytes(header_line(columns, types).encode() + b"".join(map(row_line, rows)))
    return name


def _nested(depth: int) -> object:
    """A value whose lists nest ``depth`` levels (0: a scalar)."""
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def _nested_text(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


# line and cell caps ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [998, 999, 1000, 1001, 1002, 5000])
def test_a_line_is_accepted_up_to_the_line_cap_and_past_it_is_a_tool_error_naming_the_line_and_the_cap(
    root: ResultsRoot, results: Path, size: int
) -> None:
    row = '[1,"' + "x" * (size - 6) + '"]'  # exactly `size` bytes without its line break
    assert len(row) == size
    (results / "t.table.jsonl").write_text(header_line(["n", "s"], ["integer", "string"]) + '[0,"a"]\n' + row + "\n")
    (results / "t.csv").write_text('n,s\n0,a\n1,"' + "x" * (size - 4) + '"\n')
    limits = TableLimits(line_max_bytes=1000, cell_max_chars=10_000)
    for source in ("t.table.jsonl", "t.csv"):
        if size <= 1000:
            assert _export(root, limits, source=source).rows == 2
            assert _render(root, limits, source=source).rows == 2
            continue
        for tool in (_export, _render):
            with pytest.raises(BadTableFile, match=r"line 3 is .*longer than the cap of 1,000 bytes") as caught:
                tool(root, limits, source=source)
            assert "tools.table_line_max_bytes" in str(caught.value)


@pytest.mark.parametrize("ending", ["\n", "\r\n", ""])
@pytest.mark.parametrize("size", [299_999, 300_000, 300_001])
def test_a_line_longer_than_a_read_chunk_is_measured_against_the_cap_with_any_line_ending(
    root: ResultsRoot, results: Path, size: int, ending: str
) -> None:
    row = '[1,"' + "x" * (size - 6) + '"]'
    text = header_line(["n", "s"], ["integer", "string"]).replace("\n", ending or "\n") + row + ending
    (results / "t.table.jsonl").write_bytes(text.encode())
    limits = TableLimits(line_max_bytes=300_000, cell_max_chars=300_000)
    if size <= 300_000:
        with open_table(root, "t.table.jsonl", max_bytes=MAX_BYTES, limits=limits) as source:
            assert [row[0] for row in source.rows] == [1]
        return
    with pytest.raises(BadTableFile, match="line 2 is longer than the cap of 300,000 bytes"):
        _export(root, limits, source="t.table.jsonl")


def test_a_cell_of_150_mib_is_a_tool_error_naming_the_cap_in_a_table_file_and_in_csv(
    root: ResultsRoot, results: Path
) -> None:
    cell = "x" * (150 * MiB)
    _table_file(results, "huge.table.jsonl", ["id", "text"], ["integer", "string"], [[1, cell], [2, "short"]])
    (results / "huge.csv").write_text(f"id,text\n1,{cell}\n2,short\n")
    del cell
    for source in ("huge.table.jsonl", "huge.csv"):
        for tool in (_export, _render):
            with pytest.raises(BadTableFile, match=r"line 2 is longer than the cap of 16,777,216 bytes"):
                tool(root, source=source)
    assert not (results / "exports").exists()


@pytest.mark.parametrize("chars", [99, 100, 101, 400])
def test_a_cell_is_accepted_up_to_the_cell_cap_in_every_format(root: ResultsRoot, results: Path, chars: int) -> None:
    text = "y" * chars
    _table_file(results, "t.table.jsonl", ["n", "s"], ["integer", "string"], [[1, text]])
    (results / "t.csv").write_text(f"n,s\n1,{text}\n")
    (results / "t.tsv").write_text(f"n\ts\n1\t{text}\n")
    (results / "t.md").write_text(f"| n | s |\n|---|---|\n| 1 | {text} |\n")
    (results / "records.json").write_text(json.dumps([{"n": 1, "s": text}]))
    (results / "rows.json").write_text(json.dumps({"columns": ["n", "s"], "rows": [[1, text]]}))
    (results / "nested.table.jsonl").write_text(header_line(["n", "s"], ["integer", "string"]) + f'[1,["{text}"]]\n')
    limits = TableLimits(line_max_bytes=10_000, cell_max_chars=100)
    for source in ("t.table.jsonl", "t.csv", "t.tsv", "t.md", "records.json", "rows.json", "nested.table.jsonl"):
        longest = chars + 4 * (source == "nested.table.jsonl")  # a nested cell is its JSON text: ["..."]
        if longest <= 100:
            assert _export(root, limits, source=source).rows == 1, source
            continue
        with pytest.raises(BadTableFile, match=rf"a cell of {longest:,} characters.*cap of 100 characters") as caught:
            _export(root, limits, source=source)
        assert "tools.table_cell_max_chars" in str(caught.value)


def test_a_quoted_csv_field_spread_over_many_lines_is_held_to_the_line_cap_as_one_record(
    root: ResultsRoot, results: Path
) -> None:
    lines = "\n".join("z" * 50 for _ in range(100))
    (results / "t.csv").write_text(f'a,b\n1,"{lines}"\n2,x\n')
    with pytest.raises(BadTableFile, match="the record starting on line 2 is longer than the cap of 1,000 bytes"):
        _export(root, TableLimits(line_max_bytes=1000), source="t.csv")
    result = _export(root, TableLimits(line_max_bytes=10_000), source="t.csv")
    assert _csv_rows(_host(results, result.path))[1] == ["1", lines]


def test_a_csv_field_past_pythons_csv_limit_is_a_tool_error_naming_that_limit(root: ResultsRoot, results: Path) -> None:
    (results / "t.csv").write_text("a,b\n1," + "w" * (csv.field_size_limit() + 1) + "\n")
    with pytest.raises(BadTableFile, match=r"line 2 has a field longer than 131,072 characters \(Python's csv"):
        _export(root, source="t.csv")


def test_a_whole_json_row_past_the_line_cap_is_a_tool_error(root: ResultsRoot, results: Path) -> None:
    (results / "records.json").write_text(json.dumps([{"a": 1}, {"a": "q" * 2000}]))
    (results / "rows.json").write_text(json.dumps({"columns": ["a"], "rows": [[1], ["q" * 2000]]}))
    for source in ("records.json", "rows.json"):
        with pytest.raises(BadTableFile, match=r"is 2,0\d\d bytes, longer than the cap of 1,000 bytes"):
            _export(root, TableLimits(line_max_bytes=1000), source=source)


# nesting --------------------------------------------------------------------------------------------------
DEPTHS = [*range(1, 72), 200, 998, 999, 1000, 1001, 1024, 5000, 100_000]


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_nested_cell_at_every_depth_exports_as_json_text_or_is_a_tool_error_naming_the_nesting_cap(
    root: ResultsRoot, results: Path, depth: int
) -> None:
    cell = _nested_text(depth)
    (results / "t.table.jsonl").write_text(header_line(["n", "v"], ["integer", "string"]) + f"[1,{cell}]\n")
    (results / "records.json").write_text(f'[{{"n": 1, "v": {cell}}}]')
    (results / "rows.json").write_text(f'{{"columns": ["n", "v"], "rows": [[1, {cell}]]}}')
    for source, levels in (("t.table.jsonl", depth + 1), ("records.json", depth + 2), ("rows.json", depth + 3)):
        if levels <= 64:
            result = _export(root, source=source)
            value = _csv_rows(_host(results, result.path))[1][1]
            assert json.loads(value) == _nested(depth), source
            continue
        for tool in (_export, _render):
            with pytest.raises(BadTableFile, match=r"deeper than the cap of 64 levels.*tools\.json_nesting_max"):
                tool(root, source=source)


def test_a_table_file_header_nested_past_the_parser_is_a_tool_error(root: ResultsRoot, results: Path) -> None:
    (results / "t.table.jsonl").write_text('{"columns": ' + _nested_text(100_000) + "}\n[1]\n")
    with pytest.raises(BadTableFile, match="line 1: not a JSON header object"):
        _export(root, source="t.table.jsonl")


def test_a_json_object_nested_past_the_parser_outside_rows_is_a_tool_error(root: ResultsRoot, results: Path) -> None:
    (results / "t.json").write_text('{"columns": ["a"], "rows": [[1]], "extra": ' + _nested_text(100_000) + "}")
    with pytest.raises(BadTableFile, match="deeper than the JSON parser goes"):
        _export(root, source="t.json")


# memory ---------------------------------------------------------------------------------------------------
_MEASURE = """
import json, sys
from sandbox_runtime.errors import ToolFailure
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tools.export_table import ExportTableArgs, export_table
from sandbox_runtime.tools.render_table import RenderTableArgs, render_table

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

root = ResultsRoot(sys.argv[1])
calls = {
    "export": lambda source: export_table(root, ExportTableArgs(source=source, format="csv"),
                                          max_source_bytes=64 << 20, max_table_file_bytes=1 << 30),
    "render": lambda source: render_table(root, RenderTableArgs(source=source, count=5),
                                          max_source_bytes=64 << 20, max_table_file_bytes=1 << 30),
}
measured = {}
for source in sys.argv[2:]:
    for name, call in calls.items():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = status("VmRSS")
        try:
            call(source)
            outcome = "ok"
        except ToolFailure as exc:
            outcome = type(exc).__name__
        measured[f"{name} {source}"] = [status("VmHWM") - base, outcome]
print(json.dumps(measured))
"""


@pytest.mark.process
def test_host_memory_stays_small_whatever_the_shape_of_the_file(root: ResultsRoot, results: Path) -> None:
    cell = "x" * (150 * MiB)
    _table_file(results, "huge.table.jsonl", ["id", "text"], ["integer", "string"], [[1, cell]])
    (results / "huge.csv").write_text(f"id,text\n1,{cell}\n")
    del cell
    records = [{"id": i, "name": f"n{i % 977}", "ok": i % 2 == 0} for i in range(700_000)]
    (results / "records.json").write_text(json.dumps(records))  # ~30 MB of small records, read whole
    json_bytes = (results / "records.json").stat().st_size
    del records

    run = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(results), "huge.table.jsonl", "huge.csv", "records.json"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip

    assert run.returncode == 0, run.stderr
    measured = json.loads(run.stdout)
    for case in ("export huge.table.jsonl", "render huge.table.jsonl", "export huge.csv", "render huge.csv"):
        grew, outcome = measured[case]
        assert outcome == "BadTableFile", case
        assert grew < 32 * MiB, measured  # today's code grew by ~1.3 GiB (export) and ~0.6 GiB (render)
    for case in ("export records.json", "render records.json"):
        grew, outcome = measured[case]
        assert outcome == "ok", case
        assert grew < 1.5 * json_bytes + 16 * MiB, (measured, json_bytes)  # a parse at once: ~10-20x


def test_a_csv_larger_than_the_whole_read_cap_streams_and_a_json_one_is_refused_naming_the_cap(
    root: ResultsRoot, results: Path
) -> None:
    (results / "big.csv").write_text("a,b\n" + "".join(f"{i},x{i}\n" for i in range(20_000)))
    (results / "big.json").write_text(json.dumps([{"a": i} for i in range(20_000)]))
    small = 64 * 1024
    args = ExportTableArgs(source="big.csv", format="csv")
    assert export_table(root, args, max_source_bytes=small, max_table_file_bytes=MAX_BYTES).rows == 20_000
    with pytest.raises(FileTooLarge, match=r"more than the 65,536 bytes a JSON table may have.*store\.read_max"):
        export_table(
            root, args.model_copy(update={"source": "big.json"}), max_source_bytes=small, max_table_file_bytes=MAX_BYTES
        )


# the readers agree with recognise_table -------------------------------------------------------------------
def _random_value(rnd: random.Random) -> object:
    return rnd.choice(
        [None, 1, -3, 2.5, True, "x", "2024-01-31", "2024-02-30", "2024-01-31T10:00:00+02:00", "007", [1, {"a": 2}]]
    )


def _random_column(rnd: random.Random, n: int) -> list[object]:
    pools: list[list[object]] = [
        [None, "2024-01-01", "2023-12-31"],
        [None, 1, 2.5],
        [None, "2024-01-01", "2024-01-01 10:00", "x"],
        [None, "2024-01-01T10:00:00Z", "2024-01-01"],
    ]
    if rnd.random() < 0.5:
        return [rnd.choice(rnd.choice(pools)) for _ in range(n)]
    return [_random_value(rnd) for _ in range(n)]


def test_whole_json_tables_read_row_by_row_are_the_tables_recognise_table_finds(
    root: ResultsRoot, results: Path
) -> None:
    rnd = random.Random(12)  # noqa: S311  (reproducible data, not secrets)
    for _ in range(300):
        n, width = rnd.randrange(0, 40), rnd.randrange(1, 5)
        columns = [_random_column(rnd, n) for _ in range(width)]
        doc: object
        if rnd.random() < 0.5:
            doc = [{f"c{c}": columns[c][i] for c in range(width) if rnd.random() < 0.9} for i in range(n)]
        else:
            names = [f"c{c}" if rnd.random() < 0.8 else "dup" for c in range(width)]
            doc = {"columns": names, "rows": [[columns[c][i] for c in range(width)] for i in range(n)]}
        text = json.dumps(doc, indent=rnd.choice([None, 1]))
        (results / "t.json").write_text(text)
        want = recognise_table(json.loads(text))
        if not isinstance(want, Table):
            with pytest.raises(InvalidToolArguments, match=re.escape(want)):
                _export(root, source="t.json")
            continue
        with open_table(root, "t.json", max_bytes=MAX_BYTES) as source:
            got = (source.columns, source.column_types, [list(r) for r in source.rows], source.shape, source.notes)
            assert source.row_count == want.row_count
        assert got == (want.columns, want.column_types, want.rows, want.shape, want.notes), text


def test_csv_tsv_and_markdown_streamed_are_the_tables_recognise_table_finds(root: ResultsRoot, results: Path) -> None:
    rnd = random.Random(4)  # noqa: S311  (reproducible data, not secrets)
    cells = ["", "1", "-2", "2.5", "1e999", "true", "x", "2024-01-31", "2024-02-30", "2024-01-31 10:00", "007",
             "NULL", "x,y", 'q"q', "line\nbreak", "a|b"]  # fmt: skip
    for _ in range(400):
        n, width = rnd.randrange(0, 30), rnd.randrange(1, 5)
        header = [rnd.choice(["a", "b", "a", "c d"]) for _ in range(width)]
        rows = [[rnd.choice(cells) for _ in range(width)] for _ in range(n)]
        kind = rnd.randrange(3)
        if kind < 2:
            out = io.StringIO()
            csv.writer(out, delimiter="\t" if kind else ",").writerows([header, *rows])
            text = out.getvalue()
        else:
            lines = ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in r) + " |" for r in rows]
            text = "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * width, *lines]) + "\n"
        if rnd.random() < 0.2 and n:
            text += "z\n"  # a row of another width
        if text.strip() != text.rstrip("\r\n"):
            continue  # recognise_table strips the whole text, which drops an empty first or last cell
        (results / "t.txt").write_text(text)
        want = recognise_table(text)
        if not isinstance(want, Table):
            with pytest.raises(InvalidToolArguments, match="not a table"):
                _export(root, source="t.txt")
            continue
        with open_table(root, "t.txt", max_bytes=MAX_BYTES) as source:
            got = (source.columns, source.column_types, [list(r) for r in source.rows], source.shape, source.notes)
        assert got == (want.columns, want.column_types, want.rows, want.shape, want.notes), text


def test_a_column_typed_batch_by_batch_gets_the_type_and_cells_of_one_typed_at_once() -> None:
    rnd = random.Random(3)  # noqa: S311  (reproducible data, not secrets)
    for _ in range(2000):
        column = _random_column(rnd, rnd.randrange(1, 30))
        if rnd.random() < 0.3:
            pool = rnd.sample([None, 1.5, float("inf"), float("nan"), 2, True, "x", "2024-01-01", [1]], k=3)
            column = [rnd.choice(pool) for _ in column]
        typer = ColumnTyper()
        cuts = sorted({*rnd.sample(range(1, len(column) + 1), k=min(len(column), rnd.randrange(1, 4))), len(column)})
        for start, stop in itertools.pairwise([0, *cuts]):
            typer.add(column[start:stop])
        whole = list(column)
        kind = clean_column(whole)
        assert typer.kind == kind, column
        assert finish_column(list(column), kind) == whole, column


# render_table's characters --------------------------------------------------------------------------------
def test_a_3_mb_cell_renders_cut_with_a_marker_within_the_character_cap(root: ResultsRoot) -> None:
    result = _render(root, columns=["id", "text"], rows=[[1, "x" * 3_000_000], [2, "short"]])

    assert len(result.markdown) <= 100_000  # today: 3,000,105 characters
    first = result.markdown.splitlines()[2]
    assert first == "| 1 | " + "x" * 500 + "…[2,999,500 more characters] |"
    assert result.markdown.splitlines()[3] == "| 2 | short |"
    assert (result.rows, result.cut_cells, result.stopped_at_chars) == (2, 1, False)
    assert "1 cell cut to 500 characters" in result.message


def test_a_long_table_stops_at_the_character_cap_with_a_marker_naming_the_rows_shown_and_the_next_step(
    root: ResultsRoot, results: Path
) -> None:
    rows = [[i, f"{i:04d}" + "t" * 396] for i in range(2000)]
    source = _table_file(results, "long.table.jsonl", ["id", "text"], ["integer", "string"], rows)

    result = _render(root, source=source)

    assert len(result.markdown) <= 100_000
    assert result.stopped_at_chars
    shown = result.rows
    assert 200 < shown < 250
    assert result.next_start == shown
    marker = result.markdown.rstrip("\n").splitlines()[-1]
    assert f"shown are rows 0 to {shown - 1:,} ({shown:,} of the 2,000 rows asked for)" in marker
    assert f"start={shown}" in marker
    assert '{"source": "/mnt/results/long.table.jsonl", "format": "csv"}' in marker
    table_lines = [line for line in result.markdown.splitlines() if line.startswith("| ")]
    assert table_lines[-1].startswith(f"| {shown - 1} | {shown - 1:04d}")
    following = _render(root, source=source, start=result.next_start, count=5)
    assert following.markdown.splitlines()[2].startswith(f"| {shown} | {shown:04d}")


@pytest.mark.parametrize("seed", range(6))
def test_rendered_markdown_never_exceeds_the_character_cap_whatever_the_cells(root: ResultsRoot, seed: int) -> None:
    rnd = random.Random(seed)  # noqa: S311  (reproducible data, not secrets)
    for _ in range(20):
        width = rnd.randrange(1, 6)
        rows = [[rnd.choice(["", "|", "\n" * rnd.randrange(50), "x" * rnd.randrange(3000), 7, None])
                 for _ in range(width)] for _ in range(rnd.randrange(0, 300))]  # fmt: skip
        max_chars = rnd.choice([5_000, 20_000, 100_000])
        args = RenderTableArgs(columns=[f"c{i}" for i in range(width)], rows=rows)
        result = render_table(root, args, max_source_bytes=1, max_cell_chars=200, max_chars=max_chars)
        assert len(result.markdown) <= max_chars
        assert result.stopped_at_chars == (result.rows < len(rows))


def test_a_header_too_wide_for_the_character_cap_is_refused_naming_columns(root: ResultsRoot) -> None:
    columns = [f"column {i} " + "h" * 400 for i in range(300)]
    with pytest.raises(InvalidToolArguments, match=r"the header of 300 columns alone is .* choose fewer columns"):
        _render(root, columns=columns, rows=[[1] * 300])


def test_a_csv_row_with_long_cells_is_written_field_by_field_exactly_as_the_csv_module_writes_it(
    root: ResultsRoot, results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rnd = random.Random(2)  # noqa: S311  (reproducible data, not secrets)
    texts = ["", "ab", "a,b", 'q"q', "x\ny", "r\rr", " sp ", "é", "=f", "\u200b@f"]
    rows = [[rnd.choice([*texts, 7, 2.5, None, True]) for _ in range(3)] for _ in range(500)] + [[""] * 3]
    (results / "t.json").write_text(json.dumps({"columns": ["a", "b", "c"], "rows": rows}))
    whole = _export(root, source="t.json", filename="whole")
    monkeypatch.setattr(table_writers, "_CSV_LONG_CHARS", 1)  # every text cell is "long"
    by_field = _export(root, source="t.json", filename="by_field")
    assert _host(results, by_field.path).read_bytes() == _host(results, whole.path).read_bytes()
    assert by_field.guarded_cells == whole.guarded_cells > 0


# the formula guard ----------------------------------------------------------------------------------------
INVISIBLE = [" ", "  ", "\u00a0", "\u2007", "\u3000", "\ufeff", "\u200b", "\u200c", "\u200d", "\u2060", "\u200e",
             "\u200f", "\u00ad", "\u034f", "\u180e", "\ufe0f", "\u2028", "\x0b", "\x0c", "\x1f", "\U000e0001",
             "\U000e0101", " \u00a0\u200b\ufeff"]  # fmt: skip
FORMULA_STARTS = [
    "=",
    "+",
    "-",
    "@",
    "\uff1d",
    "\uff0b",
    "\uff0d",
    "\uff20",
    "\ufe66",
    "\ufe62",
    "\ufe63",
    "\u207c",
    "\u207a",
    "\u208c",
    "\u208a",
]  # ASCII, full-width, small, super- and subscript forms
SAFE_STARTS = ["a", "1", "'", "\uff41", "\uff11", "\u2212", "\u207b", "(", "\u00a8="]  # U+207B folds to U+2212


def test_every_invisible_prefix_before_every_formula_start_is_guarded_in_csv_and_stays_text_in_xlsx(
    root: ResultsRoot, results: Path
) -> None:
    guarded = [prefix + start + "SUM(A1)" for prefix in INVISIBLE for start in FORMULA_STARTS]
    guarded += [start + "1" for start in FORMULA_STARTS] + ["\tx", "\rx", "\nx"]
    safe = [prefix + start + "=1" for prefix in ["", *INVISIBLE] for start in SAFE_STARTS] + ["", "   "]
    texts = guarded + safe
    (results / "f.json").write_text(json.dumps({"columns": ["text"], "rows": [[t] for t in texts]}))

    result = _export(root, source="f.json")

    cells = [row[0] for row in _csv_rows(_host(results, result.path))[1:]]
    assert cells == ["'" + t for t in guarded] + safe
    assert result.guarded_cells == len(guarded)
    xlsx = _export(root, source="f.json", format="xlsx")
    assert xlsx.guarded_cells == len(guarded)
    book = openpyxl.load_workbook(_host(results, xlsx.path), read_only=True)
    try:
        sheet_cells = [c for row in book.worksheets[0].iter_rows(min_row=2) for c in row]
        assert not [c for c in sheet_cells if c.data_type == "f"]
        assert all(c.data_type in ("s", "n") for c in sheet_cells)  # text (an empty cell is blank)
    finally:
        book.close()


def test_every_unicode_format_control_and_space_character_is_skipped_before_a_formula() -> None:
    invisible = [
        chr(code)
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)) in ("Cf", "Cc", "Zs", "Zl", "Zp") and not 0xD800 <= code <= 0xDFFF
    ]
    assert len(invisible) > 200
    for char in invisible:
        for start in ("=", "\uff1d", "@"):
            assert formula_like(char + start + "1"), hex(ord(char))
            assert formula_like(char * 3 + start), hex(ord(char))
        if char not in "\t\r\n":  # these guard a cell whatever follows
            assert not formula_like(char + "a=1"), hex(ord(char))


def test_a_csv_source_with_invisible_prefixed_formulas_in_header_and_cells_is_guarded(
    root: ResultsRoot, results: Path
) -> None:
    (results / "in.csv").write_text("\u200b=cmd,b\n1,\u00a0+x\n2,\uff1dHYPERLINK()\n", encoding="utf-8")
    result = _export(root, source="in.csv")
    rows = _csv_rows(_host(results, result.path))
    assert rows == [["'\u200b=cmd", "b"], ["1", "'\u00a0+x"], ["2", "'\uff1dHYPERLINK()"]]
    assert result.guarded_cells == 3


# dates at the edge of the range ---------------------------------------------------------------------------
def _instant_us(value: dt.datetime | dt.date) -> int:
    """Exact microseconds since 0001-01-01 UTC, with integer arithmetic only."""
    if not isinstance(value, dt.datetime):
        value = dt.datetime(value.year, value.month, value.day)
    naive = value.replace(tzinfo=None)
    micros = (naive - dt.datetime(1, 1, 1)) // dt.timedelta(microseconds=1)
    offset = value.utcoffset()
    return micros - (offset // dt.timedelta(microseconds=1) if offset is not None else 0)


OFFSETS = [dt.timedelta(hours=h, minutes=m) for h, m in ((-23, -59), (-12, 0), (0, -1), (0, 1), (5, 30), (23, 59))]
EDGES = [
    dt.datetime(year, month, day, hour, minute, second, micro, tzinfo=dt.timezone(offset))
    for year, month, day, hour, minute, second, micro in (
        (1, 1, 1, 0, 0, 0, 0), (1, 1, 1, 23, 59, 59, 999_999), (9999, 12, 31, 0, 0, 0, 0),
        (9999, 12, 31, 23, 59, 59, 999_999), (2024, 2, 29, 12, 0, 0, 0),
    )
    for offset in OFFSETS
]  # fmt: skip


def test_sort_keys_order_every_datetime_by_its_exact_instant_even_past_the_range_in_utc() -> None:
    rnd = random.Random(9)  # noqa: S311  (reproducible data, not secrets)
    values: list[dt.datetime | dt.date] = [*EDGES, dt.date(1, 1, 1), dt.date(9999, 12, 31)]
    for _ in range(3000):
        moment = dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rnd.randrange(_instant_us(dt.datetime.max)))
        zone = rnd.choice([None, dt.timezone(rnd.choice(OFFSETS)), dt.UTC])
        values.append(moment.replace(tzinfo=zone) if rnd.random() < 0.9 else moment.date())
    assert sorted(values, key=sort_key) == sorted(values, key=_instant_us)


def test_datetimes_at_the_edge_of_the_range_with_an_offset_export_to_xlsx_and_csv_and_sort(
    root: ResultsRoot, results: Path
) -> None:
    rows = [[i, value.isoformat()] for i, value in enumerate(EDGES)]
    source = _table_file(results, "edge.table.jsonl", ["i", "when"], ["integer", "datetime"], rows)
    beyond = [v for v in EDGES if not 0 <= _instant_us(v) <= _instant_us(dt.datetime.max)]
    assert len(beyond) == 6  # 0001-01-01T00:00 east of UTC, 9999-12-31T23:59:59.999999 west of it

    xlsx = _export(root, source=source, format="xlsx", sort={"column": "when", "direction": "desc"})

    assert f"{len(beyond)} datetimes whose UTC time is past the range of dates written as ISO text" in xlsx.message
    book = openpyxl.load_workbook(_host(results, xlsx.path), read_only=True)
    try:
        got = [[c.value for c in row] for row in book.worksheets[0].iter_rows(min_row=2)]
    finally:
        book.close()
    ordered = sorted(EDGES, key=_instant_us, reverse=True)
    assert [EDGES[i] for i, _when in got] == ordered
    for (_i, when), value in zip(got, ordered, strict=True):
        if value in beyond:
            assert when == value.isoformat()
        elif value.year >= 1900:
            utc = value.astimezone(dt.UTC).replace(tzinfo=None)
            assert abs(when - utc) < dt.timedelta(milliseconds=1), (when, utc)  # Excel keeps milliseconds
    csv_result = _export(root, source=source, sort={"column": "when"})
    written = [row[1] for row in _csv_rows(_host(results, csv_result.path))[1:]]
    assert written == [v.isoformat() for v in sorted(EDGES, key=_instant_us)]
    assert _render(root, source=source).rows == len(EDGES)


# sorting within a byte budget -----------------------------------------------------------------------------
def test_a_sort_of_large_rows_runs_within_a_byte_budget_and_stays_stable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(table_sort, "_BATCH_MAX_BYTES", 20_000)
    monkeypatch.setattr(table_sort, "_MERGE_MAX_BYTES", 50_000)
    rnd = random.Random(1)  # noqa: S311  (reproducible data, not secrets)
    rows = [[rnd.choice([None, 1, 2, 3, 2.5]), i, "p" * rnd.choice([10, 5000])] for i in range(600)]
    read = [0]

    def source() -> Any:
        for row in rows:
            padding = row[2]
            assert isinstance(padding, str)
            read[0] += len(padding) + 10
            yield row

    for descending in (False, True):
        with sort_rows(
            source(), 0, descending=descending, memory_rows=10_000, tmp_dir=str(tmp_path),
            consumed=lambda: read[0], memory_bytes=30_000,
        ) as ordered:  # fmt: skip
            got = [row[1] for row in ordered.rows]
        present = sorted((r for r in rows if r[0] is not None), key=lambda r: r[0], reverse=descending)
        assert got == [r[1] for r in present] + [r[1] for r in rows if r[0] is None]
    assert list(tmp_path.iterdir()) == []


# the tool path, with a real sandbox -----------------------------------------------------------------------
WRITER = r"""
import json, pathlib
out = pathlib.Path("/mnt/results")
header = {"format": "sandbox-runtime.table", "version": 1, "columns": ["id", "text"],
          "column_types": ["integer", "string"]}
with open(out / "huge.table.jsonl", "w") as f:
    f.write(json.dumps(header) + "\n")
    f.write('[1,"' + "x" * (150 * 1024 * 1024) + '"]\n')
with open(out / "deep.table.jsonl", "w") as f:
    f.write(json.dumps(header) + "\n")
    f.write("[1," + "[" * 5000 + "]" * 5000 + "]\n")
when = {"format": "sandbox-runtime.table", "version": 1, "columns": ["when"], "column_types": ["datetime"]}
with open(out / "edge.table.jsonl", "w") as f:
    f.write(json.dumps(when) + "\n")
    f.write('["9999-12-31T23:30:00-05:00"]\n["2024-01-01T00:00:00+00:00"]\n')
(out / "formulas.csv").write_text("name,note\nx,\u200b=HYPERLINK(1)\ny,\uff1d1+1\n", encoding="utf-8")
print("written")
"""


def test_what_a_sandbox_script_writes_gives_tool_errors_or_bounded_results_never_an_exception(
    runtime: Runtime,
) -> None:
    conversation = runtime.conversation("table-bounds")
    wrote = conversation.call("run_python", {"code": WRITER})
    assert not wrote.is_error, wrote.text

    for tool, args in (("export_table", {"format": "csv"}), ("render_table", {"count": 1})):
        huge = conversation.call(tool, {"source": "/mnt/results/huge.table.jsonl", **args})
        assert huge.is_error
        assert "line 2" in huge.text, huge.text
        assert "16,777,216 bytes" in huge.text, huge.text
        deep = conversation.call(tool, {"source": "/mnt/results/deep.table.jsonl", **args})
        assert deep.is_error
        assert "64 levels" in deep.text, deep.text

    edge = conversation.call("export_table", {"source": "/mnt/results/edge.table.jsonl", "format": "xlsx",
                                              "sort": {"column": "when"}})  # fmt: skip
    assert not edge.is_error, edge.text
    assert "1 datetime whose UTC time is past the range of dates written as ISO text" in edge.text

    exported = conversation.call("export_table", {"source": "/mnt/results/formulas.csv", "format": "csv"})
    assert not exported.is_error, exported.text
    with (conversation.folders.results / "exports" / "formulas.csv").open(encoding="utf-8", newline="") as file:
        assert [row[1] for row in csv.reader(file)][1:] == ["'\u200b=HYPERLINK(1)", "'\uff1d1+1"]
    assert "2 cells guarded against formulas" in exported.text
