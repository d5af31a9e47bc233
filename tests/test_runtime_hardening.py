"""The host's own API holds its promises: a tool name is never silently replaced, a deleted conversation is
refused with a typed error (or started afresh where that is what the host asked for), the state database keeps
no descriptor of the threads that are gone, and a state folder of the previous version opens (a newer one is
refused untouched)."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime import Conversation
from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import ConversationDeleted, SandboxRuntimeError, ToolNameTaken
from sandbox_runtime.mcp.gateway import Gateway
from sandbox_runtime.policy import McpPolicy, UpstreamServer
from sandbox_runtime.sandbox.backend import SandboxBackend
from sandbox_runtime.sandbox.docker.backend import DockerBackend
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION
from sandbox_runtime.state.database import SCHEMA_VERSION, StateDB
from tests.conftest import SESSION, TEST_LABEL, RuntimeFactory
from tests.mcp_helpers import BUILTIN_TOOLS
from tests.upstreams.sdk_upstream import lines_text

SDK_UPSTREAM = [sys.executable, str(Path(__file__).resolve().parent / "upstreams" / "sdk_upstream.py")]
NOTE_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def _ours(backend: SandboxBackend, conversation: str) -> list[str]:
    return [c.id for c in backend.list_containers({TEST_LABEL: SESSION, LABEL_CONVERSATION: conversation})]


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


# ------------------------------------------------------------------------------------------ tool names
@pytest.mark.parametrize("name", BUILTIN_TOOLS)
def test_a_host_tool_named_like_a_built_in_is_refused_and_the_built_in_stays(runtime: Runtime, name: str) -> None:
    built_in = runtime.tools[name]
    with pytest.raises(ToolNameTaken, match=rf"'{name}' is taken by the built-in tool {name}"):
        runtime.register_tool(name, lambda a: "mine", description="The host's own.", input_schema={"type": "object"})
    assert runtime.tools[name] is built_in


def test_a_host_tool_named_delegate_call_leaves_delegation_working(runtime: Runtime) -> None:
    notes: list[dict[str, Any]] = []
    runtime.register_tool("crm_note", notes.append, description="Add a note.", input_schema=NOTE_SCHEMA)
    with pytest.raises(ToolNameTaken):
        runtime.register_tool("delegate_call", lambda a: "hijacked", description="No.", input_schema={"type": "object"})
    conversation = runtime.conversation("delegation-intact")
    written = conversation.call("write_file", {"path": "args/note.json", "content": json.dumps({"text": "hello"})})
    assert not written.is_error, written.text
    sent = conversation.call("delegate_call", {"tool": "crm_note", "args_file": "args/note.json"})
    assert not sent.is_error, sent.text
    assert notes == [{"text": "hello"}]


def test_a_second_tool_of_one_name_is_refused_naming_the_first_which_keeps_answering(runtime: Runtime) -> None:
    runtime.register_tool("crm_search", lambda a: "first", description="Search the CRM.\nMore.", input_schema={})
    with pytest.raises(ToolNameTaken, match=r"'crm_search' is taken by a tool registered before \('Search the CRM.'\)"):
        runtime.register_tool("crm_search", lambda a: "second", description="Search again.", input_schema={})
    assert runtime.conversation("first-stays").call("crm_search", {}).text == "first"


@pytest.fixture
def sdk_gateway() -> Iterator[Gateway]:
    with Gateway(McpPolicy(upstream_start_timeout_s=30.0), {"sdk": UpstreamServer(command=SDK_UPSTREAM)}) as started:
        (status,) = started.status()
        assert status.running, status.error
        yield started


def test_an_upstream_tool_whose_name_a_host_tool_has_is_left_out_and_the_log_names_the_holder(
    runtime: Runtime, sdk_gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    runtime.register_tool("sdk__text", lambda a: "the host's", description="Text from the host.", input_schema={})
    with caplog.at_level(logging.WARNING, logger="sandbox_runtime.mcp.gateway"):
        offered = sdk_gateway.register(runtime)
    assert "sdk__text" not in offered
    assert "sdk__frames" in offered
    (said,) = [r.getMessage() for r in caplog.records if "'text'" in r.getMessage()]
    assert "not offered" in said
    assert "taken by a tool registered before ('Text from the host.')" in said
    assert runtime.conversation("host-wins").call("sdk__text", {"chars": 5}).text == "the host's"


def test_a_host_tool_registered_after_the_gateway_under_an_upstream_name_is_refused_naming_the_upstream(
    runtime: Runtime, sdk_gateway: Gateway
) -> None:
    assert "sdk__text" in sdk_gateway.register(runtime)
    with pytest.raises(ToolNameTaken, match=r"'sdk__text' is taken by a tool registered before \('\[sdk\] "):
        runtime.register_tool("sdk__text", lambda a: "mine", description="Mine.", input_schema={})
    assert runtime.conversation("upstream-wins").call("sdk__text", {"chars": 50}).text == lines_text(50)


# --------------------------------------------------------------------------------- deleted conversations
USES: dict[str, Callable[[Conversation], object]] = {
    "run_python": lambda c: c.run_python("print(1)"),
    "call_run_python": lambda c: c.call_run_python({"code": "print(1)"}),
    "call": lambda c: c.call("write_file", {"path": "again.txt", "content": "x"}),
    "submit": lambda c: c.submit("search", "s-1", "found"),
    "run_turn": lambda c: c.run_turn([]),
    "sandbox": lambda c: c.sandbox(),
    "folders": lambda c: c.folders,
    "usage": lambda c: c.usage(),
    "calls": lambda c: c.calls(),
    "attachments": lambda c: c.attachments(),
    "spills": lambda c: c.spills(),
    "decisions": lambda c: c.decisions(),
    "rebuild_history": lambda c: c.rebuild_history([]),
}


def test_a_deleted_conversation_refuses_every_use_and_says_how_to_open_it_again(runtime: Runtime) -> None:
    conversation = runtime.conversation("deleted-here")
    assert conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')").status == "ok"
    conversation.delete()
    for name, use in USES.items():
        with pytest.raises(ConversationDeleted, match=r"runtime\.conversation\('deleted-here'\)"):
            use(conversation)
        assert runtime.state.conversation("deleted-here") is None, f"{name} made the conversation again"
    assert conversation.close() is False  # nothing of it is left to end
    conversation.delete()  # nor to delete
    assert _ours(runtime.backend, "deleted-here") == []

    again = runtime.conversation("deleted-here")  # opened again: a new, empty conversation
    fresh = again.run_python("import os; print(os.path.exists('/mnt/results/kept.txt'))")
    assert (fresh.status, fresh.stdout) == ("ok", "False\n")
    assert [c.tool for c in again.calls()] == []  # run_python called directly records no call


def test_a_conversation_deleted_by_another_runtime_is_refused_by_the_object_that_used_it_and_opens_afresh(
    runtime_factory: RuntimeFactory,
) -> None:
    here = runtime_factory()
    elsewhere = runtime_factory(state_dir=here.state_dir, sweep_on_start=False)
    conversation = here.conversation("deleted-elsewhere")
    conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')")
    known = conversation.sandbox().container_id  # this process knows its sandbox
    elsewhere.conversation("deleted-elsewhere").delete()
    with pytest.raises(ConversationDeleted, match="was deleted"):  # before: a bare KeyError
        conversation.run_python("print(1)")

    opened = here.conversation("deleted-elsewhere")  # opened again: a new, empty conversation
    fresh = opened.run_python("import os; print(os.path.exists('/mnt/results/kept.txt'))")
    assert (fresh.status, fresh.stdout) == ("ok", "False\n")
    assert opened.sandbox().container_id != known


def test_a_conversation_deleted_by_another_runtime_starts_afresh_for_the_model_s_next_call(
    runtime_factory: RuntimeFactory,
) -> None:
    here = runtime_factory()
    elsewhere = runtime_factory(state_dir=here.state_dir, sweep_on_start=False)
    here.conversation("served").call("run_python", {"code": "open('/mnt/results/old.txt', 'w').write('old')"})
    elsewhere.conversation("served").delete()
    # what an MCP session does: every call names the conversation by id
    outcome = here.conversation("served").call("run_python", {"code": "import os; print(os.listdir('/mnt/results'))"})
    assert not outcome.is_error, outcome.text
    assert "old.txt" not in outcome.text
    assert here.state.conversation("served") is not None


def test_a_sandbox_removed_from_outside_is_replaced_by_every_path_and_the_results_folder_stays(
    runtime: Runtime, docker_backend: DockerBackend
) -> None:
    conversation = runtime.conversation("removed-outside-hardening")
    conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')")
    read_back = "print(open('/mnt/results/kept.txt').read())"

    def closed_then_run() -> str:
        assert conversation.close() is False  # nothing was running any more
        return conversation.run_python(read_back).stdout

    uses: tuple[Callable[[], str], ...] = (
        lambda: conversation.run_python(read_back).stdout,
        lambda: conversation.call("run_python", {"code": read_back}).text,
        closed_then_run,
    )
    for use in uses:
        docker_backend.remove(conversation.sandbox().container_id)
        assert "kept" in str(use())
    docker_backend.remove(conversation.sandbox().container_id)
    conversation.delete()  # removed from outside, then deleted: nothing stays, and the id opens afresh
    assert _ours(docker_backend, "removed-outside-hardening") == []
    again = runtime.conversation("removed-outside-hardening").run_python("import os; print(os.listdir('.'))")
    assert again.status == "ok", again.stderr
    assert "kept.txt" not in again.stdout


def test_a_run_of_a_conversation_deleted_while_it_starts_is_a_typed_error(tmp_path: Path) -> None:
    state = StateDB(tmp_path / "state.sqlite3")
    state.ensure_conversation("gone", "measured", 1024)
    assert state.begin_run("gone", "no-container", "no-lease", 1.0) == 1
    assert state.begin_run("gone", "no-container", "no-lease", 2.0) == 2
    state.forget_conversation("gone")
    with pytest.raises(ConversationDeleted, match=r"runtime\.conversation\('gone'\)"):
        state.begin_run("gone", "no-container", "no-lease", 3.0)
    state.close()


# ---------------------------------------------------------------------------------- thread connections
def _on_threads(count: int, work: Callable[[], object]) -> None:
    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # collected: the test reports it
            failures.append(exc)

    for _ in range(count):
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert not failures, failures[:3]


def test_a_host_serving_each_request_on_a_thread_of_its_own_keeps_no_descriptor_of_the_threads_gone(
    runtime: Runtime,
) -> None:
    conversation = runtime.conversation("thread-per-request")
    conversation.submit("search", "first", "found")

    def request() -> None:
        assert [d.call_id for d in runtime.conversation("thread-per-request").decisions()] == ["first"]

    _on_threads(10, request)  # every lazily opened file of a request is open now
    before = _open_descriptors()
    counts = []
    for _ in range(4):
        _on_threads(500, request)
        counts.append(_open_descriptors())
    # a leak is 2-3 descriptors per thread (the database, its -wal and -shm): thousands after 2,000 requests;
    # SQLite may keep one closed connection's descriptor for reuse while another connection holds a lock
    assert max(counts) <= before + 3, (before, counts)
    assert runtime.state.open_connections() <= threading.active_count()  # at most one per live thread


def test_closing_the_state_closes_the_connection_of_every_thread_even_one_still_running(tmp_path: Path) -> None:
    baseline = _open_descriptors()
    state = StateDB(tmp_path / "state.sqlite3")
    state.ensure_conversation("c", "measured", 1024)
    opened, finish = threading.Event(), threading.Event()
    seen: list[object] = []

    def worker() -> None:
        state.conversations()
        opened.set()
        finish.wait(timeout=30)
        seen.append(state.conversation("c"))  # its connection was closed: it opens a new one

    thread = threading.Thread(target=worker)
    thread.start()
    assert opened.wait(timeout=30)
    assert state.open_connections() == 2
    state.close()
    assert state.open_connections() == 0
    assert _open_descriptors() == baseline
    finish.set()
    thread.join(timeout=30)
    assert [getattr(r, "id", None) for r in seen] == ["c"]
    assert state.open_connections() == 0  # the worker's new connection closed when it ended
    state.close()


# ----------------------------------------------------------------------------------- the schema version
# The schema of the state database as the previous version (git HEAD before schema versions) made it, copied
# from sandbox_runtime/state.py and sandbox_runtime/leases.py of that version: user_version was never set (0).
PREVIOUS_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    quota_mode TEXT NOT NULL,
    quota_bytes INTEGER NOT NULL,
    runs INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS sandboxes (
    container_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations(id),
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL,
    removed_at REAL,
    removed_reason TEXT
);
CREATE INDEX IF NOT EXISTS sandboxes_live ON sandboxes(conversation_id) WHERE removed_at IS NULL;
CREATE TABLE IF NOT EXISTS tool_results (
    conversation_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    turn_id TEXT,
    decided_at REAL NOT NULL,
    is_error INTEGER NOT NULL,
    replaced INTEGER NOT NULL,
    text BLOB NOT NULL,
    descriptor TEXT,
    error_path TEXT,
    PRIMARY KEY (conversation_id, call_id)
);
CREATE TABLE IF NOT EXISTS calls (
    conversation_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    turn_id TEXT,
    tool TEXT NOT NULL,
    target TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    status TEXT NOT NULL,
    arguments BLOB,
    expanded BLOB,
    arguments_sha256 TEXT,
    arguments_cut INTEGER NOT NULL DEFAULT 0,
    descriptor TEXT,
    error_path TEXT,
    PRIMARY KEY (conversation_id, call_id)
);
CREATE TABLE IF NOT EXISTS attachments (
    conversation_id TEXT NOT NULL,
    attachment_id TEXT PRIMARY KEY,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    mime_type TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    source TEXT NOT NULL,
    host_path TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS expired_files (
    conversation_id TEXT NOT NULL,
    path TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    modified_at REAL NOT NULL,
    removed_at REAL NOT NULL,
    PRIMARY KEY (conversation_id, path)
);
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    process_start TEXT,
    host TEXT NOT NULL,
    started_at REAL NOT NULL,
    policy_digest TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS holds (
    lease_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    container_id TEXT,
    policy_digest TEXT NOT NULL,
    held_at REAL NOT NULL,
    used_at REAL NOT NULL,
    PRIMARY KEY (lease_id, conversation_id)
);
CREATE INDEX IF NOT EXISTS holds_by_conversation ON holds(conversation_id);
"""
PREVIOUS_ROWS_SQL = """
INSERT INTO conversations VALUES ('from-before', 1700000000.0, 'measured', 67108864, 3);
INSERT INTO tool_results VALUES ('from-before', 'c-1', 'run_python', 't-1', 1700000001.0, 0, 0,
    CAST('forty-two ✓' AS BLOB), NULL, NULL);
INSERT INTO calls VALUES ('from-before', 'c-1', 't-1', 'run_python', 'run_python', 1700000000.5, 1700000001.0,
    'ok', CAST('{"code":"print(42)"}' AS BLOB), NULL, NULL, 0, NULL, NULL);
INSERT INTO attachments VALUES ('from-before', 'att-1', 'report.csv', 12, 'text/csv', 'ab12', '/mnt/results/r.csv',
    '/somewhere/outputs/att-1/report.csv', 1700000002.0);
INSERT INTO expired_files VALUES ('from-before', '/mnt/results/spill/old.json', 10, 1699990000.0, 1700000003.0);
"""


