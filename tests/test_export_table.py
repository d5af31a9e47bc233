"""export_table: a saved table written as CSV or XLSX by path, with real files in a results folder (no Docker)."""

from __future__ import annotations

import csv
import datetime as dt
import itertools
import json
import os
import re
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from pydantic import ValidationError

import sandbox_runtime.tools.export_table as export_module
from sandbox_runtime.errors import BadTableFile, InvalidToolArguments, PathNotFound, PathOutsideResults, UnsafeFileType
from sandbox_runtime.policy import Policy, SpillPolicy
from sandbox_runtime.spill.spiller import spill_result
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tables.cells import Cell
from sandbox_runtime.tables.source import open_table, sort_key, sort_rows
from sandbox_runtime.tables.table import header_line, row_line
from sandbox_runtime.tools.export_table import (
    ExportResult,
    ExportTableArgs,
    export_table,
    export_table_description,
)

MAX_BYTES = 64 * 1024 * 1024
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
CHOSEN: list[Any] = [
    {"name": "id", "header": "Order"},
    {"name": "amount", "header": "Amount (EUR)"},
    "day",
    {"name": "customer", "header": "Customer"},
]
HEADERS = ["Order", "Amount (EUR)", "day", "Customer"]
PICKED = ["id", "amount", "day", "customer"]


def _records(count: int = 321) -> list[dict[str, Any]]:
    base = dt.date(2024, 1, 1)
    return [
        {
            "id": i,
            "customer": f"customer {i % 40}" if i % 11 else None,
            "amount": (i * 37 % 101) * 1.25 - 30 if i % 9 else None,
            "day": base + dt.timedelta(days=i % 90),
            "paid": i % 3 == 0,
            "note": None,
        }
        for i in range(count)
    ]


@pytest.fixture
def records() -> list[dict[str, Any]]:
    return _records()


@pytest.fixture
def spilled(root: ResultsRoot, records: list[dict[str, Any]]) -> str:
    """The path of a 321-row table spilled like a SQL result."""
    outcome = spill_result(root, records, tool="sql", call_id="q1", policy=SpillPolicy(), now=NOW)
    assert outcome.descriptor is not None
    assert outcome.descriptor.path.endswith(".table.jsonl")
    return outcome.descriptor.path


def _export(root: ResultsRoot, **kwargs: Any) -> ExportResult:
    return export_table(root, ExportTableArgs.model_validate(kwargs), max_source_bytes=MAX_BYTES)


def _host(results: Path, path: str) -> Path:
    return results / path.removeprefix("/mnt/results/")


def _expected(records: list[dict[str, Any]], start: int, count: int) -> list[list[Any]]:
    """amount descending, stable, NULL amounts last in source order; the chosen columns only."""
    present = sorted((r for r in records if r["amount"] is not None), key=lambda r: r["amount"], reverse=True)
    ordered = present + [r for r in records if r["amount"] is None]
    return [[r[name] for name in PICKED] for r in ordered[start : start + count]]


def _ooxml_text(value: Any) -> Any:
    """openpyxl leaves OOXML's _xHHHH_ escapes (how XLSX stores CR and the like) in text; Excel decodes them."""
    if not isinstance(value, str):
        return value
    return re.sub(r"_x([0-9A-F]{4})_", lambda m: chr(int(m.group(1), 16)), value)


def _xlsx_rows(path: Path) -> tuple[list[list[Any]], int]:
    """All rows of the first sheet, and how many cells hold formulas."""
    book = openpyxl.load_workbook(path, read_only=True)
    try:
        sheet = book.worksheets[0]
        rows: list[list[Any]] = []
        formulas = 0
        for row in sheet.iter_rows():
            rows.append([_ooxml_text(c.value) for c in row])
            formulas += sum(c.data_type == "f" for c in row)
        return rows, formulas
    finally:
        book.close()


def _csv_rows(path: Path) -> list[list[str]]:
    with path.open(encoding="utf-8", newline="") as file:
        return list(csv.reader(file))


def _write_json(results: Path, name: str, value: object) -> str:
    (results / name).write_text(json.dumps(value), encoding="utf-8")
    return name


