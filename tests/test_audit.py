"""The audit trail, on both state stores: what is written (calls, those admission refused, approvals, denials,
attachments, sandboxes), never a value or a token; ``audit verify`` passing on a busy log and naming the first
entry after an edit, a deletion, a swap and a cut tail; ``audit export``; and a store that refuses an entry: the
call goes on, the loss is logged loudly, counted by a gap entry, and ``doctor``'s check misses it."""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import AdmissionRefused
from sandbox_runtime.pipeline.approval import ApprovalRequest
from sandbox_runtime.policy import load_policy
from sandbox_runtime.state.audit import AuditEntry
from sandbox_runtime.state.location import STATE_URL_VARIABLE
from tests.cli_helpers import CliRun, run_cli
from tests.conftest import RuntimeFactory

SECRET = "value-that-must-never-be-in-the-audit-trail"  # noqa: S105  (a file's content, not a password)


def _cli(state_dir: Path, url: str | None, *args: str) -> CliRun:
    """``sandbox-runtime audit ARGS`` on the state directory, its state at ``url`` (None: the directory's SQLite)."""
    return run_cli("--state-dir", str(state_dir), "audit", *args, env={STATE_URL_VARIABLE: url})


def _busy(runtime: Runtime) -> None:
    """Forty calls of four tenants at once, some of each kind of entry."""

    def work(index: int) -> None:
        conversation = runtime.conversation(f"c{index % 5}", tenant=f"tenant-{index % 4}")
        conversation.call("write_file", {"path": f"/mnt/results/f{index}.txt", "content": SECRET})
        conversation.call("read_file", {"path": f"/mnt/results/f{index}.txt"})

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, range(20)))


def _entries(runtime: Runtime) -> list[AuditEntry]:
    return list(runtime.state.audit.entries())


def _tamper(runtime: Runtime, sql: str, params: tuple[Any, ...] = ()) -> None:
    with runtime.state.engine.transaction() as db:
        db.run(sql, params)


def test_a_busy_log_verifies_and_holds_digests_never_values(
    state_url: str | None, fake_runtime_factory: RuntimeFactory
) -> None:
    runtime = fake_runtime_factory(state_url=state_url)
    _busy(runtime)
    entries = _entries(runtime)
    calls = [entry for entry in entries if entry.kind == "call"]
    assert len(calls) == 40
    assert [entry.seq for entry in entries] == list(range(1, len(entries) + 1))
    assert {entry.tenant for entry in calls} == {f"tenant-{i}" for i in range(4)}
    detail = json.loads(calls[0].detail)
    assert set(detail) >= {"tool", "status", "arguments_sha256", "result_sha256", "made_by", "turn_id"}
    assert all(SECRET not in entry.detail for entry in entries)
    check = runtime.state.audit.verify()
    assert check.ok, check
    assert check.entries == len(entries)
    done = _cli(runtime.state_dir, state_url, "verify")
    assert done.returncode == 0, done.stderr
    assert f"{len(entries):,} entries" in done.stdout
    assert check.head_hash in done.stdout
    assert _cli(runtime.state_dir, state_url, "verify", "--head", check.head_hash).returncode == 0


