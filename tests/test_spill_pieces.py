"""The pieces around a spill: the turn budget, spilled errors, history replay, the manifest and the state DB."""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from sandbox_runtime.errors import FileTooLarge, UnsafeFileType
from sandbox_runtime.models import ResultDescriptor, StoredResult
from sandbox_runtime.policy import SpillPolicy
from sandbox_runtime.spill.budget import BudgetCandidate, BudgetDecision, plan_turn_budget
from sandbox_runtime.spill.failures import shorten_error, spill_error
from sandbox_runtime.spill.history import rebuild_history
from sandbox_runtime.spill.manifest import record_in_manifest
from sandbox_runtime.spill.spiller import SpillOutcome, spill_result
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.state.records import ExpiredFile
from sandbox_runtime.store.safe_paths import ResultsRoot

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
POLICY = SpillPolicy()
ERROR_PATH = "/mnt/results/errors/run_python-call-7.txt"
CHAINED_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/mnt/results/job.py", line 3, in <module>\n'
    "    load()\n"
    "ValueError: first problem\n"
    "\n"
    "During handling of the above exception, another exception occurred:\n"
    "\n"
    "Traceback (most recent call last):\n"
    '  File "/mnt/results/job.py", line 5, in <module>\n'
    '    raise KeyError("amount")\n'
    "KeyError: 'amount'\n"
    "\n"
)


@pytest.fixture
def root(tmp_path: Path) -> ResultsRoot:
    (tmp_path / "results").mkdir()
    return ResultsRoot(tmp_path / "results", "/mnt/results")


@pytest.fixture
def db(tmp_path: Path) -> Iterator[StateDB]:
    state = StateDB(tmp_path / "s.sqlite3")
    yield state
    state.close()


def budget(sizes: Sequence[tuple[int, int | None]]) -> BudgetDecision:
    candidates = [BudgetCandidate(inline, stand_in) for inline, stand_in in sizes]
    return plan_turn_budget(candidates, budget_chars=200_000, floor_chars=5_000)


def test_a_300000_character_turn_gives_way_largest_first_until_it_fits_200000() -> None:
    inline = [29_000, 31_000, 30_000, 32_000, 28_000, 30_000, 31_000, 29_000, 30_000, 30_000]
    decision = budget([(n, 2_500) for n in inline])
    assert decision.total_before_chars == 300_000
    # 32,000 (#3), both 31,000 (#1, #6), then the first of the four 30,000 results (#2)
    assert decision.replace == (1, 2, 3, 6)
    assert decision.total_after_chars == 186_000
    assert decision.total_after_chars <= 200_000
    assert not decision.over_budget


def test_equal_results_give_way_in_the_order_they_came() -> None:
    decision = budget([(30_000, 2_500)] * 10)
    assert decision.replace == (0, 1, 2, 3)
    assert decision.total_after_chars == 190_000


def test_results_under_the_floor_are_never_chosen_even_when_the_turn_stays_over_budget() -> None:
    decision = budget([(5_000, 100)] + [(4_999, 100)] * 50)
    assert decision.replace == (0,)  # exactly at the floor may give way; 4,999 never does
    assert decision.total_after_chars == decision.total_before_chars - 4_900
    assert decision.over_budget


def test_results_that_cannot_be_replaced_are_never_chosen() -> None:
    decision = budget([(100_000, None), (100_000, None), (60_000, 2_000)])
    assert decision.replace == (2,)
    assert decision.total_after_chars == 202_000
    assert decision.over_budget


def test_a_turn_under_budget_replaces_nothing() -> None:
    decision = budget([(19_000, 2_500)] * 10)
    assert decision.replace == ()
    assert decision.total_before_chars == decision.total_after_chars == 190_000
    assert not decision.over_budget


def test_the_same_turn_always_makes_the_same_choice() -> None:
    sizes = [(30_000 + (i * 7919) % 5_000, 2_500) for i in range(10)]
    assert budget(sizes) == budget(sizes) == budget(list(sizes))


