"""A run_python script calls tools like functions (``import sandbox_tools``): the data goes from a query to a host
tool without the model writing a byte of it, and every call is validated, approved, recorded and bounded as a
model's call is. On every backend (``subject``: Docker under runc and gVisor, Podman, the fake); a sandbox
still has only ``lo``."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.pipeline.approval import ApprovalRequest
from sandbox_runtime.pipeline.script_tools import PipelineScriptTools
from sandbox_runtime.policy import Policy
from sandbox_runtime.tools.run_python import run_python
from tests.conftest import SUBJECTS_ON_EVERY_STORE, RuntimeFactory, Subject, make_subject


@pytest.fixture(params=SUBJECTS_ON_EVERY_STORE)
def subject(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Subject:
    """Each backend, and the fake and Docker with their state on PostgreSQL: these stories involve the state."""
    return make_subject(request, tmp_path_factory)


ISSUE_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "description": "One line."},
        "body": {"type": "string", "description": "The whole report."},
    },
    "required": ["title", "body"],
    "additionalProperties": False,
}


class Tracker:
    """A host tool that files issues, and remembers exactly what it was sent."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.issues: list[dict[str, Any]] = []
        self.delay_s = delay_s
        self._guard = threading.Lock()

    def create_issue(self, arguments: dict[str, Any]) -> dict[str, Any]:
        if self.delay_s:
            time.sleep(self.delay_s)  # a slow remote system, standing in for the network this test never uses
        with self._guard:
            self.issues.append(arguments)
            return {"number": len(self.issues), "title": arguments["title"]}


class Approvals:
    """The host's approver: refuses any call whose arguments say DROP, and keeps every request it was shown."""

    def __init__(self) -> None:
        self.seen: list[ApprovalRequest] = []

    def __call__(self, request: ApprovalRequest) -> bool | str:
        self.seen.append(request)
        return "no destructive reports" if "DROP" in request.arguments_json else True


def report_bodies(count: int) -> list[tuple[str, str]]:
    """Rows whose bodies a model would copy badly: long, unicode, tabs, quotes, near-identical library names."""
    rows = []
    for n in range(count):
        body = "\n".join(
            f'frame {i}: libpthread.so.0 → libc.so.6 «{n}» \t"quoted" {"x" * (n * 37 % 200)}' for i in range(40)
        )
        rows.append((f"crash report {n}", body))
    return rows


def make_reports(path: Path, rows: list[tuple[str, str]]) -> Path:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE reports (title TEXT, body TEXT)")
        db.executemany("INSERT INTO reports VALUES (?, ?)", rows)
    return path


def scripted_runtime(
    factory: RuntimeFactory, policy: Policy, database: Path, tracker: Tracker, approvals: Approvals, **script_tools: Any
) -> Runtime:
    changes = {
        "sql": {"database_path": str(database)},
        "script_tools": {"allowed": ["sql_query", "read_file", "tracker__*"], **script_tools},
        "approval": {"tool_rules": {"tracker__create_issue": "ask"}},
    }
    runtime = factory(policy.changed(changes, "script tools test"), approver=approvals)
    runtime.register_tool(
        "tracker__create_issue", tracker.create_issue, description="File an issue.", input_schema=ISSUE_SCHEMA
    )
    return runtime


FILE_EVERY_REPORT = """
import os
import sandbox_tools as tools

print("interfaces:", sorted(os.listdir("/sys/class/net")))
found = tools.sql_query(query="SELECT title, body FROM reports ORDER BY rowid")
print("rows:", found.descriptor["rows"] if found.descriptor else None, "path:", found.path)
for row in found.rows():
    filed = tools.tracker__create_issue(title=row["title"], body=row["body"])
    print(filed.call_id, filed.text)
"""


def test_one_script_files_thirteen_reports_from_a_query_every_call_approved_and_recorded(
    subject: Subject, tmp_path: Path
) -> None:
    rows = report_bodies(13)
    tracker, approvals = Tracker(), Approvals()
    runtime = scripted_runtime(subject.make, subject.policy, make_reports(tmp_path / "r.db", rows), tracker, approvals)
    conversation = runtime.conversation("file-reports")

    outcome = conversation.call("run_python", {"code": FILE_EVERY_REPORT}, call_id="playbook-1")

    assert not outcome.is_error, outcome.text
    if not any(said.startswith("network:") for said in subject.backend.not_enforced):
        assert "interfaces: ['lo']" in outcome.text  # the calls need no network: the sandbox still has only lo
    assert "Tool calls from the script: 14 (14 ok)." in outcome.text
    assert [(i["title"], i["body"]) for i in tracker.issues] == rows  # byte for byte, in order
    asked = [r for r in approvals.seen if r.tool == "tracker__create_issue"]
    assert len(asked) == 13
    assert all(r.via == "run_python" and r.source == "/mnt/results/scripts/run-0001.py" for r in asked)
    assert [json.loads(r.arguments_json)["body"] for r in asked] == [body for _, body in rows]  # the real ones
    records = runtime.state.calls("file-reports")
    assert [r.call_id for r in records] == ["playbook-1", *(f"playbook-1/{n}" for n in range(1, 15))]
    assert [r.made_by for r in records] == [None, *["playbook-1"] * 14]
    assert {r.target for r in records[2:]} == {"tracker__create_issue"}
    assert all(r.status == "ok" for r in records)