@pytest.mark.parametrize("damage", ["edit", "delete", "swap", "cut the tail", "rewrite from the start"])
def test_verify_names_the_first_entry_that_breaks_the_chain(
    state_url: str | None, fake_runtime_factory: RuntimeFactory, damage: str
) -> None:
    runtime = fake_runtime_factory(state_url=state_url)
    _busy(runtime)
    count = len(_entries(runtime))
    noted_head = runtime.state.audit.verify().head_hash
    if damage == "edit":
        _tamper(runtime, "UPDATE audit_log SET detail = replace(detail, '\"ok\"', '\"error\"') WHERE seq = 7")
        expected, words = 7, "entry 7 was changed after it was written"
    elif damage == "delete":
        _tamper(runtime, "DELETE FROM audit_log WHERE seq = 12")
        expected, words = 12, "entry 12 is missing"
    elif damage == "swap":  # two entries' contents exchanged, their numbers kept
        columns = "at, kind, tenant, conversation_id, call_id, detail, prev_hash, hash"
        with runtime.state.engine.statements() as db:
            five, six = (db.row(f"SELECT {columns} FROM audit_log WHERE seq = ?", (seq,)) for seq in (5, 6))  # noqa: S608  (our own columns)
        assert five is not None
        assert six is not None
        for seq, row in ((5, six), (6, five)):
            sets = ", ".join(f"{name} = ?" for name in row)
            _tamper(runtime, f"UPDATE audit_log SET {sets} WHERE seq = ?", (*row.values(), seq))  # noqa: S608  (our own columns)
        expected, words = 5, "entry 5 does not follow entry 4"
    elif damage == "cut the tail":
        _tamper(runtime, "DELETE FROM audit_log WHERE seq > ?", (count - 3,))
        expected, words = count - 2, f"entries {count - 2}-{count} were removed"
    else:  # every entry deleted and the log started again: only a head noted elsewhere shows it
        _tamper(runtime, "DELETE FROM audit_log")
        _tamper(runtime, "UPDATE audit_head SET seq = 0, hash = ? WHERE id = 1", ("0" * 64,))
        runtime.conversation("after", tenant="x").call("write_file", {"path": "a", "content": "b"})
        assert runtime.state.audit.verify().ok
        expected, words = 1, "noted earlier is not in the chain"
    check = runtime.state.audit.verify(head=noted_head)
    assert not check.ok
    assert check.first_bad == expected, check
    assert words in (check.problem or ""), check
    done = _cli(runtime.state_dir, state_url, "verify", "--head", noted_head)
    assert done.returncode == 1
    assert f"broken at entry {expected}" in done.stderr


def test_approvals_denials_attachments_and_sandboxes_are_each_an_entry(fake_runtime_factory: RuntimeFactory) -> None:
    asking = load_policy("default").changed(
        {"approval": {"tool_rules": {"attach_file": "ask", "edit_file": "deny"}}}, "the test"
    )
    answers: list[bool | str] = [True, "not today"]

    def approver(request: ApprovalRequest) -> bool | str:
        return answers.pop(0)

    runtime = fake_runtime_factory(asking, approver=approver)
    conversation = runtime.conversation("reviewed", tenant="acme")
    conversation.call("write_file", {"path": "/mnt/results/a.txt", "content": SECRET})
    assert not conversation.call("attach_file", {"path": "/mnt/results/a.txt"}).is_error
    assert conversation.call("attach_file", {"path": "/mnt/results/a.txt"}).is_error  # "not today"
    assert conversation.call("edit_file", {"path": "a.txt", "old": "v", "new": "w"}).is_error
    conversation.call("run_python", {"code": "print(1)"})
    conversation.delete()
    kinds = [(entry.kind, json.loads(entry.detail)) for entry in _entries(runtime)]
    approvals = [detail["answer"] for kind, detail in kinds if kind == "approval"]
    assert approvals == ["allow", "deny"]
    denials = [detail for kind, detail in kinds if kind == "denial"]
    assert [d["tool"] for d in denials] == ["attach_file", "edit_file"]
    assert denials[0]["reason"] == "not today"
    assert denials[1]["reason"] == "the policy denies calls of edit_file"
    (made,) = [detail for kind, detail in kinds if kind == "attachment_made"]
    assert made["filename"] == "a.txt"
    assert len(made["sha256"]) == 64
    assert [kind for kind, _ in kinds].count("sandbox_started") == 1
    (removed,) = [detail for kind, detail in kinds if kind == "sandbox_removed"]
    assert removed["reason"]
    assert all(entry.tenant == "acme" for entry in _entries(runtime))
    exported = _cli(runtime.state_dir, None, "export", "--tenant", "acme", "--since", "2020-01-01")
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [line["seq"] for line in lines] == [entry.seq for entry in _entries(runtime)]
    assert all(line["tenant"] == "acme" and "hash" in line and "at_iso" in line for line in lines)
    assert _cli(runtime.state_dir, None, "export", "--tenant", "nobody").stdout == ""
    assert _cli(runtime.state_dir, None, "export", "--since", "not a date").returncode == 2