def test_a_stand_in_not_shorter_than_the_result_is_never_chosen() -> None:
    decision = budget([(150_000, 150_000), (120_000, 130_000), (100_000, 2_000)])
    assert decision.replace == (2,)
    assert decision.total_after_chars == 272_000
    assert decision.over_budget


def test_a_long_traceback_is_shortened_to_its_first_line_its_exception_line_and_the_path() -> None:
    text = shorten_error(CHAINED_TRACEBACK, ERROR_PATH, keep_whole_chars=50)
    lines = text.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[2] == "KeyError: 'amount'"  # the last exception, not the blank line or "During handling"
    assert "During handling" not in text
    assert f"Full error ({len(CHAINED_TRACEBACK):,} characters, " in lines[-1]
    assert ERROR_PATH in lines[-1]


def test_the_shortened_error_counts_the_lines_of_a_traceback_without_blank_lines() -> None:
    error = 'Traceback (most recent call last):\n  File "/x.py", line 1, in <module>\nZeroDivisionError: division\n'
    text = shorten_error(error, ERROR_PATH, keep_whole_chars=10)
    assert f"Full error ({len(error):,} characters, 3 lines): {ERROR_PATH}" in text


def test_the_shortened_error_gives_the_line_count_of_the_whole_file_blank_lines_included() -> None:
    text = shorten_error(CHAINED_TRACEBACK, ERROR_PATH, keep_whole_chars=50)
    assert f"{len(CHAINED_TRACEBACK.splitlines()):,} lines)" in text  # 12 lines, the file read_file pages through


def test_a_short_error_is_shown_whole_with_its_path() -> None:
    text = shorten_error("NameError: name 'x' is not defined\n", ERROR_PATH, keep_whole_chars=1000)
    assert text.startswith("NameError: name 'x' is not defined\nFull error (35 characters, ")
    assert text.endswith(f"{ERROR_PATH} \u2014 read it with read_file.")


def test_a_failed_call_writes_its_exact_error_to_the_errors_folder(root: ResultsRoot) -> None:
    error = CHAINED_TRACEBACK + "caf\u00e9 \U0001f600 " * 500
    outcome = spill_error(root, error, tool="run_python", call_id="call-7", keep_whole_chars=1000, max_chars=5000)
    assert outcome.error_path == ERROR_PATH
    assert outcome.warning is None
    assert (root.host_root / "errors" / "run_python-call-7.txt").read_bytes() == error.encode("utf-8")
    assert ERROR_PATH in outcome.text
    assert outcome.text.startswith("Traceback (most recent call last):\n")


def test_a_planted_link_at_the_error_file_keeps_the_error_inline_and_marked_not_saved(
    root: ResultsRoot, tmp_path: Path
) -> None:
    host_file = tmp_path / "host.txt"
    host_file.write_text("host secret\n")
    (root.host_root / "errors").mkdir()
    os.symlink(host_file, root.host_root / "errors" / "run_python-call-7.txt")
    error = "E" * 10_000
    outcome = spill_error(root, error, tool="run_python", call_id="call-7", keep_whole_chars=1000, max_chars=3000)
    assert outcome.error_path is None
    assert outcome.warning is not None
    assert outcome.text.startswith("E" * 3000 + "\n[not saved to a file (only the first 3,000 of 10,000")
    assert "E" * 3001 not in outcome.text
    assert host_file.read_text() == "host secret\n"


def test_the_same_failed_call_twice_reuses_its_error_file(root: ResultsRoot) -> None:
    first = spill_error(root, "x" * 2000, tool="run_python", call_id="call-7", keep_whole_chars=100, max_chars=500)
    second = spill_error(root, "x" * 2000, tool="run_python", call_id="call-7", keep_whole_chars=100, max_chars=500)
    assert first == second
    assert second.error_path == ERROR_PATH
    assert [p.name for p in (root.host_root / "errors").iterdir()] == ["run_python-call-7.txt"]


