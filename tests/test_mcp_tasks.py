"""MCP Tasks (2025-11-25): a long ``run_python`` called as a task by the TypeScript SDK's own client, to its
result (the usual one, spill included) or cancelled; and the tasks capability over HTTP too."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandbox_runtime.mcp.tasks import META_RELATED_TASK
from tests.client_helpers import REPO, missing_environment, require, server_env
from tests.conftest import RuntimeFactory
from tests.mcp_helpers import http_server, run_bounded, serve_command
from tests.sandbox_processes import run_processes

DRIVER = REPO / "tests" / "clients" / "tasks_client.mjs"
SDK = REPO / ".npm-tools" / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json"
DRIVER_TIMEOUT_S = 240.0
CALL_TIMEOUT_MS = 180_000
STARTED_WAIT_S = 90.0
PROCESSES_GONE_S = 10.0
LONG_TAIL = "x" * 1200
TASKS_CAPABILITY: dict[str, object] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        missing_environment("node is not installed")
    return node


@contextmanager
def tasks_client(served_state: Path, code: str, mode: str) -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str]]]:
    """The 2025-11-25 driver on ``serve`` over stdio."""
    require(SDK, "the TypeScript MCP SDK (@modelcontextprotocol/sdk)")
    request = {
        "command": serve_command(served_state),
        "env": server_env(),
        "code": code,
        "mode": mode,
        "timeout_ms": CALL_TIMEOUT_MS,
    }
    with node_driver(DRIVER, request) as driven:
        yield driven


@contextmanager
def node_driver(script: Path, request: dict[str, Any]) -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str]]]:
    """A driver script with its stdout lines on a queue (``""`` once it closed); stopped by pid at the end."""
    process = subprocess.Popen(
        [_node(), str(script), json.dumps(request)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        cwd=REPO,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put("")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        yield process, lines
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        reader.join(timeout=10)
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


def last_report(lines: queue.Queue[str], deadline: float) -> dict[str, Any]:
    """The last JSON line before the driver's stdout closed."""
    last = ""
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        if not line:
            break
        last = line if line.strip() else last
    return checked(json.loads(last))


def checked(report: dict[str, Any]) -> dict[str, Any]:
    assert "failure" not in report, report["failure"]
    return report


def test_a_long_run_as_a_task_ends_in_the_usual_result_with_its_spill(served_state: Path) -> None:
    code = f"import time\nprint('first line', flush=True)\ntime.sleep(2)\nprint('{LONG_TAIL}')\n"
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    with tasks_client(served_state, code, "complete") as (process, lines):
        report = last_report(lines, deadline)
        assert process.wait(timeout=max(1, deadline - time.monotonic())) == 0

    assert report["capabilities"]["tasks"] == TASKS_CAPABILITY
    assert report["execution"]["run_python"] == {"taskSupport": "optional"}
    assert report["execution"]["read_file"] is None
    types_seen = [m["type"] for m in report["messages"]]
    assert types_seen[0] == "taskCreated", report["messages"]
    assert types_seen[-1] == "result", report["messages"]
    assert report["created"]["status"] == "working"
    assert report["created"]["pollInterval"] > 0
    assert report["created"]["ttl"] == 600_000
    statuses = report["statuses"]
    assert statuses[0] == "working"
    assert "working" in statuses[1:], statuses  # polled while it ran
    assert statuses[-1] == "completed", statuses
    assert set(statuses) == {"working", "completed"}

    result = report["result"]
    assert_the_usual_result_with_its_spill(result)
    assert result["_meta"][META_RELATED_TASK] == {"taskId": report["created"]["taskId"]}
    assert result["_meta"]["sandbox-runtime/conversation"].startswith("mcp-stdio-")
    assert report["payload"] == result  # tasks/result again: the same result


# a run with a child in a session of its own; it marks that it started, then waits
SLOW_RUN_WITH_A_CHILD = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
    "open('/mnt/results/started', 'w').close()\n"
    "time.sleep(300)\n"
)


