"""JSON text on the fast path gives exactly the file the general path gives, or is handed to it."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from sandbox_runtime.spill.fast_json import SpillFile, fast_json_file
from sandbox_runtime.tables.jsonio import dumps_pretty, loads
from sandbox_runtime.tables.table import Table, recognise_table, table_file_bytes


def general(text: str) -> SpillFile:
    """What the general path writes for a JSON text: parsed, recognised, typed."""
    value = loads(text)
    found = recognise_table(value)
    if isinstance(found, Table):
        return SpillFile("table", table_file_bytes(found), found.row_count, found.columns, found.column_types)
    return SpillFile("json", dumps_pretty(value))


def same_table_both_ways(text: str) -> SpillFile:
    fast = fast_json_file(text)
    assert fast is not None, text[:200]
    assert fast == general(text), text[:200]
    return fast


# values a tool puts in a column, the awkward ones on purpose
CELLS: dict[str, list[Any]] = {
    "int": [0, -7, 2**40, 12345678901234567890123, None],
    "float": [0.5, -1e-9, 3.0, 1e300, None, 7],
    "bool": [True, False, None],
    "str": ["a", "", "],[", '{"x": 1}', 'quote " and \\ back', "ünïcödé ✓", "line\nbreak", "2026", None],
    "date": ["2026-11-30", "2024-02-29", "0001-01-01", None],
    "bad_date": ["2026-02-30", "2026-13-01"],
    "datetime": ["2026-11-30T10:00:00", "2026-11-30 10:00Z", "2026-11-30T10:00:00.5+02:00"],
    "week": ["2026-W01-1"],
    "nested": [[1, 2], {"k": "v"}, []],
}


def random_records(rng: random.Random) -> list[dict[str, Any]]:
    """A table whose columns draw from one or two kinds of cells, sometimes with keys missing from a record."""
    kinds = list(CELLS)
    columns = {
        f"c{i}" if rng.random() < 0.8 else rng.choice(["", "é", "k:1", "a b"]) + str(i): rng.sample(
            kinds, rng.choice([1, 1, 1, 2])
        )
        for i in range(rng.randint(1, 6))
    }
    records: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 40)):
        record: dict[str, Any] = {}
        for name, allowed in columns.items():
            if records and rng.random() < 0.05:
                continue  # a key missing from a later record is null there
            record[name] = rng.choice(CELLS[rng.choice(allowed)])
        records.append(record)
    return records


@pytest.mark.parametrize("seed", range(300))
def test_random_record_tables_give_the_same_file_on_both_paths(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311  (reproducible data, not secrets)
    records = random_records(rng)
    text = json.dumps(records, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, 2]))
    same_table_both_ways(text)


def test_a_column_checked_as_integers_that_meets_a_float_is_typed_again_untyped() -> None:
    text = json.dumps([{"n": 1, "d": "2026-01-01"}, {"n": 1.5, "d": "2026-01-02"}])
    fast = same_table_both_ways(text)
    assert fast.column_types == ("number", "date")
    assert fast.data.splitlines()[1:] == [b'[1,"2026-01-01"]', b'[1.5,"2026-01-02"]']


def test_datetimes_and_nested_cells_are_written_as_the_general_path_writes_them() -> None:
    text = json.dumps([{"at": "2026-11-30 10:00Z", "tags": ["a", "b"]}, {"at": None, "tags": {"k": 1}}] * 5)
    fast = same_table_both_ways(text)
    assert fast.column_types == ("datetime", "string")
    assert b'["2026-11-30T10:00:00+00:00","[\\"a\\",\\"b\\"]"]' in fast.data


def test_a_duplicate_key_keeps_its_last_value_as_json_parsers_do() -> None:
    fast = same_table_both_ways('[{"a": 1, "a": 2, "b": "x"}, {"b": "y", "a": 3}]')
    assert fast.data.splitlines()[1:] == [b'[2,"x"]', b'[3,"y"]']


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('[{"a": 1}, {"a": 2, "b": 3}]', "a key the first record lacks"),
        ('[{"a": 1}, 2]', "an item that is not a record"),
        ("[{'a': 1}, {'a': 2}]", "a Python literal"),
        ('[{"a": 1}, {"a": 2}', "not JSON"),
        ('[{"a": NaN}]', "NaN is not JSON"),
        ('[{"a": 1e400}]', "a number out of range"),
        ('[{"a": "\\ud800"}]', "a lone surrogate"),
        ("[{}, {}]", "a first record without keys"),
        ('[{"q\\"k": 1}]', "a key holding a quote"),
        ('{"columns": ["a"], "rows": [[1]], "note": "x"}', "a {columns, rows} table"),
        (json.dumps({"text": "数据复制错误" * 50}), "text made mostly of \\u escapes"),
        ("[" * 100_000 + "]" * 100_000, "nesting deeper than the decoder goes"),
        ("{" + '"a":{' * 5000 + "}" * 5001, "nesting deeper than the decoder goes"),
        ("   ", "no JSON at all"),
        ('"a string"', "a JSON string"),
    ],
)
def test_texts_the_fast_path_does_not_take_go_to_the_general_path(text: str, why: str) -> None:
    assert fast_json_file(text) is None, why


def test_other_json_is_reindented_one_value_per_line_with_values_spelled_as_written() -> None:
    text = '{"q":{"page":1},"items":[{"lib":"libpthread.so.0","n":1E5,"ok":true},[1,2],"a\\/b"],"empty":[]}'
    fast = fast_json_file(text)
    assert fast is not None
    assert fast.kind == "json"
    assert json.loads(fast.data) == json.loads(text)
    lines = fast.data.decode().splitlines()
    assert '      "lib": "libpthread.so.0",' in lines  # line tools find every value on its own line
    assert '      "n": 1E5,' in lines
    assert '    "a\\/b"' in lines
    assert '  "empty": []' in lines
    assert fast.data.endswith(b"}\n")


def test_a_top_level_array_that_is_not_records_is_reindented() -> None:
    fast = fast_json_file("[[1, 2], [3, 4]]")
    assert fast is not None
    assert fast == SpillFile("json", b"[\n  [\n    1,\n    2\n  ],\n  [\n    3,\n    4\n  ]\n]\n")


def test_an_integer_beyond_64_bits_keeps_every_digit_on_both_paths() -> None:
    big = 12345678901234567890123
    records = json.dumps([{"id": big, "n": 1}, {"id": -(2**64), "n": 2}])
    fast = same_table_both_ways(records)
    assert fast.data.splitlines()[1] == f"[{big},1]".encode()
    columns_rows = json.dumps({"columns": ["id"], "rows": [[big]]})  # a table the general path parses
    assert fast_json_file(columns_rows) is None
    assert general(columns_rows).data.splitlines()[1] == f"[{big}]".encode()


def test_json_text_holding_a_lone_surrogate_is_still_written_as_json() -> None:
    text = json.dumps({"name": "broken \ud800 text", "n": 1}, ensure_ascii=False)
    assert fast_json_file(text) is None
    assert json.loads(general(text).data.decode("utf-8", "surrogatepass")) == json.loads(text)


def test_escapes_are_kept_as_written_unless_they_make_up_most_of_the_text() -> None:
    sparse = json.dumps({"name": "Größe", "note": "plain ascii " * 10})  # json.dumps escapes non-ASCII
    fast = fast_json_file(sparse)
    assert fast is not None
    assert '  "name": "Gr\\u00f6\\u00dfe",' in fast.data.decode().splitlines()
    dense = json.dumps({"title": "数据复制错误" * 20, "n": 1})
    assert fast_json_file(dense) is None
    assert '  "title": "数据复制错误' in general(dense).data.decode()