def conversation_of_every_shape() -> list[object]:
    return [
        {"role": "user", "content": "look it up"},
        {"role": "tool", "tool_call_id": "chat-1", "content": "fresh chat output"},
        {"type": "function_call_output", "call_id": "resp-1", "output": "fresh responses output"},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "anth-1", "content": "fresh anthropic output"},
                {"type": "text", "text": "and?"},
            ],
        },
        {"role": "tool", "tool_call_id": "never-seen", "content": "kept as is"},
        "not a dict",
    ]


DECIDED = {"chat-1": "stored chat", "resp-1": "stored responses", "anth-1": "stored anthropic"}


def test_every_message_shape_is_replayed_with_its_stored_text() -> None:
    rebuilt = rebuild_history(conversation_of_every_shape(), DECIDED)
    assert rebuilt[1] == {"role": "tool", "tool_call_id": "chat-1", "content": "stored chat"}
    assert rebuilt[2] == {"type": "function_call_output", "call_id": "resp-1", "output": "stored responses"}
    assert rebuilt[3]["content"][0] == {"type": "tool_result", "tool_use_id": "anth-1", "content": "stored anthropic"}
    assert rebuilt.replayed == ["chat-1", "resp-1", "anth-1"]


def test_unknown_call_ids_and_other_messages_are_kept_and_reported() -> None:
    messages = conversation_of_every_shape()
    rebuilt = rebuild_history(messages, DECIDED)
    assert rebuilt[0] == messages[0]
    assert rebuilt[3]["content"][1] == {"type": "text", "text": "and?"}
    assert rebuilt[4] == {"role": "tool", "tool_call_id": "never-seen", "content": "kept as is"}
    assert rebuilt[5] == "not a dict"
    assert rebuilt.unknown == ["never-seen"]


def test_the_hosts_message_list_is_never_changed() -> None:
    messages = conversation_of_every_shape()
    before = copy.deepcopy(messages)
    rebuilt = rebuild_history(messages, DECIDED)
    assert messages == before
    rebuilt[3]["content"][1]["text"] = "edited copy"
    assert messages == before


def test_replayed_text_with_astral_characters_and_lone_surrogates_survives_byte_for_byte() -> None:
    odd = "\U0001f600 \U00020000 \ud800 \udfff \x00 end"
    rebuilt = rebuild_history([{"role": "tool", "tool_call_id": "c", "content": "x"}], {"c": odd})
    assert rebuilt[0]["content"].encode("utf-8", "surrogatepass") == odd.encode("utf-8", "surrogatepass")


def test_the_rebuilt_history_is_a_plain_list_that_serialises_to_json() -> None:
    rebuilt = rebuild_history(conversation_of_every_shape(), {**DECIDED, "chat-1": "\U0001f600 \u6570\u636e"})
    assert isinstance(rebuilt, list)
    assert json.loads(json.dumps(rebuilt))[1]["content"] == "\U0001f600 \u6570\u636e"


def descriptor(path: str = "/mnt/results/spill/sql_query-call-1.table.jsonl") -> ResultDescriptor:
    return ResultDescriptor(
        path=path,
        format="table",
        bytes=1234,
        chars=1200,
        sha256="ab" * 32,
        rows=3,
        columns=["id", "name"],
        column_types=["integer", "string"],
        preview="id,name",
        truncated_inline=False,
        expires_at="2026-12-07T12:00:00+00:00",
    )


def record(root: ResultsRoot, *, call_id: str = "call-1", max_bytes: int = 1 << 20) -> str | None:
    return record_in_manifest(
        root,
        descriptor(),
        stem=f"sql_query-{call_id}",
        tool="sql_query",
        call_id=call_id,
        created_at="2026-11-30T12:00:00+00:00",
        max_bytes=max_bytes,
    )