# the user stories -----------------------------------------------------------------------------------------
def test_a_spilled_result_becomes_an_xlsx_with_chosen_renamed_sorted_columns_and_typed_cells(
    root: ResultsRoot, results: Path, spilled: str, records: list[dict[str, Any]]
) -> None:
    result = _export(
        root, source=spilled, format="xlsx", columns=CHOSEN, sort={"column": "amount", "direction": "desc"},
        start=10, count=51,
    )  # fmt: skip

    assert result.path == "/mnt/results/exports/sql-q1.xlsx"
    assert (result.rows, result.columns, result.format) == (51, HEADERS, "xlsx")
    assert result.column_types == ["integer", "number", "date", "string"]
    assert result.guarded_cells == 0
    assert "Wrote 51 rows \u00d7 4 columns" in result.message
    assert result.path in result.message
    assert f"({result.bytes:,} bytes)" in result.message
    assert "0 cells guarded against formulas" in result.message
    host = _host(results, result.path)
    assert host.stat().st_size == result.bytes
    assert oct(host.stat().st_mode & 0o777) == "0o644"
    rows, formulas = _xlsx_rows(host)
    assert formulas == 0
    assert rows[0] == HEADERS
    expected = _expected(records, 10, 51)
    assert len(rows) - 1 == len(expected) == 51
    for got, want in zip(rows[1:], expected, strict=True):
        order, amount, day, customer = got
        assert order == want[0]
        assert isinstance(order, int)
        assert amount == want[1]
        assert amount is None or isinstance(amount, int | float)
        assert isinstance(day, dt.datetime)
        assert day.date() == want[2]
        assert customer == want[3]
    amounts = [row[1] for row in rows[1:]]
    assert amounts == sorted(amounts, reverse=True)


def test_the_same_selection_as_csv_reads_back_with_the_csv_module(
    root: ResultsRoot, results: Path, spilled: str, records: list[dict[str, Any]]
) -> None:
    result = _export(
        root, source=spilled, format="csv", columns=CHOSEN, sort={"column": "amount", "direction": "desc"},
        start=10, count=51, filename="top orders.csv",
    )  # fmt: skip

    assert result.path == "/mnt/results/exports/top_orders.csv"
    rows = _csv_rows(_host(results, result.path))
    assert rows[0] == HEADERS
    want = [["" if v is None else v.isoformat() if isinstance(v, dt.date) else str(v) for v in row]
            for row in _expected(records, 10, 51)]  # fmt: skip
    assert rows[1:] == want


def test_all_columns_in_source_order_by_default_with_booleans_and_nulls(
    root: ResultsRoot, results: Path, spilled: str
) -> None:
    result = _export(root, source=spilled, format="csv", count=3)
    rows = _csv_rows(_host(results, result.path))
    assert rows[0] == ["id", "customer", "amount", "day", "paid", "note"]
    assert rows[1] == ["0", "", "", "2024-01-01", "true", ""]
    assert rows[2] == ["1", "customer 1", "16.25", "2024-01-02", "false", ""]
    assert result.rows == 3
    assert "rows 0 to 2 of 321" in result.message


# formulas and hostile text ----------------------------------------------------------------------------------
FORMULAS = ['=HYPERLINK("http://evil.example","click")', "+1", "-2", "@SUM(A1)", "\tx", "\rcr", "\nlf", "plain"]


@pytest.fixture
def formula_source(results: Path) -> str:
    rows = [[text, -(i + 1) * 1.5, -i] for i, text in enumerate(FORMULAS)]
    return _write_json(results, "formulas.json", {"columns": ["text", "negative", "int"], "rows": rows})


def test_formula_strings_get_an_apostrophe_in_csv_and_negative_numbers_stay_numbers(
    root: ResultsRoot, results: Path, formula_source: str
) -> None:
    result = _export(root, source=formula_source, format="csv")

    rows = _csv_rows(_host(results, result.path))
    assert [row[0] for row in rows[1:]] == ["'" + text for text in FORMULAS[:-1]] + ["plain"]
    assert [row[1] for row in rows[1:]] == [str(-(i + 1) * 1.5) for i in range(len(FORMULAS))]
    assert [row[2] for row in rows[1:]] == [str(-i) for i in range(len(FORMULAS))]
    assert result.guarded_cells == 7
    assert "7 cells guarded against formulas" in result.message


