"""MCP Tasks extension (2026-07-28): a 2026 client with the extension's own client library (ext-tasks) calls
``run_python`` over HTTP; a long run becomes a task that ends in the usual result (spill included), a quick one
is answered at once, a failing one is a completed task with ``isError``, and cancelling a task ends its run in
the sandbox."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from sandbox_runtime.control import CallControl
from sandbox_runtime.mcp.tasks import TaskStore, TrackedTask
from sandbox_runtime.policy import McpPolicy
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.workers import Workers
from tests.client_helpers import REPO, require
from tests.conftest import RuntimeFactory
from tests.mcp_helpers import http_server
from tests.test_mcp_tasks import (
    LONG_TAIL,
    SLOW_RUN_WITH_A_CHILD,
    assert_the_usual_result_with_its_spill,
    cancel_once_started,
    last_report,
    node_driver,
)

DRIVER = REPO / "tests" / "clients" / "tasks_v2_client.mjs"
EXT_TASKS = REPO / ".npm-tools" / "node_modules" / "@modelcontextprotocol" / "ext-tasks" / "package.json"
TASKS = "io.modelcontextprotocol/tasks"
DRIVER_TIMEOUT_S = 240.0
CALL_TIMEOUT_MS = 180_000


def _drive(served_state: Path, code: str, policy: Path | None = None) -> dict[str, Any]:
    require(EXT_TASKS, "the Tasks extension's client library (@modelcontextprotocol/ext-tasks)")
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    with http_server(served_state, policy=policy) as url:
        request = {"url": url, "code": code, "mode": "complete", "timeout_ms": CALL_TIMEOUT_MS}
        with node_driver(DRIVER, request) as (process, lines):
            report = last_report(lines, deadline)
            assert process.wait(timeout=max(1, deadline - time.monotonic())) == 0
    assert report["era"] == "modern"
    assert report["capabilities"]["extensions"] == {TASKS: {}}
    assert "tasks" not in report["capabilities"]  # the 2025-11-25 capability is not the 2026 era's
    return report


def _error_code(answer: dict[str, Any]) -> int:
    assert "error" in answer, answer
    return int(answer["error"]["code"])


def test_a_long_run_becomes_a_task_and_ends_in_the_usual_result_with_its_spill(served_state: Path) -> None:
    code = f"import time\nprint('first line', flush=True)\ntime.sleep(3)\nprint('{LONG_TAIL}')\n"
    report = _drive(served_state, code)

    assert report["kind"] == "task"
    assert report["events"][-1] == "outcome:completed", report["events"]
    assert "working" in report["events"], report["events"]  # it was polled while the run went on
    result = report["result"]
    assert_the_usual_result_with_its_spill(result)
    assert result["_meta"]["sandbox-runtime/conversation"] == "mcp-http"

    again = report["get_again"]["result"]
    assert again["resultType"] == "complete"
    assert again["taskId"] == report["taskId"]
    assert again["status"] == "completed"
    assert again["ttlMs"] > 0
    assert again["pollIntervalMs"] > 0
    assert again["result"]["content"] == result["content"]
    assert again["result"]["structuredContent"] == result["structuredContent"]
    assert report["update"]["result"]["resultType"] == "complete"  # acknowledged: nothing was asked
    assert _error_code(report["undeclared"]) == -32021  # tasks/get without the extension declared
    assert report["undeclared"]["error"]["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}
    assert _error_code(report["unknown"]) == -32602
    assert _error_code(report["listed"]) == -32601  # tasks/list and tasks/result are 2025-11-25 only
    assert _error_code(report["payload"]) == -32601


def test_a_run_that_ends_within_task_after_s_is_answered_with_its_result_not_a_task(
    served_state: Path, tmp_path: Path
) -> None:
    policy = tmp_path / "patient.toml"
    policy.write_text('name = "patient"\n[mcp]\ntask_after_s = 60.0\n')  # far above the run and its sandbox start
    report = _drive(served_state, "print('quick answer')\n", policy)

    assert report["kind"] == "immediate"
    assert "taskId" not in report
    result = report["result"]
    assert result["isError"] is False
    assert "quick answer" in result["content"][0]["text"]
    assert result["structuredContent"]["status"] == "ok"


def test_a_run_that_fails_as_a_task_is_a_completed_task_with_is_error(served_state: Path) -> None:
    code = "import time\ntime.sleep(2)\nraise ValueError('no such column: totl')\n"
    report = _drive(served_state, code)

    assert report["kind"] == "task"
    assert report["events"][-1] == "outcome:completed"  # a tool error is a result, not a failed task
    result = report["result"]
    assert result["isError"] is True
    assert "ValueError: no such column: totl" in result["content"][0]["text"]
    assert result["structuredContent"]["error_path"].startswith("/mnt/results/errors/")
    assert report["get_again"]["result"]["status"] == "completed"


def test_cancelling_a_task_ends_its_run_in_the_sandbox(runtime_factory: RuntimeFactory, served_state: Path) -> None:
    require(EXT_TASKS, "the Tasks extension's client library (@modelcontextprotocol/ext-tasks)")
    with http_server(served_state) as url:
        request = {"url": url, "code": SLOW_RUN_WITH_A_CHILD, "mode": "cancel", "timeout_ms": CALL_TIMEOUT_MS}
        with node_driver(DRIVER, request) as (process, lines):
            created, report = cancel_once_started(runtime_factory, served_state, process, lines)

    assert report["kind"] == "task"
    assert report["taskId"] == created
    assert report["after_cancel"]["result"]["status"] == "cancelled"
    assert report["cancel_again"]["result"]["resultType"] == "complete"  # an ended task: acknowledged, unchanged


def _ended(store: TaskStore, work: Any) -> TrackedTask:
    task = store.start("c1", None, CallControl(), work)
    assert store.wait(task, timeout_s=10)
    return store.get("c1", task.task_id)


@pytest.fixture
def workers(state_db: StateDB) -> Iterator[Workers]:
    """The tasks' threads, stopped (their calls waited for) before the state they write to is closed: closing a
    SQLite connection while another thread is inside it can crash the process."""
    pool = Workers(4, name="test-tasks")
    yield pool
    pool.close()


def _store(policy: McpPolicy, state: StateDB, workers: Workers) -> TaskStore:
    return TaskStore(policy, state, state.leases.open("digest").id, workers.submit)


def test_a_tool_error_and_a_protocol_error_end_tasks_as_each_generation_says(
    workers: Workers, state_db: StateDB
) -> None:
    store = _store(McpPolicy(), state_db, workers)
    tool_error = types.CallToolResult(content=[types.TextContent(text="no such column")], is_error=True)
    said = _ended(store, lambda: tool_error)
    assert said.view().status == "failed"  # 2025-11-25: isError is a failed task
    shown = said.detailed("2026-07-28")
    assert shown["status"] == "completed"  # 2026-07-28: it is a result
    assert shown["result"]["isError"] is True
    assert "error" not in shown

    def broken() -> types.CallToolResult:
        raise RuntimeError("the engine went away")

    crashed = _ended(store, broken).detailed("2026-07-28")
    assert crashed["status"] == "failed"
    assert crashed["error"]["code"] == types.INTERNAL_ERROR
    assert "RuntimeError: the engine went away" in crashed["error"]["message"]
    assert "result" not in crashed


def test_task_limits_come_from_the_policy(workers: Workers, state_db: StateDB) -> None:
    store = _store(McpPolicy(task_ttl_default_s=60, task_ttl_max_s=120, tasks_kept_max=1), state_db, workers)
    release = threading.Event()

    def waits() -> types.CallToolResult:
        release.wait(timeout=30)
        return types.CallToolResult(content=[types.TextContent(text="done")])

    running = store.start("c1", 10**9, CallControl(), waits)
    assert running.ttl_ms == 120_000  # the most a client may ask
    with pytest.raises(MCPError, match="1 tasks are still running"):
        store.start("c1", None, CallControl(), waits)
    with pytest.raises(MCPError, match="Task not found"):
        store.get("another-conversation", running.task_id)
    release.set()
    assert store.wait(running, timeout_s=10)
    later = store.start("c1", None, CallControl(), waits)  # the ended one made room
    assert later.ttl_ms == 60_000
    with pytest.raises(MCPError, match="Task not found"):
        store.get("c1", running.task_id)
    assert store.wait(later, timeout_s=10)
