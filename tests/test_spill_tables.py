"""Tables found in tool results, as real tools print them, and their typed line-oriented file."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import math
import time

import pytest

from sandbox_runtime.tables.cells import Cell
from sandbox_runtime.tables.jsonio import dumps_lines
from sandbox_runtime.tables.table import (
    Table,
    TableFileError,
    header_line,
    iter_table_file,
    recognise_table,
    row_line,
    table_file_bytes,
)


def _table(result: object) -> Table:
    found = recognise_table(result)
    assert isinstance(found, Table), found
    return found


def _round_trip(table: Table) -> list[list[Cell]]:
    data = table_file_bytes(table)
    header = header_line(table.columns, table.column_types).encode("utf-8", "surrogatepass")
    assert data == header + b"".join(row_line(row) for row in table.iter_rows())  # the fast cut is exact
    lines = io.StringIO(data.decode("utf-8", "surrogatepass"))
    return [row for _columns, _types, row in iter_table_file(lines)]


def test_a_321_row_json_result_is_a_table_of_321_typed_rows_that_reads_back_intact() -> None:
    records = [
        {
            "id": i,
            "library": f"libpthread.so.{i % 3}",
            "price": i * 1.25,
            "shipped": f"2026-11-{1 + i % 28:02d}",
            "note": None if i % 5 else "checked",
        }
        for i in range(321)
    ]
    table = _table(json.dumps(records))
    assert table.shape == "json_records"
    assert table.columns == ("id", "library", "price", "shipped", "note")
    assert table.column_types == ("integer", "string", "number", "date", "string")
    assert len(table.rows) == 321
    back = _round_trip(table)
    assert back == table.rows
    assert back[7] == [7, "libpthread.so.1", 8.75, dt.date(2026, 11, 8), None]
    assert isinstance(back[0][0], int)


def test_a_columns_and_rows_object_keeps_its_column_order_and_renames_duplicates() -> None:
    table = _table({"columns": ["name", "name", "", {"name": "total"}], "rows": [["a", "b", 1, 2.5], ["c", "d", 2, 3]]})
    assert table.columns == ("name", "name_2", "column_3", "total")
    assert table.column_types == ("string", "string", "integer", "number")
    assert len(table.notes) == 2


def test_a_table_with_ragged_rows_is_refused_with_the_row_named() -> None:
    reason = recognise_table({"columns": ["a", "b"], "rows": [[1, 2], [3]]})
    assert reason == "row 2 has 1 cells for 2 columns"


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("id,city,joined\n1,Oslo,2024-01-02\n2,,2024-03-04\n", "csv"),
        ("id\tcity\tjoined\n1\tOslo\t2024-01-02\n2\t\t2024-03-04\n", "tsv"),
    ],
)
def test_csv_and_tsv_text_become_typed_tables_with_empty_cells_as_null(text: str, shape: str) -> None:
    table = _table(text)
    assert table.shape == shape
    assert table.column_types == ("integer", "string", "date")
    assert table.rows == [[1, "Oslo", dt.date(2024, 1, 2)], [2, None, dt.date(2024, 3, 4)]]


def test_codes_with_leading_zeros_stay_text() -> None:
    table = _table("zip,count\n00501,3\n10001,4\n")
    assert table.column_types == ("string", "integer")
    assert table.rows[0] == ["00501", 3]


def test_a_markdown_table_is_recognised() -> None:
    table = _table("| host | port | up |\n|---|---:|:---:|\n| db1 | 5432 | true |\n| db2 | 5433 | false |\n")
    assert table.shape == "markdown"
    assert table.rows == [["db1", 5432, True], ["db2", 5433, False]]


def test_a_python_literal_list_of_dicts_is_parsed_without_eval() -> None:
    text = "[{'name': 'a', 'ok': True, 'size': None}, {'name': 'b', 'ok': False, 'size': 3}]"
    table = _table(text)
    assert table.shape == "python_records"
    assert table.rows == [["a", True, None], ["b", False, 3]]
    assert recognise_table("[__import__('os').system('true')]") != "never evaluated"
    assert not isinstance(recognise_table("[__import__('os').system('true')]"), Table)


@pytest.mark.parametrize(
    "text",
    ["[not json", '{"a": 1}', "just some words, with a comma", "[1, 2, 3]", "", "[NaN]", "a\nb"],
)
def test_text_that_is_not_a_table_gets_a_reason(text: str) -> None:
    assert isinstance(recognise_table(text), str)


def test_json_nested_100000_levels_deep_is_refused_quickly() -> None:
    started = time.monotonic()
    assert isinstance(recognise_table("[" * 100_000 + "]" * 100_000), str)
    assert isinstance(recognise_table("[{" * 50_000), str)
    assert time.monotonic() - started < 10


def test_nested_values_become_compact_json_text_and_mixed_numbers_are_numbers() -> None:
    table = _table([{"tags": ["a", "b"], "n": 1}, {"tags": {"k": 1}, "n": 2.5}, {"n": float("nan")}])
    assert table.rows == [['["a","b"]', 1], ['{"k":1}', 2.5], [None, None]]
    assert table.column_types == ("string", "number")


def test_a_file_that_is_not_a_table_file_is_a_clear_error() -> None:
    with pytest.raises(TableFileError, match="line 1"):
        list(iter_table_file(io.StringIO("{}\n")))
    header = json.dumps(
        {"format": "sandbox-runtime.table", "version": 1, "columns": ["a"], "column_types": ["integer"]}
    )
    with pytest.raises(TableFileError, match="line 3"):
        list(iter_table_file(io.StringIO(header + "\n[1]\n[1, 2]\n")))


def test_rows_are_read_one_at_a_time() -> None:
    header = json.dumps(
        {"format": "sandbox-runtime.table", "version": 1, "columns": ["n"], "column_types": ["integer"]}
    )
    lines = (f"[{i}]" if i else header for i in range(1_000_001))
    rows = iter_table_file(lines)
    assert next(rows)[2] == [1]
    assert sum(1 for _ in rows) == 999_999


@pytest.mark.parametrize("text", ["z" * 300_000, "a,b\n" + "x" * 200_000 + ",1\n"])
def test_very_long_lines_are_not_a_table_and_do_not_break_the_csv_reader(text: str) -> None:
    assert isinstance(recognise_table(text), str)


def test_values_from_a_database_cursor_keep_their_types() -> None:
    table = _table(
        {
            "columns": ["day", "at", "price", "other"],
            "rows": [
                [dt.date(2020, 1, 1), dt.datetime(2020, 1, 1, 5, 30), decimal.Decimal("1.50"), b"raw"],
                [None, "2020-01-02T00:00:00", decimal.Decimal(2), None],
            ],
        }
    )
    assert table.column_types == ("date", "datetime", "number", "string")
    assert _round_trip(table) == [
        [dt.date(2020, 1, 1), dt.datetime(2020, 1, 1, 5, 30), 1.5, "b'raw'"],
        [None, dt.datetime(2020, 1, 2), 2, None],
    ]


def test_row_lines_are_exact_even_when_text_holds_the_row_boundary() -> None:
    rows = [[1, "a"], [], [2, "x],[y"], [3, None]]
    assert dumps_lines(rows) == b'[1,"a"]\n[]\n[2,"x],[y"]\n[3,null]\n'
    assert dumps_lines([[1, "a"], [2, "b"]]) == b'[1,"a"]\n[2,"b"]\n'
    assert dumps_lines([]) == b""


def test_nan_and_infinities_become_null_with_or_without_other_nulls() -> None:
    table = _table({"columns": ["a", "b"], "rows": [[1.5, 1.0], [math.inf, None], [math.nan, -math.inf], [2, 3.0]]})
    assert table.column_types == ("number", "number")
    assert table.rows == [[1.5, 1.0], [None, None], [None, None], [2, 3.0]]
    huge = _table({"columns": ["x"], "rows": [[1e308], [1e308]]})  # the sum overflows; the values are finite
    assert huge.rows == [[1e308], [1e308]]