def test_formula_strings_stay_text_in_xlsx_with_zero_formula_cells(
    root: ResultsRoot, results: Path, formula_source: str
) -> None:
    result = _export(root, source=formula_source, format="xlsx")

    rows, formulas = _xlsx_rows(_host(results, result.path))
    assert formulas == 0
    assert [row[0] for row in rows[1:]] == FORMULAS
    assert [row[1] for row in rows[1:]] == [-(i + 1) * 1.5 for i in range(len(FORMULAS))]
    assert result.guarded_cells == 7


def test_control_characters_and_overlong_text_are_made_fit_for_xlsx_and_reported(
    root: ResultsRoot, results: Path
) -> None:
    long_text = "y" * 40_000
    source = _write_json(results, "odd.json", [{"text": "a\x01b\x1fc"}, {"text": long_text}, {"text": "tab\tok"}])

    result = _export(root, source=source, format="xlsx")

    rows, _formulas = _xlsx_rows(_host(results, result.path))
    assert rows[1][0] == "a\ufffdb\ufffdc"
    assert rows[2][0] == "y" * 32_767
    assert rows[3][0] == "tab\tok"
    assert (result.replaced_characters, result.cut_cells) == (2, 1)
    assert "2 characters the format cannot hold replaced with U+FFFD" in result.message
    assert "1 text cell cut to 32,767 characters" in result.message


def test_a_csv_source_with_a_formula_header_is_guarded_too(root: ResultsRoot, results: Path) -> None:
    (results / "in.csv").write_text("=cmd,b\n1,x\n", encoding="utf-8")
    result = _export(root, source="in.csv", format="csv")
    assert _csv_rows(_host(results, result.path))[0] == ["'=cmd", "b"]
    assert result.guarded_cells == 1


# sorting ----------------------------------------------------------------------------------------------------
def _sorted_values(root: ResultsRoot, results: Path, source: str, column: str, direction: str) -> list[list[str]]:
    result = _export(root, source=source, format="csv", sort={"column": column, "direction": direction})
    return _csv_rows(_host(results, result.path))[1:]


@pytest.mark.parametrize(
    ("direction", "expected"),
    [
        ("asc", ["-1", "1.5", "2", "3", "3", "10", "", ""]),
        ("desc", ["10", "3", "3", "2", "1.5", "-1", "", ""]),
    ],
)
def test_numbers_sort_numerically_with_ints_and_floats_mixed_and_nulls_last(
    root: ResultsRoot, results: Path, direction: str, expected: list[str]
) -> None:
    rows = [[3, "a"], [None, "n1"], [1.5, "b"], [10, "c"], [3, "d"], [None, "n2"], [2, "e"], [-1, "f"]]
    source = _write_json(results, "mixed.json", {"columns": ["k", "tag"], "rows": rows})

    got = _sorted_values(root, results, source, "k", direction)

    assert [row[0] for row in got] == expected
    ties = [row[1] for row in got if row[0] == "3"]
    assert ties == ["a", "d"]  # stable: ties keep source order in both directions
    assert [row[1] for row in got if row[0] == ""] == ["n1", "n2"]


def test_dates_sort_as_dates_and_strings_by_text(root: ResultsRoot, results: Path) -> None:
    records = [
        {"day": "2024-12-01", "name": "pear"},
        {"day": None, "name": None},
        {"day": "2023-01-15", "name": "apple"},
        {"day": "2024-02-29", "name": "Zebra"},
    ]
    source = _write_json(results, "dates.json", records)

    assert [r[0] for r in _sorted_values(root, results, source, "day", "asc")] == [
        "2023-01-15", "2024-02-29", "2024-12-01", "",
    ]  # fmt: skip
    assert [r[1] for r in _sorted_values(root, results, source, "name", "desc")] == ["pear", "apple", "Zebra", ""]


def test_sorting_by_a_column_that_is_not_written_still_orders_the_rows(
    root: ResultsRoot, results: Path, spilled: str, records: list[dict[str, Any]]
) -> None:
    result = _export(root, source=spilled, format="csv", columns=["id"], sort={"column": "amount", "direction": "asc"})
    ids = [int(row[0]) for row in _csv_rows(_host(results, result.path))[1:]]
    present = sorted((r for r in records if r["amount"] is not None), key=lambda r: r["amount"])
    assert ids == [r["id"] for r in present] + [r["id"] for r in records if r["amount"] is None]


