"""An operator stops `serve` (systemd, `docker stop`, Kubernetes, `timeout` send SIGTERM; a terminal sends SIGINT):
the server takes no new call, lets the calls in flight finish within `mcp.shutdown_grace_s`, cancels the rest (its
client told, its record `cancelled`), removes its warm pool, unmounts what it mounted, drops its lease and exits
0. Conversations' sandboxes stay for the next process, on their own mounts."""

from __future__ import annotations

import json
import queue
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandbox_runtime.sandbox.docker.backend import DockerBackend
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION, LABEL_POOL_SLOT, LABEL_STATE_DIR
from tests.conftest import FAKE_POLICY, SESSION, TEST_LABEL, RuntimeFactory, mounts_under
from tests.mcp_helpers import (
    line_matching,
    line_starting,
    request_meta,
    run_bounded,
    serve_command,
    serve_process,
    text_of,
)

GRACE_S = 6.0
STOPPED_WITHIN_S = 90.0  # the grace, the cancelled run's end, the pool's removal and the unmounts
POOL_READY_S = 120.0


def _script(marker: str, sleep_s: float) -> str:
    """A run that marks the results folder (where it starts, on every backend), then sleeps and prints."""
    return f"import time\nopen({marker!r}, 'w').write('under way')\ntime.sleep({sleep_s})\nprint('finished')\n"


def _containers(backend: DockerBackend, state: Path) -> list[Any]:
    return backend.list_containers({TEST_LABEL: SESSION, LABEL_STATE_DIR: str(state.resolve())})


def _wait_for_pool(backend: DockerBackend, state: Path, count: int) -> None:
    deadline = time.monotonic() + POOL_READY_S
    while sum(LABEL_POOL_SLOT in c.labels for c in _containers(backend, state)) < count:
        assert time.monotonic() < deadline, "the warm pool did not fill"
        time.sleep(0.2)


async def _until_exists(*paths: Path) -> None:
    with anyio.fail_after(POOL_READY_S):
        while not all(path.exists() for path in paths):
            await anyio.sleep(0.05)


def _leases(state: Path) -> int:
    with sqlite3.connect(state / "state.sqlite3") as db:
        (count,) = db.execute("SELECT count(*) FROM leases").fetchone()
    return int(count)


def _policy(tmp_path: Path) -> Path:
    policy = tmp_path / "stopping.toml"
    policy.write_text(f"[mcp]\nshutdown_grace_s = {GRACE_S}\nshutdown_retry_after_s = 7\n")
    return policy


def test_sigterm_to_an_http_server_drains_its_calls_cancels_the_late_one_cleans_up_and_exits_0(
    runtime_factory: RuntimeFactory, docker_backend: DockerBackend, served_state: Path, tmp_path: Path
) -> None:
    state = served_state
    command = serve_command(state, "--http", "127.0.0.1:0", policy=_policy(tmp_path))
    with serve_process(command) as (process, lines):
        url = line_starting(lines, "serving MCP at ")
        _wait_for_pool(docker_backend, state, 1)  # the policy's floor
        seen: dict[str, Any] = {}

        async def scenario() -> None:
            async with (
                httpx2.AsyncClient(timeout=120) as http,
                Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
            ):

                async def call(name: str, sleep_s: float) -> None:
                    meta = {"sandbox-runtime/conversation": f"stop-{name}", "sandbox-runtime/call-id": name}
                    code = _script("under-way", sleep_s)
                    seen[name] = await client.call_tool("run_python", {"code": code}, meta=request_meta(meta))
                    seen[f"{name}_at"] = time.monotonic()

                async with anyio.create_task_group() as group:
                    group.start_soon(call, "short", 3.0)  # ends inside the grace
                    group.start_soon(call, "long", 600.0)  # still running when the grace is over
                    folders = [
                        state / "conversations" / f"stop-{n}" / "results" / "under-way" for n in ("short", "long")
                    ]
                    await _until_exists(*folders)
                    process.send_signal(signal.SIGTERM)
                    seen["signalled_at"] = time.monotonic()
                    with anyio.fail_after(30):
                        while not _said(lines, "SIGTERM: stopping"):
                            await anyio.sleep(0.05)
                    refused = await http.post(
                        url,
                        json={"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "run_python"}},
                        headers={"Accept": "application/json, text/event-stream"},
                    )
                    seen["refused"] = (refused.status_code, refused.headers.get("retry-after"))

        run_bounded(scenario, limit_s=STOPPED_WITHIN_S + POOL_READY_S)
        assert process.wait(timeout=STOPPED_WITHIN_S) == 0

    assert seen["refused"] == (503, "7")
    short, long = seen["short"], seen["long"]
    assert isinstance(short, types.CallToolResult)
    assert isinstance(long, types.CallToolResult)
    assert not short.is_error
    assert "finished" in text_of(short)
    assert long.is_error
    assert "cancel" in text_of(long).lower()
    assert seen["long_at"] - seen["signalled_at"] >= GRACE_S - 0.5  # it had its grace
    # nothing of the server is left: no pooled sandbox, no mount, no lease; the conversations' sandboxes stay
    left = _containers(docker_backend, state)
    assert mounts_under(state) == []
    assert _leases(state) == 0
    assert sorted(str(_conversation_of(state, c)) for c in left) == ["stop-long", "stop-short"]
    runtime = runtime_factory(state_dir=state)
    assert [c.status for c in runtime.conversation("stop-short").calls()] == ["ok"]
    assert [c.status for c in runtime.conversation("stop-long").calls()] == ["cancelled"]


def _said(lines: queue.Queue[str | None], text: str) -> bool:
    return any(line and text in line for line in list(lines.queue))


@pytest.mark.process
def test_a_second_signal_cancels_at_once_instead_of_waiting_out_the_grace(
    fake_runtime_factory: RuntimeFactory, fake_served_state: Path, tmp_path: Path
) -> None:
    state = fake_served_state  # what is checked is the server's own: it runs on the fake backend, with no engine
    policy = tmp_path / "patient.toml"
    policy.write_text(FAKE_POLICY + "[mcp]\nshutdown_grace_s = 600.0\n")  # the first signal alone would wait 10 min
    command = serve_command(state, "--http", "127.0.0.1:0", policy=policy)
    with serve_process(command) as (process, lines):
        url = line_starting(lines, "serving MCP at ")
        seen: dict[str, Any] = {}

        async def scenario() -> None:
            async with (
                httpx2.AsyncClient(timeout=120) as http,
                Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
            ):

                async def call() -> None:
                    meta = request_meta({"sandbox-runtime/conversation": "impatient"})
                    code = _script("under-way", 600.0)
                    seen["long"] = await client.call_tool("run_python", {"code": code}, meta=meta)

                async with anyio.create_task_group() as group:
                    group.start_soon(call)
                    await _until_exists(state / "conversations" / "impatient" / "results" / "under-way")
                    process.send_signal(signal.SIGTERM)
                    with anyio.fail_after(30):
                        while not _said(lines, "SIGTERM: stopping"):
                            await anyio.sleep(0.05)
                    seen["second_at"] = time.monotonic()
                    process.send_signal(signal.SIGTERM)

        run_bounded(scenario, limit_s=STOPPED_WITHIN_S + POOL_READY_S)
        assert process.wait(timeout=STOPPED_WITHIN_S) == 0
        stopped_at = time.monotonic()

    assert stopped_at - seen["second_at"] < 60  # far from the 600 s grace
    long = seen["long"]
    assert isinstance(long, types.CallToolResult)
    assert long.is_error
    assert "cancel" in text_of(long).lower()
    assert mounts_under(state) == []
    assert _leases(state) == 0
    runtime = fake_runtime_factory(state_dir=state)
    assert [c.status for c in runtime.conversation("impatient").calls()] == ["cancelled"]


@pytest.mark.process
@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_a_sigterm_right_after_the_server_says_it_serves_stops_it(
    fake_served_state: Path, tmp_path: Path, transport: str
) -> None:
    """A service manager that stops the server as soon as it is up (a unit stopped during boot, a failed readiness
    probe): the signal is heard however soon it comes, never lost between start-up and the serving loop."""
    state = fake_served_state
    policy = tmp_path / "fake.toml"
    policy.write_text(FAKE_POLICY)
    served = ("--http", "127.0.0.1:0") if transport == "http" else ()
    command = serve_command(state, *served, policy=policy)
    with serve_process(command, stdin=subprocess.PIPE) as (process, lines):  # stdio: its client stays connected
        line_matching(lines, r"serving MCP at " if transport == "http" else r"\d+ tools: ")  # its last before serving
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOPPED_WITHIN_S) == 0
    assert mounts_under(state) == []
    assert _leases(state) == 0