def test_each_spill_adds_one_json_line_describing_it(root: ResultsRoot) -> None:
    assert record(root, call_id="call-1") is None
    assert record(root, call_id="call-2") is None
    lines = (root.host_root / "manifest.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0]) == {
        "id": "sql_query-call-1",
        "tool": "sql_query",
        "call_id": "call-1",
        "created": "2026-11-30T12:00:00+00:00",
        "expires": "2026-12-07T12:00:00+00:00",
        "path": "/mnt/results/spill/sql_query-call-1.table.jsonl",
        "format": "table",
        "bytes": 1234,
        "chars": 1200,
        "rows": 3,
        "columns": ["id", "name"],
        "sha256": "ab" * 32,
    }
    assert json.loads(lines[1])["call_id"] == "call-2"


def test_a_manifest_replaced_by_a_link_to_a_host_file_gives_a_warning_and_leaves_the_host_file_alone(
    root: ResultsRoot, tmp_path: Path
) -> None:
    host_file = tmp_path / "passwd"
    host_file.write_text("root:x:0:0\n")
    os.symlink(host_file, root.host_root / "manifest.jsonl")
    warning = record(root)
    assert warning is not None
    assert "manifest.jsonl" in warning
    assert host_file.read_text() == "root:x:0:0\n"


def test_a_manifest_hard_linked_to_a_host_file_is_refused(root: ResultsRoot, tmp_path: Path) -> None:
    host_file = tmp_path / "host.txt"
    host_file.write_text("host data\n")
    os.link(host_file, root.host_root / "manifest.jsonl")
    with pytest.raises(UnsafeFileType):
        root.append_bytes("manifest.jsonl", b"x\n", max_bytes=1 << 20)
    assert record(root) is not None
    assert host_file.read_text() == "host data\n"


def test_a_manifest_at_its_cap_gives_a_warning_and_does_not_grow(root: ResultsRoot) -> None:
    manifest = root.host_root / "manifest.jsonl"
    manifest.write_bytes(b"{}\n" * 100)
    with pytest.raises(FileTooLarge):
        root.append_bytes("manifest.jsonl", b"x", max_bytes=300)
    assert record(root, max_bytes=300) is not None
    assert manifest.stat().st_size == 300


@pytest.mark.timeout(5)
def test_a_fifo_at_the_manifest_name_is_refused_without_blocking(root: ResultsRoot) -> None:
    os.mkfifo(root.host_root / "manifest.jsonl")
    with pytest.raises(UnsafeFileType):
        root.append_bytes("manifest.jsonl", b"x\n", max_bytes=1 << 20)
    assert record(root) is not None


def spill(root: ResultsRoot, result: object, call_id: str = "call-1") -> SpillOutcome:
    return spill_result(root, result, tool="sql_query", call_id=call_id, policy=POLICY, now=NOW)


def manifest_lines(root: ResultsRoot) -> list[dict[str, object]]:
    return [json.loads(line) for line in (root.host_root / "manifest.jsonl").read_text().splitlines()]


def test_a_new_spill_is_listed_in_the_manifest_once(root: ResultsRoot) -> None:
    outcome = spill(root, "y" * 5000)
    assert outcome.descriptor is not None
    entries = manifest_lines(root)
    assert len(entries) == 1
    assert entries[0]["path"] == outcome.descriptor.path
    assert entries[0]["created"] == "2026-11-30T12:00:00+00:00"


def test_spilling_the_same_result_again_adds_no_manifest_line(root: ResultsRoot) -> None:
    spill(root, "y" * 5000)
    again = spill(root, "y" * 5000)
    assert again.descriptor is not None
    assert len(manifest_lines(root)) == 1


@pytest.mark.parametrize("length", [5_000, 300_000])
def test_every_spilled_result_has_a_stand_in_with_its_path_and_a_2000_character_preview(
    root: ResultsRoot, length: int
) -> None:
    text = "".join(chr(0x41 + i % 26) for i in range(length))
    outcome = spill(root, text)
    assert outcome.descriptor is not None
    assert outcome.stand_in is not None
    assert outcome.descriptor.path in outcome.stand_in
    assert outcome.stand_in.endswith("The first 2,000 characters:\n" + text[:2000])
    assert text[:2001] not in outcome.stand_in