def test_the_external_sort_merges_many_runs_stably_like_an_in_memory_sort(tmp_path: Path) -> None:
    rows: list[list[Cell]] = [[(i * 7919) % 13 if i % 10 else None, i] for i in range(1000)]
    for descending in (False, True):
        with sort_rows(iter(rows), 0, descending=descending, memory_rows=3, tmp_dir=str(tmp_path)) as ordered:
            got = list(ordered.rows)
            assert ordered.total == 1000
        present = sorted((r for r in rows if r[0] is not None), key=lambda r: sort_key(r[0]), reverse=descending)
        assert got == present + [r for r in rows if r[0] is None]
    assert list(tmp_path.iterdir()) == []  # the runs are anonymous temporary files, gone after the sort


def test_sort_keys_order_booleans_numbers_dates_and_text_apart() -> None:
    aware = dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    values: list[Any] = ["b", dt.date(2024, 1, 1), 2.5, True, aware, 1]
    assert sorted(values, key=sort_key) == [True, 1, 2.5, dt.date(2024, 1, 1), aware, "b"]


# bad input --------------------------------------------------------------------------------------------------
def test_an_unknown_column_is_refused_with_the_available_columns_listed(root: ResultsRoot, spilled: str) -> None:
    with pytest.raises(InvalidToolArguments, match="no column 'total'") as caught:
        _export(root, source=spilled, format="csv", columns=["id", "total"])
    assert "'id', 'customer', 'amount', 'day', 'paid', 'note'" in str(caught.value)
    with pytest.raises(InvalidToolArguments, match=r"cannot sort by 'total'.*'customer'"):
        _export(root, source=spilled, format="csv", sort={"column": "total"})


def test_duplicate_and_empty_headers_are_refused(root: ResultsRoot, spilled: str) -> None:
    with pytest.raises(InvalidToolArguments, match=r"unique.*'id'"):
        _export(root, source=spilled, format="csv", columns=["id", {"name": "amount", "header": "id"}])
    with pytest.raises(InvalidToolArguments, match="header for column 'amount' is empty"):
        _export(root, source=spilled, format="xlsx", columns=[{"name": "amount", "header": "  "}])


def test_a_start_past_the_end_says_how_many_rows_there_are(root: ResultsRoot, spilled: str) -> None:
    with pytest.raises(InvalidToolArguments, match=r"start=321 is past the end: .* has 321 rows"):
        _export(root, source=spilled, format="csv", start=321)
    with pytest.raises(InvalidToolArguments, match="start=400 is past the end"):
        _export(root, source=spilled, format="xlsx", start=400, sort={"column": "id", "direction": "desc"})


def test_negative_counts_and_starts_and_unknown_arguments_fail_validation() -> None:
    bad: Mapping[str, object]
    for bad in ({"count": -1}, {"start": -1}, {"rows": 5}, {"format": "ods"}, {"columns": []}):
        with pytest.raises(ValidationError):
            ExportTableArgs.model_validate({"source": "a.json", "format": "csv", **bad})


def test_a_source_that_is_not_a_table_is_refused_naming_the_accepted_formats(root: ResultsRoot, results: Path) -> None:
    (results / "notes.txt").write_text("just some words\nover two lines\n", encoding="utf-8")
    with pytest.raises(InvalidToolArguments, match=r"not a table \(text without") as caught:
        _export(root, source="notes.txt", format="csv")
    for name in ("table.jsonl", "JSON", "CSV", "Markdown"):
        assert name in str(caught.value)
    (results / "latin1.csv").write_bytes(b"a,b\n\xe9,1\n")
    with pytest.raises(InvalidToolArguments, match="not UTF-8 text"):
        _export(root, source="latin1.csv", format="csv")


def test_a_corrupt_table_file_is_refused_with_the_line_number(root: ResultsRoot, results: Path) -> None:
    text = header_line(["a"], ["integer"]) + "[1]\n[2, 3]\n"
    (results / "bad.table.jsonl").write_text(text, encoding="utf-8")
    with pytest.raises(BadTableFile, match="line 3: expected 1 cells"):
        _export(root, source="bad.table.jsonl", format="csv")
    assert not (results / "exports").exists()  # nothing half-written was published
    (results / "nohead.table.jsonl").write_text("[1]\n", encoding="utf-8")
    with pytest.raises(BadTableFile, match="line 1"):
        _export(root, source="nohead.table.jsonl", format="csv")