def _previous_version_state(state_dir: Path, *, user_version: int = 0) -> Path:
    state_dir.mkdir(parents=True)
    path = state_dir / "state.sqlite3"
    db = sqlite3.connect(path)
    try:
        db.executescript(PREVIOUS_SCHEMA_SQL + PREVIOUS_ROWS_SQL)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA user_version = {user_version}")
        db.commit()
    finally:
        db.close()
    return path


def _query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def _user_version(path: Path) -> int:
    return int(_query(path, "PRAGMA user_version")[0][0])


SCHEMA_SQL = "SELECT type, name, sql FROM sqlite_master ORDER BY name"


def test_a_state_folder_of_the_previous_version_opens_with_everything_in_it_and_is_migrated(
    runtime_factory: RuntimeFactory, tmp_path: Path
) -> None:
    path = _previous_version_state(tmp_path / "state")
    runtime = runtime_factory(state_dir=tmp_path / "state")
    assert _user_version(path) == SCHEMA_VERSION
    conversation = runtime.conversation("from-before")
    assert [(d.call_id, d.text) for d in conversation.decisions()] == [("c-1", "forty-two ✓")]
    assert [(c.call_id, c.arguments) for c in conversation.calls()] == [("c-1", '{"code":"print(42)"}')]
    assert [a.filename for a in conversation.attachments()] == ["report.csv"]
    expired = runtime.state.expired_file("from-before", "/mnt/results/spill/old.json")
    assert expired is not None
    assert expired.removed_at == 1700000003.0
    ran = conversation.run_python("print(6 * 7)")  # the conversation carries on: its fourth run
    assert (ran.status, ran.stdout) == ("ok", "42\n")
    carried_on = runtime.state.conversation("from-before")
    assert carried_on is not None
    assert carried_on.runs == 4
    indexes = {name for kind, name, _ in _query(path, SCHEMA_SQL) if kind == "index"}
    assert "attachments_by_conversation" in indexes  # what version 1 added


def test_a_new_state_folder_starts_at_the_current_schema_version_and_opening_it_again_changes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite3"
    StateDB(path).close()
    assert _user_version(path) == SCHEMA_VERSION
    schema_before = _query(path, SCHEMA_SQL)
    reopened = StateDB(path)
    reopened.close()
    assert _query(path, SCHEMA_SQL) == schema_before


@pytest.mark.parametrize("newer", [SCHEMA_VERSION + 1, SCHEMA_VERSION + 7, 2**31 - 1])
def test_a_state_folder_of_a_newer_version_is_refused_untouched_and_nothing_is_left_open(
    tmp_path: Path, newer: int
) -> None:
    path = _previous_version_state(tmp_path / "state", user_version=newer)
    schema_before = _query(path, SCHEMA_SQL)
    baseline = _open_descriptors()
    with pytest.raises(SandboxRuntimeError, match=rf"schema version {newer}, newer than .* \({SCHEMA_VERSION}\)"):
        Runtime(tmp_path / "state", sweep_on_start=False, reap_interval_s=None, retention_interval_s=None)
    assert _open_descriptors() == baseline
    assert _user_version(path) == newer
    assert _query(path, SCHEMA_SQL) == schema_before