def test_a_denied_call_raises_in_the_script_which_goes_on_and_the_denial_is_recorded(
    subject: Subject, tmp_path: Path
) -> None:
    rows = [("fine", "all good"), ("bad", "DROP TABLE users; -- please"), ("also fine", "still good")]
    tracker, approvals = Tracker(), Approvals()
    runtime = scripted_runtime(subject.make, subject.policy, make_reports(tmp_path / "r.db", rows), tracker, approvals)
    code = """
import sandbox_tools as tools
for row in tools.sql_query(query="SELECT title, body FROM reports ORDER BY rowid").rows():
    try:
        tools.tracker__create_issue(**row)
    except tools.ToolDenied as denied:
        print("denied:", row["title"], "|", denied.message, "|", denied.call_id)
"""
    result = runtime.conversation("deny").run_python(code)
    assert result.status == "ok", result.message
    assert [i["title"] for i in tracker.issues] == ["fine", "also fine"]
    assert "denied: bad | Denied: no destructive reports." in result.stdout
    assert result.tool_calls == 4
    assert result.tool_calls_failed == 1
    statuses = {r.target: r.status for r in runtime.state.calls("deny") if r.made_by and "bad" in (r.arguments or "")}
    assert statuses == {"tracker__create_issue": "denied"}


def test_limits_stop_a_call_with_a_clear_error_in_the_script(subject: Subject, tmp_path: Path) -> None:
    tracker, approvals = Tracker(delay_s=0.4), Approvals()
    runtime = scripted_runtime(
        subject.make,
        subject.policy,
        make_reports(tmp_path / "r.db", [("a", "b")]),
        tracker,
        approvals,
        calls_max_count=4,
        call_args_max_bytes=2000,
        calls_max_s=1.2,  # 3 x 0.4 s: the third call starts with up to 0.4 s of the machine's load to spare
    )
    code = """
import sandbox_tools as tools
def attempt(label, **arguments):
    try:
        tools.tracker__create_issue(**arguments)
        print(label, "ok")
    except tools.ToolLimitExceeded as exc:
        print(label, "limit:", exc.message)
attempt("too large", title="t", body="x" * 3000)
attempt("far too large", title="t", body="x" * 3_000_000)
for n in range(4):
    attempt(f"call {n}", title=str(n), body="small")
"""
    # three calls of 0.4 s pass the 1 s run limit: the run's clock stands still while a call is answered
    result = runtime.conversation("limits").run_python(code, timeout_s=1.0)
    assert result.status == "ok", result.message
    lines = result.stdout.splitlines()
    assert lines[0].startswith("too large limit: the arguments of tracker__create_issue take 3,0")
    assert "script_tools.call_args_max_bytes = 2,000" in lines[0]
    assert lines[1].startswith("far too large limit: a call's request may take at most 6,096 bytes")
    assert lines[2:5] == ["call 0 ok", "call 1 ok", "call 2 ok"]
    assert lines[5].startswith("call 3 limit: this run has spent "), lines[5]  # 3 x 0.4 s: the 1.2 s are spent
    assert "in tool calls, script_tools.calls_max_s = 1.2 s" in lines[5]
    assert len(tracker.issues) == 3

    counted = runtime.conversation("count").run_python(
        "import sandbox_tools as t\nfor n in range(5):\n    try:\n        t.read_file(path='nothing-here')\n"
        "    except t.ToolError as e:\n        print(type(e).__name__)\n"
    )
    assert counted.stdout.split() == ["ToolCallFailed"] * 4 + ["ToolLimitExceeded"]