def test_sigint_to_a_stdio_server_answers_its_call_as_cancelled_and_exits_0(
    runtime_factory: RuntimeFactory, docker_backend: DockerBackend, served_state: Path, tmp_path: Path
) -> None:
    state = served_state
    policy = tmp_path / "stopping.toml"
    policy.write_text("[mcp]\nshutdown_grace_s = 1.0\n")
    command = serve_command(state, "--conversation", "stdio-stopped", policy=policy)
    with serve_process(command, stdin=subprocess.PIPE) as (process, _lines):
        assert process.stdin is not None
        assert process.stdout is not None

        def send(message: dict[str, Any]) -> None:
            assert process.stdin is not None
            process.stdin.write(json.dumps(message) + "\n")
            process.stdin.flush()

        def answer(request_id: int) -> dict[str, Any]:
            assert process.stdout is not None
            for line in process.stdout:  # bounded by the test's timeout and the server's own end
                message = json.loads(line)
                if message.get("id") == request_id:
                    return dict(message)
            raise AssertionError("serve ended without answering")

        client = {"name": "operator", "version": "0"}
        send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client},
            }
        )
        assert "result" in answer(1)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        code = _script("under-way", 600.0)
        send(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "run_python", "arguments": {"code": code}},
            }
        )
        marker = state / "conversations" / "stdio-stopped" / "results" / "under-way"
        deadline = time.monotonic() + POOL_READY_S
        while not marker.exists():
            assert time.monotonic() < deadline, "the run did not start"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        cancelled = answer(2)["result"]
        assert cancelled["isError"] is True
        assert "cancel" in json.dumps(cancelled).lower()
        assert process.wait(timeout=STOPPED_WITHIN_S) == 0  # its stdin still open: the signal ended it
    # what is left is the conversation's sandbox (from the pool, recorded as its own), no waiting pooled one
    assert [_conversation_of(state, c) for c in _containers(docker_backend, state)] == ["stdio-stopped"]
    assert mounts_under(state) == []
    runtime = runtime_factory(state_dir=state)
    assert [c.status for c in runtime.conversation("stdio-stopped").calls()] == ["cancelled"]


def _conversation_of(state: Path, container: Any) -> str | None:
    """The conversation a container serves: its label, or for a pooled one the record naming it (None: none)."""
    named = container.labels.get(LABEL_CONVERSATION)
    if named is not None:
        return str(named)
    with sqlite3.connect(state / "state.sqlite3") as db:
        row = db.execute("SELECT conversation_id FROM sandboxes WHERE container_id = ?", (container.id,)).fetchone()
    return None if row is None else str(row[0])
