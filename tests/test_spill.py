"""Spilling tool results: the file exists before the model sees anything, with a descriptor that says what it is."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest

from sandbox_runtime.policy import SpillPolicy
from sandbox_runtime.spill.spiller import SpillOutcome, spill_result
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tables.cells import clean_column
from sandbox_runtime.tables.table import iter_table_file

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
POLICY = SpillPolicy()


@pytest.fixture
def root(tmp_path: Path) -> ResultsRoot:
    (tmp_path / "spill").mkdir()
    return ResultsRoot(tmp_path)


def spill(root: ResultsRoot, result: object, call_id: str = "call-1", policy: SpillPolicy = POLICY) -> SpillOutcome:
    return spill_result(root, result, tool="sql_query", call_id=call_id, policy=policy, now=NOW)


def test_a_result_under_1000_characters_passes_through_with_no_file(root: ResultsRoot) -> None:
    outcome = spill(root, "x" * 999)
    assert outcome.text == "x" * 999
    assert outcome.descriptor is None
    assert list((root.host_root / "spill").iterdir()) == []


def test_a_result_of_1000_characters_is_saved_first_and_described(root: ResultsRoot) -> None:
    outcome = spill(root, "é" * 1000)  # characters, not bytes: 2,000 bytes
    d = outcome.descriptor
    assert d is not None
    assert d.path == "/mnt/results/spill/sql_query-call-1.txt"
    assert (d.format, d.chars, d.bytes, d.truncated_inline) == ("text", 1000, 2000, False)
    assert (root.host_root / "spill" / "sql_query-call-1.txt").read_text() == "é" * 1000
    assert d.expires_at == "2026-12-07T12:00:00+00:00"
    assert outcome.text.startswith("é" * 1000)
    assert d.path in outcome.text


def test_an_mcp_result_with_json_in_its_text_is_written_as_json_one_value_per_line(root: ResultsRoot) -> None:
    payload = {"frames": [{"lib": "libpthread.so.0", "frame": f"os_thr_id@entry={i}"} for i in range(40)], "n": 40}
    mcp = {"content": [{"type": "text", "text": json.dumps(payload)}], "isError": False}
    d = spill(root, mcp).descriptor
    assert d is not None
    assert d.format == "json"
    written = (root.host_root / "spill" / "sql_query-call-1.json").read_text()
    assert json.loads(written) == payload
    assert '"lib": "libpthread.so.0",' in written.splitlines()[3]  # line tools find values


def test_structured_content_wins_over_the_text_blocks(root: ResultsRoot) -> None:
    mcp = {"content": [{"type": "text", "text": "see structured"}], "structuredContent": {"v": "x" * 2000}}
    d = spill(root, mcp).descriptor
    assert d is not None
    assert json.loads((root.host_root / "spill" / "sql_query-call-1.json").read_text()) == {"v": "x" * 2000}


def test_a_321_row_table_result_is_described_with_its_rows_and_columns(root: ResultsRoot) -> None:
    rows = [{"id": i, "name": f"item {i}", "price": i / 4, "day": "2026-11-30"} for i in range(321)]
    d = spill(root, rows).descriptor
    assert d is not None
    assert (d.format, d.rows, d.columns) == ("table", 321, ["id", "name", "price", "day"])
    assert d.column_types == ["integer", "string", "number", "date"]
    with open(root.host_root / "spill" / "sql_query-call-1.table.jsonl") as handle:
        back = [row for _c, _t, row in iter_table_file(handle)]
    assert len(back) == 321
    assert back[5] == [5, "item 5", 1.25, dt.date(2026, 11, 30)]


def test_above_the_inline_cap_the_model_sees_a_2000_character_preview_even_of_cjk_text(root: ResultsRoot) -> None:
    text = "数据" * 150_000  # 300,000 characters: about 75,000 tokens by the estimate, over the 50,000 cap
    outcome = spill(root, text)
    d = outcome.descriptor
    assert d is not None
    assert d.truncated_inline
    assert d.preview == text[:2000]
    assert len(d.preview) == 2000
    assert d.path in outcome.text
    assert len(outcome.text) < 3000
    assert (root.host_root / "spill" / "sql_query-call-1.txt").read_text() == text  # one cut, nothing lost


def test_the_same_input_gives_the_same_bytes_and_words_and_is_never_saved_twice(root: ResultsRoot) -> None:
    first = spill(root, "y" * 5000)
    second = spill(root, "y" * 5000)
    assert first == second
    assert len(list((root.host_root / "spill").iterdir())) == 1


def test_a_failed_spill_never_fails_the_call(root: ResultsRoot, tmp_path: Path) -> None:
    os.symlink("/etc/passwd", root.host_root / "spill" / "sql_query-call-9.txt")  # planted by the sandbox
    outcome = spill(root, "z" * 300_000, call_id="call-9")
    assert outcome.descriptor is None
    assert outcome.warning is not None
    assert "not saved" in outcome.text
    # inline, but within the inline cap (50,000 tokens ~ 200,000 characters) and saying what was left out
    assert outcome.text.startswith("z" * POLICY.inline_cap_chars + "\n[not saved to a file (only the first 200,000")
    assert len(outcome.text) < POLICY.inline_cap_chars + 500


def test_odd_tool_and_call_names_give_safe_file_names(root: ResultsRoot) -> None:
    outcome = spill_result(root, "q" * 1000, tool="up/../../etc", call_id="a b\n", policy=POLICY, now=NOW)
    assert outcome.descriptor is not None
    assert outcome.descriptor.path == "/mnt/results/spill/up_.._.._etc-a_b-85a675a5.txt"
    # a call id that only differs in the characters replaced gets its own file, never another call's
    other = spill_result(root, "r" * 1000, tool="up/../../etc", call_id="a_b_", policy=POLICY, now=NOW)
    assert other.descriptor is not None
    assert other.descriptor.path != outcome.descriptor.path


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["2026-01-05", "2026-02-28"], "date"),
        (["2026-01-05", "2026-W01-1"], "string"),  # an ISO week date is not YYYY-MM-DD
        (["2026-01-05", "20260105"], "string"),
        (["2026-01-05", "2026-02-30"], "string"),  # looks like a date, is not one
        (["2026-01-05", None], "date"),
    ],
)
def test_only_real_yyyy_mm_dd_dates_make_a_date_column(values: list[str | None], expected: str) -> None:
    column = list(values)
    assert clean_column(column) == expected
    if expected == "string":
        assert column == values  # the text is kept as it was