def cancel_once_started(
    runtime_factory: RuntimeFactory, served_state: Path, process: subprocess.Popen[str], lines: queue.Queue[str]
) -> tuple[str, dict[str, Any]]:
    """Drive a "cancel" driver of :data:`SLOW_RUN_WITH_A_CHILD`: once the run is under way (two processes in the
    sandbox), tell it to cancel, read its report, see every process of the run gone and the call recorded
    cancelled, and let it close. Returns the task id it created and its report."""
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    created = json.loads(lines.get(timeout=DRIVER_TIMEOUT_S))["created"]
    assert created, "the call did not become a task"
    host = runtime_factory(state_dir=served_state)
    conversation = started_conversation(host, time.monotonic() + STARTED_WAIT_S)
    assert len(run_processes(host, conversation)) >= 2  # the script and its child
    assert process.stdin is not None
    process.stdin.write("cancel\n")
    process.stdin.flush()
    report = checked(json.loads(lines.get(timeout=max(0.1, deadline - time.monotonic()))))
    gone_by = time.monotonic() + PROCESSES_GONE_S  # the server is still up: its sandbox too
    while (left := run_processes(host, conversation)) and time.monotonic() < gone_by:
        time.sleep(0.1)  # polling a condition, bounded
    assert left == [], f"processes of the cancelled run still live {PROCESSES_GONE_S} s after the cancel"
    process.stdin.write("close\n")
    process.stdin.flush()
    assert process.wait(timeout=max(1, deadline - time.monotonic())) == 0
    statuses = [record.status for record in host.conversation(conversation).calls()]
    assert statuses == ["cancelled"]
    return created, report


def assert_the_usual_result_with_its_spill(result: dict[str, Any]) -> None:
    """The ``CallToolResult`` of :data:`LONG_TAIL`'s run, as a blocking call answers it: the text names its spill."""
    assert result["isError"] is False
    text = result["content"][0]["text"]
    assert "first line" in text
    spill = result["structuredContent"]["file"]
    assert spill["path"].startswith("/mnt/results/spill/"), spill
    assert spill["path"] in text
    assert result["structuredContent"]["status"] == "ok"


def test_cancelling_a_task_ends_its_run_in_the_sandbox(runtime_factory: RuntimeFactory, served_state: Path) -> None:
    with tasks_client(served_state, SLOW_RUN_WITH_A_CHILD, "cancel") as (process, lines):
        created, report = cancel_once_started(runtime_factory, served_state, process, lines)

    assert report["cancelled"]["taskId"] == created
    assert report["cancelled"]["status"] == "cancelled"
    assert report["after_cancel"]["status"] == "cancelled"
    assert [(t["taskId"], t["status"]) for t in report["listed"]] == [(created, "cancelled")]
    assert report["statuses"][0] == "working"
    assert report["statuses"][-1] == "cancelled", report["statuses"]
    assert report["messages"][-1]["type"] == "error"
    assert report["payload"]["isError"] is True  # the run's own result: it was cancelled
    assert report["payload"]["_meta"][META_RELATED_TASK] == {"taskId": created}


def started_conversation(host: Any, deadline: float) -> str:
    while time.monotonic() < deadline:
        for record in host.state.conversations():
            if (host.conversation_by_key(record.id).folders.results / "started").exists():
                return str(record.id)
        time.sleep(0.05)  # polling a condition, bounded
    raise AssertionError("the task's run did not start")


def test_the_tasks_capability_and_task_support_reach_an_http_client_of_the_handshake_era(served_state: Path) -> None:
    async def scenario(url: str) -> tuple[Any, Any]:
        async with (
            httpx2.AsyncClient(timeout=60) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            return client.server_capabilities, tools["run_python"].execution

    with http_server(served_state) as url:
        capabilities, execution = run_bounded(scenario, url, limit_s=120)
    assert capabilities.tasks is not None
    assert capabilities.tasks.model_dump(by_alias=True, exclude_none=True) == TASKS_CAPABILITY
    assert execution is not None
    assert execution.task_support == "optional"
