"""The state on either store: the embedded SQLite file and a PostgreSQL server several replicas share.

Every story here runs on both (``state_db`` / ``state_url``: a real private PostgreSQL server, no mock), except the
ones about a server going away, which only a server can do.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import mcp_types
import pytest

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import PolicyError, StateUnavailable, StateVersionUnknown
from sandbox_runtime.mcp.tasks import TaskStore
from sandbox_runtime.models import CallRecord, StoredResult
from sandbox_runtime.policy import McpPolicy, StatePolicy, policy_from_mapping
from sandbox_runtime.state.database import SCHEMA_VERSION, StateDB
from sandbox_runtime.state.location import STATE_URL_VARIABLE, open_engine, state_url
from sandbox_runtime.state.tasks import TaskRecord
from sandbox_runtime.workers import Workers
from tests.postgres_cluster import PostgresCluster

WAIT_S = 10.0


def _result(call_id: str, text: str, decided_at: float = 100.0) -> StoredResult:
    return StoredResult(
        conversation_id="c1",
        call_id=call_id,
        tool="run_python",
        turn_id="t1",
        decided_at=decided_at,
        is_error=False,
        replaced=False,
        text=text,
        descriptor=None,
        error_path=None,
    )


def _record(call_id: str) -> CallRecord:
    return CallRecord(
        conversation_id="c1",
        call_id=call_id,
        turn_id="t1",
        tool="run_python",
        target="run_python",
        started_at=99.0,
        finished_at=100.0,
        status="ok",
        arguments='{"code": "print(\\"\\udcff\\")"}',
        expanded=None,
        arguments_sha256=None,
        arguments_cut=False,
        descriptor=None,
        error_path=None,
    )


def _second(state_url: str | None, folder: Path) -> StateDB:
    """Another runtime's view of the same state (its own engine and connections: a replica)."""
    return StateDB(open_engine(folder, state_url, StatePolicy()))