def test_paths_outside_the_results_folder_missing_files_and_symlinks_are_refused(
    root: ResultsRoot, results: Path, tmp_path: Path, spilled: str
) -> None:
    for outside in ("../etc/passwd", "/etc/passwd", "spill/../../x.json"):
        with pytest.raises(PathOutsideResults):
            _export(root, source=outside, format="csv")
    with pytest.raises(PathNotFound):
        _export(root, source="spill/none.table.jsonl", format="csv")
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps([{"password": "hunter2"}]), encoding="utf-8")
    (results / "link.json").symlink_to(secret)
    with pytest.raises(UnsafeFileType):
        _export(root, source="link.json", format="csv")
    (results / "exports").mkdir()
    (results / "exports" / "sql-q1.csv").symlink_to(tmp_path / "planted.csv")
    assert _export(root, source=spilled, format="csv").path == "/mnt/results/exports/sql-q1-2.csv"
    assert not (tmp_path / "planted.csv").exists()  # a planted link is a taken name, never written through
    (results / "exports-link").symlink_to(tmp_path)
    with pytest.raises(UnsafeFileType):
        _export(root, source="exports-link/secret.json", format="csv")


def test_a_filename_with_folders_is_refused_and_odd_characters_are_replaced(root: ResultsRoot, spilled: str) -> None:
    with pytest.raises(InvalidToolArguments, match="base name"):
        _export(root, source=spilled, format="csv", filename="../x")
    with pytest.raises(InvalidToolArguments, match="no usable characters"):
        _export(root, source=spilled, format="csv", filename="???")
    result = _export(root, source=spilled, format="xlsx", filename=".Q3 report (final).csv", count=1)
    assert result.path == "/mnt/results/exports/Q3_report_final.xlsx"


# files and memory -----------------------------------------------------------------------------------------
def test_an_existing_export_name_gets_a_suffix_and_nothing_is_overwritten(
    root: ResultsRoot, results: Path, spilled: str
) -> None:
    first = _export(root, source=spilled, format="xlsx", count=5)
    before = _host(results, first.path).read_bytes()
    second = _export(root, source=spilled, format="xlsx", count=5)
    third = _export(root, source=spilled, format="xlsx", count=5)

    assert [first.path, second.path, third.path] == [
        "/mnt/results/exports/sql-q1.xlsx", "/mnt/results/exports/sql-q1-2.xlsx", "/mnt/results/exports/sql-q1-3.xlsx",
    ]  # fmt: skip
    assert _host(results, first.path).read_bytes() == before
    assert first.sha256 == second.sha256 == third.sha256  # the same input gives the same bytes
    assert sorted(os.listdir(results / "exports")) == ["sql-q1-2.xlsx", "sql-q1-3.xlsx", "sql-q1.xlsx"]


def _big_table(root: ResultsRoot, count: int) -> str:
    def chunks() -> Iterator[bytes]:
        yield header_line(["id", "name", "score", "day"], ["integer", "string", "number", "date"]).encode()
        batch: list[bytes] = []
        for i in range(count):
            score = None if i % 1000 == 7 else (i * 7919) % 100_003 / 7
            batch.append(row_line([i, f"name-{i:06d}", score, f"2024-01-{1 + i % 28:02d}"]))
            if len(batch) == 10_000:
                yield b"".join(batch)
                batch = []
        yield b"".join(batch)

    return root.create_file("spill/big.table.jsonl", chunks(), durable=False)


# Runs in a fresh interpreter so its peak resident memory (VmHWM, reset through clear_refs) is the export's
# own: tracemalloc would make the 200,000-row export about four times slower.
_MEASURE = """
import json, sys, time
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tools.export_table import ExportTableArgs, export_table
from sandbox_runtime.tables.source import open_table

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

results, source, sort_dir = sys.argv[1:]
root = ResultsRoot(results)
args = ExportTableArgs(source=source, format="csv", sort={"column": "score", "direction": "desc"})
reset_peak()
base, started = status("VmRSS"), time.monotonic()
result = export_table(root, args, max_source_bytes=1 << 30, sort_memory_rows=20_000, tmp_dir=sort_dir)
export = {"grew": status("VmHWM") - base, "seconds": time.monotonic() - started, "path": result.path,
          "rows": result.rows}
reset_peak()
base = status("VmRSS")
with open_table(root, source, max_bytes=1 << 30) as table:
    held = list(table.rows)
print(json.dumps({**export, "held": status("VmHWM") - base, "held_rows": len(held)}))
"""