def test_a_script_reaches_only_the_allowed_tools_never_run_python_and_only_from_its_own_process(
    subject: Subject, tmp_path: Path
) -> None:
    tracker, approvals = Tracker(), Approvals()
    runtime = scripted_runtime(
        subject.make, subject.policy, make_reports(tmp_path / "r.db", [("a", "b")]), tracker, approvals
    )
    code = """
import subprocess, sys
import sandbox_tools as tools
print(sorted(info.name for info in tools.list_tools()))
for name in ("write_file", "run_python", "no_such_tool"):
    try:
        tools.call(name, path="x.txt", content="y")
    except tools.ToolNotAllowed as exc:
        print(name, "->", exc.message)
try:
    tools.write_file
except AttributeError as exc:
    print("attribute:", exc)
child = "import sandbox_tools as t\\ntry:\\n    t.list_tools()\\nexcept t.ToolsUnavailable as e:\\n    print(e)"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
help(tools.tracker__create_issue)
"""
    result = runtime.conversation("allowed").run_python(code)
    assert result.status == "ok", result.message
    out = result.stdout
    assert out.splitlines()[0] == "['read_file', 'sql_query', 'tracker__create_issue']"
    assert "write_file -> scripts may not call 'write_file' (script_tools.allowed in the policy)" in out
    assert "run_python -> run_python cannot be called from a run" in out
    assert "no_such_tool -> scripts may not call 'no_such_tool'" in out
    assert "attribute: no tool 'write_file' may be called from this run" in out
    assert "tool calls are available only in the process of a run_python run" in out
    assert "tracker__create_issue(*, title, body)" in out
    assert "body (string, required): The whole report." in out
    assert not (runtime.conversation("allowed").folders.results / "x.txt").exists()
    assert tracker.issues == []


def test_a_retried_run_replays_the_calls_it_made_before_instead_of_making_them_again(
    subject: Subject, tmp_path: Path
) -> None:
    tracker, approvals = Tracker(), Approvals()
    runtime = scripted_runtime(
        subject.make, subject.policy, make_reports(tmp_path / "r.db", [("a", "b")]), tracker, approvals
    )
    handle = runtime.conversations.handle("retry")
    code = "import sandbox_tools as t\nprint(t.tracker__create_issue(title='once', body='only once').text)"
    outputs = []
    for _ in range(2):  # the same run's call id both times: as when its first try failed in the runtime
        scripts = PipelineScriptTools(
            runtime.dispatcher, runtime.dispatcher.context("retry"), "retried-call", None, None
        )
        outputs.append(run_python(handle, {"code": code}, scripts=scripts).stdout)
    assert outputs[0] == outputs[1]
    assert len(tracker.issues) == 1
    assert [r.call_id for r in runtime.state.calls("retry")] == ["retried-call/1"]


RAW_CHANNEL = """
import json, os
import sandbox_tools as tools
calls_fd, replies_fd, _pid = tools._state["channel"]

def exchange(data, count):
    os.write(calls_fd, data)
    got = b""
    while got.count(b"\\n") < count:
        got += os.read(replies_fd, 65536)
    return [json.loads(line) for line in got.splitlines()]
"""


def test_garbage_on_the_call_pipe_gets_an_error_per_line_and_the_executor_goes_on(subject: Subject) -> None:
    conversation = subject.make().conversation("garbage")
    code = (
        RAW_CHANNEL
        + r"""
print([r["error"] for r in exchange(b'not json\n[1, 2]\n{"op": "dance"}\n\n', 4)])
deep = b'{"op": "call", "tool": "read_file", "arguments": ' + b"[" * 100000 + b"\n"
print([r["error"] for r in exchange(deep, 1)])
print(len(exchange(b"\n" * 20000, 20000)))
open("note.txt", "w").write("still works")
print(tools.read_file(path="note.txt").text.strip())
print("executor", os.getppid())
"""
    )
    first = conversation.run_python(code)
    assert first.status == "ok", first.message
    lines = first.stdout.splitlines()
    assert lines[:4] == [
        "['invalid_arguments', 'invalid_arguments', 'invalid_arguments', 'invalid_arguments']",
        "['invalid_arguments']",
        "20000",
        "still works",
    ]
    assert "Tool calls from the script: 20006 (1 ok, 20005 refused)." in first.message
    second = conversation.run_python("import os\nprint('executor', os.getppid())")
    assert second.stdout == lines[4] + "\n"  # the same resident executor: nothing a run wrote ended it


def test_a_run_that_ends_before_its_reply_leaves_the_executor_fit_for_the_next_run(
    subject: Subject, tmp_path: Path
) -> None:
    tracker, approvals = Tracker(delay_s=0.5), Approvals()
    runtime = scripted_runtime(
        subject.make, subject.policy, make_reports(tmp_path / "r.db", [("a", "b")]), tracker, approvals
    )
    conversation = runtime.conversation("gone-early")
    code = RAW_CHANNEL + (
        "print('executor', os.getppid(), flush=True)\n"
        "call = {'id': 1, 'op': 'call', 'tool': 'tracker__create_issue', 'arguments': {'title': 't', 'body': 'b'}}\n"
        "os.write(calls_fd, json.dumps(call).encode() + b'\\n')\n"
        "os._exit(3)\n"
    )
    first = conversation.run_python(code)
    assert first.exit_code == 3
    assert len(tracker.issues) == 1  # the call was made: it had been sent
    second = conversation.run_python("import os\nprint('executor', os.getppid())")
    assert second.stdout == first.stdout