def test_a_call_admission_refused_is_a_call_entry_with_its_reason_and_the_chain_still_verifies(
    state_url: str | None, fake_runtime_factory: RuntimeFactory
) -> None:
    limits = {"tenant_runs_max": 1, "max_wait_s": 1.0, "retry_after_s": 4.0}
    policy = load_policy("default").changed({"admission": limits}, "the test")
    runtime = fake_runtime_factory(policy, state_url=state_url)
    conversation = runtime.conversation("queued", tenant="acme")
    conversation.call("write_file", {"path": "a.txt", "content": SECRET})
    with runtime.admission.slot("acme"), pytest.raises(AdmissionRefused) as refused:  # acme's one slot is taken
        conversation.call("read_file", {"path": "a.txt"}, call_id="refused-1")
    conversation.call("read_file", {"path": "a.txt"}, call_id="refused-1")  # tried again: it runs (nothing was kept)
    entries = _entries(runtime)
    calls = [(entry, json.loads(entry.detail)) for entry in entries if entry.kind == "call"]
    assert [detail["status"] for _, detail in calls] == ["ok", "refused", "ok"]
    entry, detail = calls[1]
    assert (entry.tenant, entry.conversation_id, entry.call_id) == ("acme", conversation.key, "refused-1")
    assert (detail["tool"], detail["target"]) == ("read_file", "read_file")
    assert detail["reason"] == str(refused.value)
    assert "admission.max_wait_s" in detail["reason"]
    assert 1.0 - 0.05 <= detail["waited_s"] < 30
    assert detail["retry_after_s"] == 4.0
    assert detail["arguments_sha256"] == calls[2][1]["arguments_sha256"]  # the same arguments, as a digest
    assert detail["result_sha256"] is None  # no result was given
    assert all(SECRET not in entry.detail for entry in entries)
    check = runtime.state.audit.verify()
    assert check.ok, check
    assert check.entries == len(entries)
    done = _cli(runtime.state_dir, state_url, "verify", "--head", check.head_hash)
    assert done.returncode == 0, done.stderr


def test_a_store_refusing_an_entry_never_fails_the_call_and_the_loss_is_loud_and_counted(
    fake_runtime_factory: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = fake_runtime_factory()
    conversation = runtime.conversation("full")
    with runtime.state.engine.statements() as db:  # the audit table refuses writes, as a full disk would
        db.run(
            "CREATE TRIGGER refuse BEFORE INSERT ON audit_log BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END"
        )
    with caplog.at_level(logging.ERROR, logger="sandbox_runtime.state.audit"):
        outcome = conversation.call("write_file", {"path": "a.txt", "content": "kept"})
    assert not outcome.is_error
    assert any("AUDIT ENTRY LOST" in record.getMessage() for record in caplog.records)
    assert runtime.state.audit.missed >= 1
    lost = runtime.state.audit.missed
    with runtime.state.engine.statements() as db:
        db.run("DROP TRIGGER refuse")
    conversation.call("read_file", {"path": "a.txt"})
    entries = _entries(runtime)
    gaps = [json.loads(entry.detail) for entry in entries if entry.kind == "audit_gap"]
    assert gaps == [{"missed_entries": lost}]
    check = runtime.state.audit.verify()
    assert check.ok
    assert check.lost_entries == lost
    # what an alert reads: never reset by the gap entry
    assert runtime.metrics.registry.get_sample_value("sandbox_runtime_audit_entries_lost_total") == lost