def test_a_300000_character_cjk_result_shows_exactly_2000_whole_characters_of_preview(root: ResultsRoot) -> None:
    # BMP ideographs alternate with ideographs beyond the BMP (four UTF-8 bytes, two UTF-16 units each)
    text = "".join(chr(0x4E00 + i % 500) if i % 2 else chr(0x20000 + i % 500) for i in range(300_000))
    outcome = spill(root, text)
    assert outcome.descriptor is not None
    assert outcome.descriptor.truncated_inline
    assert outcome.text != text
    assert outcome.descriptor.path in outcome.text
    assert outcome.text.endswith("\n" + text[:2000])
    assert len(re.findall("[\u4e00-\u9fff\U00020000-\U0002a6df]", outcome.text)) == 2000


def stored(call_id: str, text: str, conversation_id: str = "conv-1") -> StoredResult:
    return StoredResult(
        conversation_id=conversation_id,
        call_id=call_id,
        tool="sql_query",
        turn_id="turn-1",
        decided_at=1_700_000_000.0,
        is_error=False,
        replaced=False,
        text=text,
        descriptor=None,
        error_path=None,
    )


def test_a_call_id_keeps_its_first_decision(db: StateDB) -> None:
    assert db.store_results([stored("call-1", "first text")])["call-1"].text == "first text"
    again = db.store_results([stored("call-1", "second text")])
    assert again["call-1"].text == "first text"
    assert db.stored_results("conv-1")["call-1"].text == "first text"


ODD_TEXTS = {
    "surrogates": "lone \ud800 and \udfff and a split pair \ud83d\ude00",
    "real-pair": "\U0001f600 beside \ud83d\ude00",
    "nul": "before\x00after\x00",
}


def test_texts_with_lone_surrogates_and_nul_round_trip_exactly(db: StateDB) -> None:
    back = db.store_results([stored(call_id, text) for call_id, text in ODD_TEXTS.items()])
    assert {call_id: r.text for call_id, r in back.items()} == ODD_TEXTS
    assert len(back["real-pair"].text) == len(ODD_TEXTS["real-pair"])  # a split pair is never joined


def test_stored_texts_are_identical_after_closing_and_reopening_the_db(tmp_path: Path) -> None:
    first = StateDB(tmp_path / "s.sqlite3")
    first.store_results([stored(call_id, text) for call_id, text in ODD_TEXTS.items()])
    first.close()
    reopened = StateDB(tmp_path / "s.sqlite3")
    try:
        back = reopened.stored_results("conv-1")
    finally:
        reopened.close()
    assert {call_id: r.text for call_id, r in back.items()} == ODD_TEXTS
    assert back["nul"] == stored("nul", ODD_TEXTS["nul"])


def test_an_expired_file_is_remembered_with_when_it_was_removed(db: StateDB) -> None:
    gone = ExpiredFile(
        conversation_id="conv-1", path="/mnt/results/spill/a.txt", bytes=42, modified_at=1.5, removed_at=9.25
    )
    db.record_expired([gone])
    assert db.expired_file("conv-1", "/mnt/results/spill/a.txt") == gone
    assert db.expired_file("conv-1", "/mnt/results/spill/b.txt") is None
    assert db.expired_file("conv-2", "/mnt/results/spill/a.txt") is None


def test_forgetting_a_conversation_removes_its_stored_results_only(db: StateDB) -> None:
    db.ensure_conversation("conv-1", "measured", 1 << 30)
    db.ensure_conversation("conv-2", "measured", 1 << 30)
    db.store_results([stored("call-1", "one"), stored("call-2", "two", conversation_id="conv-2")])
    db.forget_conversation("conv-1")
    assert db.stored_results("conv-1") == {}
    assert db.conversation("conv-1") is None
    assert db.stored_results("conv-2")["call-2"].text == "two"