def _dead_lease(state: StateDB) -> str:
    """The lease of a process of this host that has ended."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return state.leases.open("digest", pid=int(ended.stdout)).id


def test_decisions_come_back_byte_for_byte_in_the_order_they_were_stored(state_db: StateDB) -> None:
    state_db.ensure_conversation("c1", "measured", 1024)
    texts = {"b": "surrogate \udcff and emoji 🧪", "a": "NUL \x00 inside", "c": "x" * 100_000}
    stored = state_db.store_results([_result(call_id, text) for call_id, text in texts.items()], [_record("b")])
    assert {call_id: r.text for call_id, r in stored.items()} == texts
    assert list(state_db.stored_results("c1")) == ["b", "a", "c"]  # one decided_at: as they were stored
    again = state_db.store_results([_result("b", "a second decision")])
    assert again["b"].text == texts["b"]  # a call id decided before keeps its first decision
    assert [c.arguments for c in state_db.calls("c1")] == ['{"code": "print(\\"\\udcff\\")"}']
    assert state_db.begin_run("c1", "container", "lease", 1.0) == 1
    assert state_db.begin_run("c1", "container", "lease", 2.0) == 2


def test_a_newer_schema_is_refused_and_left_as_it_was(state_url: str | None, tmp_path: Path) -> None:
    state = _second(state_url, tmp_path)
    state.ensure_conversation("kept", "measured", 1024)
    with state.engine.transaction() as tx:
        state.engine.set_schema_version(tx, SCHEMA_VERSION + 7)
    state.close()
    with pytest.raises(StateVersionUnknown, match=f"schema version {SCHEMA_VERSION + 7}, newer"):
        _second(state_url, tmp_path)
    engine = open_engine(tmp_path, state_url, StatePolicy())
    try:
        with engine.transaction() as tx:
            assert engine.schema_version(tx) == SCHEMA_VERSION + 7
            assert [row["id"] for row in tx.rows("SELECT id FROM conversations")] == ["kept"]
    finally:
        engine.close()


@pytest.mark.process
def test_a_call_id_runs_under_one_claim_and_a_dead_runtimes_claim_is_taken_over(state_db: StateDB) -> None:
    mine = state_db.leases.open("digest").id
    other = state_db.leases.open("digest").id  # another live runtime of this process
    first = state_db.claims.take("c1", "call-1", mine)
    assert first is not None
    assert state_db.claims.take("c1", "call-1", other) is None  # held by a live runtime
    assert state_db.claims.take("c1", "call-1", mine) is None  # and by another thread of the same one
    state_db.claims.give_back("c1", [first])
    again = state_db.claims.take("c1", "call-1", other)
    assert again is not None

    dead = _dead_lease(state_db)
    assert state_db.claims.take("c1", "call-2", dead) is not None
    taken_over = state_db.claims.take("c1", "call-2", mine)
    assert taken_over is not None  # its runtime is gone: the claim is taken over
    state_db.claims.give_back("c1", [again, taken_over])
    assert state_db.claims.take("c1", "call-2", other) is not None


def test_a_named_lock_keeps_another_runtime_out_until_it_is_given_back(state_url: str | None, tmp_path: Path) -> None:
    one, two = _second(state_url, tmp_path), _second(state_url, tmp_path)
    try:
        held, wanted = one.engine.lock("c1.run.lock"), two.engine.lock("c1.run.lock")
        assert held.take(time.monotonic() + WAIT_S)
        assert not wanted.take(time.monotonic() + 0.2)  # the other replica holds it
        assert two.engine.lock("c2.run.lock").take(time.monotonic() + WAIT_S)  # another name is another lock
        taken = threading.Event()
        waiter = threading.Thread(target=lambda: taken.set() if wanted.take(time.monotonic() + WAIT_S) else None)
        waiter.start()
        held.give_back()
        waiter.join(WAIT_S)
        assert taken.is_set()  # given back: the waiting replica gets it
        wanted.give_back()
    finally:
        one.close()
        two.close()


@pytest.fixture
def workers() -> Iterator[Workers]:
    pool = Workers(4, name="test-state-tasks")
    yield pool
    pool.close()


def test_a_task_started_on_one_replica_is_read_and_cancelled_on_another(
    state_url: str | None, tmp_path: Path, workers: Workers
) -> None:
    a_state, b_state = _second(state_url, tmp_path), _second(state_url, tmp_path)
    try:
        a = TaskStore(McpPolicy(), a_state, a_state.leases.open("digest").id, workers.submit)
        b = TaskStore(McpPolicy(), b_state, b_state.leases.open("digest").id, workers.submit)
        control = CallControl()

        def runs_until_cancelled() -> mcp_types.CallToolResult:
            control.cancelled.wait(WAIT_S)
            return mcp_types.CallToolResult(content=[mcp_types.TextContent(text="stopped")], is_error=True)

        task = a.start("c1", None, control, runs_until_cancelled)
        assert b.get("c1", task.task_id).status == "working"
        assert b.listed("c1")[0].task_id == task.task_id
        assert b.cancel("c1", task.task_id).status == "cancelled"  # at once, for every replica
        a.look_for_cancels()  # the replica running it looks (a background job every CANCEL_LOOK_S)
        assert control.cancelled.is_set()
        assert b.wait(b.get("c1", task.task_id), timeout_s=WAIT_S)  # b sees its call end
        ended = b.get("c1", task.task_id)
        assert ended.status == "cancelled"
        assert ended.payload()["content"][0]["text"] == "stopped"
    finally:
        a_state.close()
        b_state.close()


@pytest.mark.process
def test_a_task_whose_runtime_died_before_it_ended_is_failed_when_asked_for(
    state_db: StateDB, workers: Workers
) -> None:
    gone = TaskStore(McpPolicy(), state_db, _dead_lease(state_db), workers.submit)
    release = threading.Event()
    task = gone.start(
        "c1", None, CallControl(), lambda: (release.wait(WAIT_S), mcp_types.CallToolResult(content=[]))[1]
    )
    asker = TaskStore(McpPolicy(), state_db, state_db.leases.open("digest").id, workers.submit)
    lost = asker.get("c1", task.task_id)
    release.set()
    assert lost.status == "failed"
    assert lost.ended
    assert "lost" in (lost.error or {}).get("message", "")
    assert lost.payload()["isError"] is True


def test_the_state_url_comes_from_the_runtime_then_the_environment_then_the_policy() -> None:
    policy = StatePolicy(url="postgresql://sandbox@db:5432/policy")
    given = "postgresql://sandbox:secret@db/given"
    assert state_url(given, policy, {STATE_URL_VARIABLE: "postgresql://env/db"}) == given
    assert state_url(None, policy, {STATE_URL_VARIABLE: "postgresql://env/db"}) == "postgresql://env/db"
    assert state_url(None, policy, {}) == policy.url
    assert state_url(None, StatePolicy(), {}) is None  # SQLite in the state directory
    with pytest.raises(PolicyError, match="must start with postgresql://"):
        state_url("mysql://db/state", StatePolicy(), {})
    with pytest.raises(PolicyError, match="may not carry a password"):
        policy_from_mapping({"state": {"url": "postgresql://sandbox:secret@db/state"}})


@pytest.mark.postgresql
def test_a_server_that_goes_away_is_state_unavailable_and_serving_resumes_when_it_is_back(
    postgres_cluster: PostgresCluster, postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    state = StateDB(open_engine(tmp_path, postgres_url, StatePolicy(connect_timeout_s=1.0)))
    try:
        state.ensure_conversation("c1", "measured", 1024)
        state.store_results([_result("before", "decided before the outage")])
        postgres_cluster.stop()
        with pytest.raises(StateUnavailable, match="is not available") as down:
            state.store_results([_result("during", "never stored")])
        assert postgres_cluster.password not in str(down.value)
        assert "sandbox:***@127.0.0.1" in str(down.value)  # the server is named, its password never
        with pytest.raises(StateUnavailable):
            state.stored_results("c1")
        postgres_cluster.start()
        assert list(state.stored_results("c1")) == ["before"]  # nothing lost, nothing half-written
        state.store_results([_result("after", "decided once it was back")])  # the same StateDB, reconnected
        assert list(state.stored_results("c1")) == ["before", "after"]
    finally:
        postgres_cluster.start()
        state.close()
    assert all(postgres_cluster.password not in record.getMessage() for record in caplog.records)


@pytest.mark.postgresql
def test_a_claim_and_a_task_the_server_was_away_for_are_settled_once_it_is_back(
    postgres_cluster: PostgresCluster, postgres_url: str, tmp_path: Path
) -> None:
    state = StateDB(open_engine(tmp_path, postgres_url, StatePolicy(connect_timeout_s=1.0)))
    other = StateDB(open_engine(tmp_path, postgres_url, StatePolicy(connect_timeout_s=1.0)))  # another replica
    try:
        mine, theirs = state.leases.open("p"), other.leases.open("p")
        claim = state.claims.take("c1", "call-1", mine.id)
        assert claim is not None
        state.tasks.add(
            TaskRecord(
                task_id="t1",
                conversation_id="c1",
                lease_id=mine.id,
                ttl_ms=60_000,
                created_at=1.0,
                updated_at=1.0,
                status="working",
            )
        )
        postgres_cluster.stop()  # the call and its task end while the server is away
        with pytest.raises(StateUnavailable):
            state.claims.give_back("c1", [claim])
        with pytest.raises(StateUnavailable):
            state.tasks.end("t1", "completed", None, b"{}", None)
        with pytest.raises(StateUnavailable):
            state.claims.take("c1", "call-2", mine.id)  # its insert never reached the server: owed all the same
        assert len(state.owed) == 3
        postgres_cluster.start()
        assert other.claims.take("c1", "call-1", theirs.id) is None  # still held by a live runtime's attempt
        state.owed.settle()  # what the runtime's lease job does (and its next claim)
        assert len(state.owed) == 0
        assert other.claims.take("c1", "call-1", theirs.id) is not None  # the retry runs
        task = other.tasks.get("t1")
        assert task is not None
        assert (task.status, task.ended) == ("completed", True)
    finally:
        postgres_cluster.start()
        state.close()
        other.close()


@pytest.mark.postgresql
def test_a_server_that_is_not_there_is_state_unavailable_at_once(
    postgres_cluster: PostgresCluster, tmp_path: Path
) -> None:
    url = postgres_cluster.url("no_such_database")
    with pytest.raises(StateUnavailable, match="no_such_database") as refused:
        open_engine(tmp_path, url, StatePolicy(connect_timeout_s=1.0))
    assert postgres_cluster.password not in str(refused.value)


@pytest.mark.process
def test_tasks_of_a_runtime_that_died_never_hold_the_place_of_new_ones(state_db: StateDB, workers: Workers) -> None:
    gone = TaskStore(McpPolicy(tasks_kept_max=1), state_db, _dead_lease(state_db), workers.submit)
    release = threading.Event()
    gone.start("c1", None, CallControl(), lambda: (release.wait(WAIT_S), mcp_types.CallToolResult(content=[]))[1])
    live = TaskStore(McpPolicy(tasks_kept_max=1), state_db, state_db.leases.open("digest").id, workers.submit)
    try:
        started = live.start("c1", None, CallControl(), lambda: mcp_types.CallToolResult(content=[]))
        assert live.wait(started, timeout_s=WAIT_S)
    finally:
        release.set()


def test_a_call_that_becomes_a_task_just_as_it_ends_is_kept_with_its_result(
    state_url: str | None, tmp_path: Path, workers: Workers
) -> None:
    here, there = _second(state_url, tmp_path), _second(state_url, tmp_path)
    try:
        store = TaskStore(McpPolicy(), here, here.leases.open("digest").id, workers.submit)
        result = mcp_types.CallToolResult(content=[mcp_types.TextContent(text="done")])
        task = store.start("c1", None, CallControl(), lambda: result, announce=False)  # may become a task
        assert store.wait(task, timeout_s=WAIT_S)  # it ended before it was announced: nothing written yet
        store.announce(task)  # its time was up just then: the client is told of a task
        other = TaskStore(McpPolicy(), there, there.leases.open("digest").id, workers.submit)
        seen = other.get("c1", task.task_id)  # another replica answers for it, ended, result and all
        assert seen.status == "completed"
        assert seen.payload()["content"][0]["text"] == "done"
    finally:
        here.close()
        there.close()