@pytest.mark.process
def test_a_200000_row_export_sorted_in_runs_keeps_memory_bounded(
    root: ResultsRoot, results: Path, tmp_path: Path
) -> None:
    count = 200_000
    source = _big_table(root, count)
    sort_dir = tmp_path / "sort"
    sort_dir.mkdir()

    run = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(results), source, str(sort_dir)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip

    assert run.returncode == 0, run.stderr
    measured = json.loads(run.stdout)
    assert measured["rows"] == measured["held_rows"] == count
    mib = 1024 * 1024
    assert measured["grew"] < 30 * mib, measured  # the export's own peak growth
    assert measured["grew"] * 2 < measured["held"], measured  # well below holding the rows
    assert measured["seconds"] < 15, measured
    assert list(sort_dir.iterdir()) == []
    scores: list[float] = []
    nulls = 0
    with _host(results, measured["path"]).open(encoding="utf-8", newline="") as file:
        reader = csv.reader(file)
        assert next(reader) == ["id", "name", "score", "day"]
        for row in reader:
            if row[2] == "":
                nulls += 1
            else:
                assert nulls == 0, "a NULL came before a number"
                scores.append(float(row[2]))
    assert nulls == count // 1000
    assert len(scores) + nulls == count
    assert all(a >= b for a, b in itertools.pairwise(scores))


def test_a_table_file_is_streamed_not_read_whole(root: ResultsRoot) -> None:
    source = _big_table(root, 30_000)
    with open_table(root, source, max_bytes=MAX_BYTES) as table:
        assert (table.columns, table.row_count, table.shape) == (("id", "name", "score", "day"), 30_000, "table_file")
        tracemalloc.start()
        try:
            seen = sum(1 for _row in table.rows)
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert seen == 30_000
    assert peak < 3 * 1024 * 1024, f"peak {peak:,} bytes"  # holding the rows takes several times that


def test_the_description_says_by_path_and_leaves_filtering_to_sql() -> None:
    for phrase in ("by path", "never copy rows", "WHERE", "GROUP BY", "csv", "XLSX", "start", "count"):
        assert phrase.lower() in export_table_description(Policy()).lower()


def test_an_xlsx_over_the_sheet_row_limit_is_refused_before_writing(
    root: ResultsRoot, results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export_module, "XLSX_MAX_DATA_ROWS", 100)
    source = _write_json(results, "t.json", [{"a": i} for i in range(101)])
    with pytest.raises(InvalidToolArguments, match=r"at most 100 data rows.*would have 101"):
        _export(root, source=source, format="xlsx")
    assert _export(root, source=source, format="xlsx", start=1).rows == 100
    assert _export(root, source=source, format="csv").rows == 101


def test_values_excel_cannot_hold_exactly_are_written_as_text_or_utc_and_reported(
    root: ResultsRoot, results: Path
) -> None:
    lines = [
        header_line(["when", "day", "big"], ["datetime", "date", "integer"]).encode(),
        row_line(["2024-01-01T10:30:00+02:00", "1899-12-31", 12345678901234567]),
        row_line(["2024-01-01T10:30:00", "2024-02-29", 7]),
    ]
    source = root.create_file("spill/edge.table.jsonl", b"".join(lines))

    result = _export(root, source=source, format="xlsx")

    rows, _formulas = _xlsx_rows(_host(results, result.path))
    assert rows[1] == [dt.datetime(2024, 1, 1, 8, 30), "1899-12-31", "12345678901234567"]
    assert rows[2] == [dt.datetime(2024, 1, 1, 10, 30), dt.datetime(2024, 2, 29), 7]
    assert result.column_types == ["datetime", "date", "integer"]
    for note in ("1 datetime with a time zone written in UTC", "1 date before 1900", "1 integer of 16 or more"):
        assert note in result.message
    csv_result = _export(root, source=source, format="csv")
    assert _csv_rows(_host(results, csv_result.path))[1] == [
        "2024-01-01T10:30:00+02:00", "1899-12-31", "12345678901234567",
    ]  # fmt: skip
