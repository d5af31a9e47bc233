"""Issue 3's scenario: a conversation whose tool results go to files before the model sees them.

Real Docker, real files, a real state database; the runtime is restarted where the story needs it.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from sandbox_runtime import HostResult, PathExpired, ToolCall
from sandbox_runtime.policy import policy_from_mapping
from sandbox_runtime.tables.table import iter_table_file
from tests.conftest import RuntimeFactory

DAY_S = 86400.0


@pytest.fixture
def runtime_factory(fake_runtime_factory: RuntimeFactory) -> RuntimeFactory:
    """Results the host hands in need no sandbox: the fake backend (no engine); the tests that run scripts ask
    for ``docker_runtime_factory``."""
    return fake_runtime_factory


def _host_file(results: Path, sandbox_path: str) -> Path:
    return results / sandbox_path.removeprefix("/mnt/results/")


def test_a_turn_of_ten_large_results_is_brought_under_the_budget_largest_first(
    docker_runtime_factory: RuntimeFactory,
) -> None:
    conversation = docker_runtime_factory().conversation("budget")
    sizes = [29_000 + 250 * i for i in range(8)]  # 29,000 .. 30,750 characters from the host's own tools
    items: list[ToolCall | HostResult] = [
        HostResult(tool="search", call_id=f"s{i}", result=f"{i}" * size) for i, size in enumerate(sizes)
    ]
    # two of the ten run in the sandbox, in parallel with each other
    items += [
        ToolCall(tool="run_python", arguments={"code": f"print('p' * {31_000 + i})"}, call_id=f"py{i}")
        for i in range(2)
    ]
    items += [HostResult(tool="lookup", call_id="small", result="k" * 4_999)]  # under the floor: never replaced
    report = conversation.run_turn(items)

    assert report.total_before_chars > 300_000
    assert report.total_after_chars <= 200_000
    assert not report.over_budget
    by_id = {o.call_id: o for o in report.outcomes}
    assert [o.call_id for o in report.outcomes] == [item.call_id for item in items]  # the order given
    replaced = report.replaced_call_ids
    # largest first: the two runs (~31,000 characters), then the largest searches
    assert {"py0", "py1"} <= set(replaced)
    assert set(replaced) - {"py0", "py1"} == {f"s{i}" for i in range(8 - (len(replaced) - 2), 8)}
    kept_sizes = [len(by_id[f"s{i}"].text) for i in range(8) if f"s{i}" not in replaced]
    assert all(len(by_id[r].text) < min(kept_sizes) for r in replaced)
    assert by_id["small"].text.startswith("k" * 4_999)
    assert not by_id["small"].replaced
    for call_id in replaced:
        outcome = by_id[call_id]
        assert outcome.replaced
        assert outcome.descriptor is not None
        assert outcome.descriptor.truncated_inline
        assert outcome.descriptor.path in outcome.text
        assert len(outcome.descriptor.preview) == 2_000
    # nothing was lost: every spilled file holds the whole result
    results = conversation.folders.results
    for i, size in enumerate(sizes):
        descriptor = by_id[f"s{i}"].descriptor
        assert descriptor is not None
        assert _host_file(results, descriptor.path).read_text() == f"{i}" * size


def test_a_321_row_table_spills_with_its_shape_and_reads_back_typed(docker_runtime_factory: RuntimeFactory) -> None:
    conversation = docker_runtime_factory().conversation("table")
    code = (
        "import json, datetime\n"
        "rows = [{'id': i, 'library': f'libpthread.so.{i % 3}', 'size_kb': i * 1.5, "
        "'built': str(datetime.date(2026, 1, 1) + datetime.timedelta(days=i)), 'note': None if i % 7 else 'x'}\n"
        "        for i in range(321)]\n"
        "print(json.dumps(rows))\n"
    )
    outcome = conversation.call("run_python", {"code": code}, call_id="rows")
    assert not outcome.is_error
    descriptor = outcome.descriptor
    assert descriptor is not None
    assert descriptor.format == "table"
    assert descriptor.rows == 321
    assert descriptor.columns == ["id", "library", "size_kb", "built", "note"]
    assert descriptor.column_types == ["integer", "string", "number", "date", "string"]
    assert "321 rows" in outcome.text
    assert descriptor.path in outcome.text
    with _host_file(conversation.folders.results, descriptor.path).open() as file:
        rows = [row for _columns, _types, row in iter_table_file(file)]
    assert len(rows) == 321
    assert rows[5][:3] == [5, "libpthread.so.2", 7.5]  # the value exactly, never "retyped"
    assert rows[6][4] is None
    assert rows[7][4] == "x"


def test_an_mcp_json_in_text_result_is_written_one_value_per_line(runtime_factory: RuntimeFactory) -> None:
    conversation = runtime_factory().conversation("mcp")
    payload = {"issues": [{"id": n, "title": f"crash in os_thr_id@entry={232155 + n}"} for n in range(60)]}
    mcp_result = {"content": [{"type": "text", "text": json.dumps(payload)}], "isError": False}
    outcome = conversation.submit("tracker__search", "m1", mcp_result)
    assert outcome.descriptor is not None
    assert outcome.descriptor.format == "json"
    host_file = _host_file(conversation.folders.results, outcome.descriptor.path)
    mode = host_file.stat()
    assert (stat.S_IMODE(mode.st_mode), mode.st_uid) == (0o600, 10001)  # private, and the sandbox user's
    written = host_file.read_text()
    assert json.loads(written) == payload
    assert '      "title": "crash in os_thr_id@entry=232155"' in written.splitlines()
    assert max(len(line) for line in written.splitlines()) < 80


def test_a_cjk_result_gets_a_preview_of_two_thousand_characters(runtime_factory: RuntimeFactory) -> None:
    conversation = runtime_factory().conversation("cjk")
    text = "数据路径绕过模型输出。" * 25_000  # 275,000 characters, over the inline cap of ~200,000
    outcome = conversation.submit("fetch", "cjk1", text)
    assert outcome.replaced
    assert outcome.descriptor is not None
    assert outcome.descriptor.preview == text[:2_000]
    assert outcome.text.endswith(text[:2_000])
    assert len(outcome.text) < 2_600


def test_history_rebuilt_after_a_restart_is_byte_identical(runtime_factory: RuntimeFactory, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    first = runtime_factory(state_dir=state_dir)
    conversation = first.conversation("history")
    turn = conversation.run_turn(
        [HostResult(tool="search", call_id=f"h{i}", result="é🙂" * (20_000 + 10_000 * i)) for i in range(6)]
    )
    given = {o.call_id: o.text for o in turn.outcomes}
    assert turn.replaced_call_ids  # some were replaced by stand-ins
    messages = [{"role": "tool", "tool_call_id": call_id, "content": "(the host's own copy)"} for call_id in given]
    first.close()

    stricter = policy_from_mapping({"spill": {"threshold_chars": 10, "turn_budget_chars": 10_000}})
    second = runtime_factory(stricter, state_dir=state_dir)  # a restart, under another policy
    rebuilt = second.conversation("history").rebuild_history(messages)
    assert [m["content"] for m in rebuilt] == list(given.values())
    assert rebuilt.replayed == list(given)
    # the same call again is not run or spilled again: its first decision comes back
    again = second.conversation("history").submit("search", "h0", "something else")
    assert again.replayed
    assert again.text == given["h0"]


def test_a_spill_into_a_full_disk_still_succeeds(docker_runtime_factory: RuntimeFactory) -> None:
    policy = policy_from_mapping({"store": {"quota_bytes": 16 * 1024 * 1024, "quota_mode": "loop"}})
    conversation = docker_runtime_factory(policy).conversation("full")
    fill = (
        "import os\n"
        "fd = os.open('/mnt/results/fill', os.O_WRONLY | os.O_CREAT)\n"
        "for size in (1 << 20, 1 << 12):\n"
        "    try:\n"
        "        while True:\n"
        "            os.write(fd, b'x' * size)\n"
        "            os.fsync(fd)\n"
        "    except OSError:\n"
        "        pass\n"
    )
    conversation.call("run_python", {"code": fill}, call_id="fill")
    outcome = conversation.submit("search", "after-full", "z" * 50_000)
    assert not outcome.is_error
    assert outcome.descriptor is None
    assert outcome.warnings
    assert outcome.text.startswith("z" * 50_000)
    assert "[not saved to a file" in outcome.text
    assert (
        conversation.rebuild_history([{"role": "tool", "tool_call_id": "after-full", "content": ""}])[0]["content"]
        == outcome.text
    )


def test_an_expired_path_gives_a_clear_error(docker_runtime_factory: RuntimeFactory) -> None:
    runtime = docker_runtime_factory()
    conversation = runtime.conversation("expiry")
    spilled = conversation.submit("logs", "q1", "\n".join(f"line {i}: libpthread.so.0 loaded" for i in range(500)))
    assert spilled.descriptor is not None
    path = spilled.descriptor.path
    script = conversation.call("run_python", {"code": "print(open('" + path + "').read()[:10])"}, call_id="ok")
    assert script.text.startswith("line 0: ")
    runtime.expire_files(now=time.time() + 8 * DAY_S)
    assert not _host_file(conversation.folders.results, path).exists()

    read = conversation.call("read_file", {"path": path}, call_id="late-read")
    assert read.is_error
    assert "has expired" in read.text
    assert "Re-run the query" in read.text
    assert PathExpired.__name__ in read.text
    with pytest.raises(FileNotFoundError):
        _host_file(conversation.folders.results, path).read_text()


def test_retention_removes_old_spill_error_and_argument_files_only(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory()
    conversation = runtime.conversation("retention")
    old = conversation.submit("search", "old", "o" * 2_000)
    conversation.call("read_file", {"path": "missing.txt"}, call_id="err")  # makes errors/read_file-err.txt
    results = conversation.folders.results
    for folder in ("args", "exports"):
        (results / folder).mkdir(exist_ok=True)
        (results / folder / "a.json").write_text("{}")
    week_ago = time.time() - 8 * DAY_S
    for relative in ("spill/search-old.txt", "errors/read_file-err.txt", "args/a.json", "exports/a.json"):
        os.utime(results / relative, (week_ago, week_ago))
    young = conversation.submit("search", "young", "y" * 2_000)

    [report] = runtime.expire_files()
    assert report.removed_files == 3
    assert report.complete
    assert not report.errors
    assert old.descriptor is not None
    assert young.descriptor is not None
    assert not _host_file(results, old.descriptor.path).exists()
    assert _host_file(results, young.descriptor.path).exists()
    assert (results / "exports" / "a.json").exists()  # the model's exports are its own: not swept
    assert (results / "manifest.jsonl").exists()


def test_the_in_process_scheduler_removes_expired_files(runtime_factory: RuntimeFactory) -> None:
    policy = policy_from_mapping({"spill": {"retention_s": 60}})
    runtime = runtime_factory(policy, retention_interval_s=0.05)
    conversation = runtime.conversation("scheduler")
    outcome = conversation.submit("search", "s", "s" * 2_000)
    assert outcome.descriptor is not None
    spilled = _host_file(conversation.folders.results, outcome.descriptor.path)
    os.utime(spilled, (time.time() - 120, time.time() - 120))
    deadline = time.monotonic() + 10
    while spilled.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a bounded deadline for the background job's effect
    assert not spilled.exists()
