"""Bad and awkward results: each gives a correct file and descriptor, or a clear reason — never a crash or a loss."""

from __future__ import annotations

import datetime as dt
import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_runtime.policy import SpillPolicy
from sandbox_runtime.spill.spiller import SpillOutcome, spill_result
from sandbox_runtime.spill.streamed import TableStream
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tables.table import iter_table_file

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def root(tmp_path: Path) -> ResultsRoot:
    (tmp_path / "results").mkdir()
    return ResultsRoot(tmp_path / "results")


def spill(root: ResultsRoot, result: object, call_id: str = "c1") -> SpillOutcome:
    return spill_result(root, result, tool="upstream", call_id=call_id, policy=SpillPolicy(), now=NOW)


def written(root: ResultsRoot, outcome: SpillOutcome) -> bytes:
    assert outcome.descriptor is not None
    return (root.host_root / outcome.descriptor.path.removeprefix("/mnt/results/")).read_bytes()


def test_a_100_mb_result_is_saved_whole_and_the_model_sees_a_preview(root: ResultsRoot) -> None:
    text = "0123456789abcdef" * (100 * 1024 * 1024 // 16)
    outcome = spill(root, text)
    assert outcome.descriptor is not None
    assert outcome.descriptor.bytes == len(text)
    assert outcome.descriptor.chars == len(text)
    assert outcome.descriptor.truncated_inline
    assert len(outcome.text) < 3_000
    assert written(root, outcome) == text.encode()


def test_json_nested_100000_levels_is_kept_as_text(root: ResultsRoot) -> None:
    text = "[" * 100_000 + "]" * 100_000
    outcome = spill(root, text)
    assert outcome.descriptor is not None
    assert outcome.descriptor.format == "text"
    assert written(root, outcome) == text.encode()


def test_a_python_value_nested_too_deep_to_serialize_gives_a_reason_not_a_crash(root: ResultsRoot) -> None:
    value: list[object] = []
    for _ in range(100_000):
        value = [value]
    outcome = spill(root, value)
    assert "nested deeper than Python can serialize" in outcome.text


def test_invalid_utf8_bytes_are_replaced_and_nul_characters_kept(root: ResultsRoot) -> None:
    raw = b"caf\xe9 \xff\xfe ok\x00end " * 200
    outcome = spill(root, raw)
    data = written(root, outcome).decode("utf-8")
    assert "\ufffd" in data
    assert "\x00end" in data
    assert outcome.descriptor is not None
    assert outcome.descriptor.format == "text"


def test_text_that_only_looks_like_json_is_text(root: ResultsRoot) -> None:
    text = "[INFO] " + "{not json} " * 200
    outcome = spill(root, text)
    assert outcome.descriptor is not None
    assert outcome.descriptor.format == "text"
    assert written(root, outcome) == text.encode()


def test_lone_surrogates_in_json_survive_the_file(root: ResultsRoot) -> None:
    value = {"name": "broken \ud800 pair", "pad": "x" * 2_000}
    outcome = spill(root, value)
    assert json.loads(written(root, outcome).decode("utf-8", "surrogatepass")) == value


def test_ragged_rows_and_duplicate_column_names(root: ResultsRoot) -> None:
    ragged = {"columns": ["a", "b"], "rows": [[1, 2], [3]] * 300}
    outcome = spill(root, ragged, "ragged")
    assert outcome.descriptor is not None
    assert outcome.descriptor.format == "json"
    assert json.loads(written(root, outcome)) == ragged
    duplicated = {"columns": ["id", "id", ""], "rows": [[i, i * 2, "x"] for i in range(300)]}
    table = spill(root, duplicated, "dup")
    assert table.descriptor is not None
    assert table.descriptor.columns == ["id", "id_2", "column_3"]


def test_an_mcp_result_with_images_and_resources_names_them_and_keeps_the_text(root: ResultsRoot) -> None:
    result = {
        "content": [
            {"type": "text", "text": "report follows " + "r" * 1_000},
            {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo" * 100},
            {"type": "resource", "resource": {"uri": "file:///r.txt", "mimeType": "text/plain", "text": "line 1"}},
            {"type": "resource", "resource": {"uri": "file:///b.bin", "blob": "AAAA"}},
            {"type": "resource_link", "uri": "file:///big.csv", "name": "big.csv"},
        ]
    }
    text = written(root, spill(root, result)).decode()
    assert "[image: image/png, 1,100 base64 characters not shown]" in text
    assert "[resource file:///r.txt]\nline 1" in text
    assert "[resource file:///b.bin: binary, 4 base64 characters not shown]" in text
    assert "[resource_link file:///big.csv: big.csv]" in text
    assert "iVBORw0KGgo" not in text


def _rows(count: int) -> Iterator[tuple[int, str, float, str, None]]:
    return ((i, f"libpthread.so.{i % 7}", i * 0.25, "2026-01-02", None) for i in range(count))


def test_a_streamed_table_is_written_typed_with_memory_independent_of_its_row_count(root: ResultsRoot) -> None:
    peaks = []
    for count in (10_000, 100_000):
        tracemalloc.start()
        outcome = spill(root, TableStream(["id", "lib", "x", "day", "none"], _rows(count)), f"s{count}")
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert outcome.descriptor is not None
        assert outcome.descriptor.rows == count
        assert outcome.descriptor.column_types == ["integer", "string", "number", "date", "empty"]
    assert peaks[1] < 1.5 * peaks[0] + 1_000_000  # ten times the rows, about the same memory
    with (root.host_root / "spill" / "upstream-s10000.table.jsonl").open() as file:
        rows = [row for _c, _t, row in iter_table_file(file)]
    assert len(rows) == 10_000
    assert rows[3] == [3, "libpthread.so.3", 0.75, dt.date(2026, 1, 2), None]


def test_a_short_stream_is_shown_inline_and_a_ragged_stream_is_kept_with_its_reason(root: ResultsRoot) -> None:
    small = spill(root, TableStream(["a"], iter([[1], [2]])), "small")
    assert small.descriptor is None
    assert json.loads(small.text) == {"columns": ["a"], "rows": [[1], [2]]}
    ragged = spill(root, TableStream(["a", "b"], ([i, i] if i != 500 else [i] for i in range(1_000))), "ragged")
    assert ragged.descriptor is not None
    assert ragged.descriptor.format == "text"
    assert "row 501 has 1 cells for 2 columns" in ragged.text
    assert len(written(root, ragged).splitlines()) == 1_000
