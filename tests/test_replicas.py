"""An operator runs several ``serve --http`` replicas behind a load balancer: one PostgreSQL database, one shared
state folder, real sandboxes. The official SDK's client (stateless 2026-07-28: any request may reach any replica)
drives one conversation through them in turn; the same call id raced to two replicas runs once; runs never
overlap; a replica killed with SIGKILL in the middle of a run loses nothing that was decided, and a retry of its
call on another replica gives one answer. A task one replica runs is read and cancelled on another (the
TypeScript SDK's client). The database going away is a tool error naming it, and serving resumes by itself when
it is back."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandbox_runtime.mcp.results import META_CALL_ID, META_REPLAYED
from sandbox_runtime.state.location import STATE_URL_VARIABLE
from tests.client_helpers import CALL_TIMEOUT_S, REPO, require
from tests.conftest import FAKE_POLICY, RuntimeFactory
from tests.mcp_helpers import request_meta, run_bounded, serve_command, serve_process, text_of
from tests.postgres_cluster import PostgresCluster
from tests.test_mcp_tasks import DRIVER_TIMEOUT_S, SDK, last_report, node_driver

pytestmark = pytest.mark.postgresql

STATELESS = "2026-07-28"
CONVERSATION = "mcp-http"  # every replica's default conversation when it has no token
WAIT_S = 60.0


@dataclass
class Replica:
    process: subprocess.Popen[str]
    url: str
    said: list[str]  # its stderr up to the line with its URL


def start_lines(lines: queue.Queue[str | None]) -> tuple[str, list[str]]:
    """The URL a replica serves at, and what it said until then (bounded)."""
    said: list[str] = []
    deadline = time.monotonic() + WAIT_S
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        if line is None:
            raise AssertionError(f"serve ended before it served: {said}")
        said.append(line)
        if line.startswith("serving MCP at "):
            return line.removeprefix("serving MCP at ").strip(), said


@contextmanager
def replicas(state: Path, database_url: str, count: int, policy: Path | str | None = None) -> Iterator[list[Replica]]:
    """``count`` replicas of ``serve --http`` on one state folder and one database (its URL, password and all, in
    the environment, as an operator gives it); each stopped by pid afterwards (SIGTERM, then SIGKILL)."""
    environment = {**os.environ, STATE_URL_VARIABLE: database_url}
    environment.pop("SANDBOX_RUNTIME_MCP_TOKEN", None)
    with ExitStack() as stack:
        started = []
        for _ in range(count):
            command = serve_command(state, "--http", "127.0.0.1:0", policy=policy)
            process, lines = stack.enter_context(serve_process(command, env=environment))
            started.append(Replica(process, *start_lines(lines)))
        try:
            yield started
        finally:
            for replica in started:
                if replica.process.poll() is None:
                    replica.process.terminate()
            for replica in started:
                try:
                    replica.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    replica.process.kill()


@pytest.fixture
def replicated_state(postgres_url: str, runtime_factory: RuntimeFactory, tmp_path: Path) -> Iterator[Path]:
    """The state folder the replicas share; afterwards a runtime on it (and the database) deletes every
    conversation they made: sandboxes, mounts and files."""
    state = tmp_path / "state"
    yield state
    runtime_factory(state_dir=state, state_url=postgres_url)


async def _call(url: str, code: str, call_id: str) -> types.CallToolResult:
    """One ``run_python`` call through the official client, stateless: the request stands alone."""
    async with (
        httpx2.AsyncClient(timeout=CALL_TIMEOUT_S) as http,
        Client(streamable_http_client(url, http_client=http), mode=STATELESS) as client,
    ):
        await client.list_tools()
        return await client.call_tool("run_python", {"code": code}, meta=request_meta({META_CALL_ID: call_id}))


def call(replica: Replica, code: str, call_id: str) -> types.CallToolResult:
    return run_bounded(_call, replica.url, code, call_id)


def at_once(*calls: tuple[Replica, str, str]) -> list[types.CallToolResult]:
    """Several calls sent at the same moment, each to its replica."""
    results: list[Any] = [None] * len(calls)

    async def all_of_them() -> list[types.CallToolResult]:
        async def one(n: int, replica: Replica, code: str, call_id: str) -> None:
            results[n] = await _call(replica.url, code, call_id)

        async with anyio.create_task_group() as group:
            for n, (replica, code, call_id) in enumerate(calls):
                group.start_soon(one, n, replica, code, call_id)
        return results

    return run_bounded(all_of_them)


def replayed(result: types.CallToolResult) -> bool:
    return bool((result.meta or {}).get(META_REPLAYED))


APPEND = "open('turns.txt', 'a').write('{n}\\n'); print(open('turns.txt').read().split())"
RACED = "import time\nopen('raced.txt', 'a').write('ran\\n')\ntime.sleep(2)\nprint('raced ran')"
STAMPED = (
    "import time\nstart = time.time()\ntime.sleep(1.5)\n"
    "open('stamps.txt', 'a').write(f'{{start}} {{time.time()}}\\n')\nprint('{name}')"
)
INTERRUPTED = (
    "import os, time\nfirst = not os.path.exists('interrupted.txt')\n"
    "open('interrupted.txt', 'a').write('ran\\n')\ntime.sleep(60 if first else 0)\n"
    "print('runs so far:', len(open('interrupted.txt').readlines()))"
)


@pytest.mark.first
def test_three_replicas_serve_one_conversation_a_raced_call_runs_once_and_a_killed_one_loses_nothing(
    postgres_url: str, replicated_state: Path, runtime_factory: RuntimeFactory
) -> None:
    results = replicated_state / "conversations" / CONVERSATION / "results"
    with replicas(replicated_state, postgres_url, 3) as (one, two, three):
        # one conversation, whichever replica takes the call: each sees what the others wrote
        seen = [
            text_of(call(replica, APPEND.format(n=n), f"turn-{n}")) for n, replica in enumerate([one, two, three] * 2)
        ]
        assert "['0', '1', '2', '3', '4', '5']" in seen[-1]

        # the same call id at the same moment on two replicas: it runs once, both answers are its decision
        first, second = at_once((one, RACED, "raced"), (two, RACED, "raced"))
        assert text_of(first) == text_of(second)
        assert "raced ran" in text_of(first)
        assert sorted([replayed(first), replayed(second)]) == [False, True]
        assert (results / "raced.txt").read_text() == "ran\n"  # the side effect happened once

        # two runs of the conversation sent at once to two replicas take turns, never overlap
        at_once((two, STAMPED.format(name="a"), "stamp-a"), (three, STAMPED.format(name="b"), "stamp-b"))
        (_, a_end), (b_start, _) = sorted(
            tuple(map(float, line.split())) for line in (results / "stamps.txt").read_text().splitlines()
        )
        assert a_end <= b_start

        # a replica killed in the middle of a run
        decided_before = (
            runtime_factory(state_dir=replicated_state, state_url=postgres_url).conversation(CONVERSATION).decisions()
        )

        async def interrupted_on_three() -> None:
            with anyio.move_on_after(WAIT_S):
                await _call(three.url, INTERRUPTED, "interrupted")

        with anyio.from_thread.start_blocking_portal() as portal:
            portal.start_task_soon(interrupted_on_three)
            deadline = time.monotonic() + WAIT_S
            while not (results / "interrupted.txt").exists():  # the run is under way
                assert time.monotonic() < deadline, "the run on the third replica never started"
                time.sleep(0.05)
            three.process.send_signal(signal.SIGKILL)
            three.process.wait(timeout=30)
        retried = call(one, INTERRUPTED, "interrupted")  # the client retries it on another replica
        assert not replayed(retried)
        assert "runs so far: 2" in text_of(retried)  # no decision had been stored: it ran again, as after any crash
        again = call(two, INTERRUPTED, "interrupted")
        assert replayed(again)
        assert text_of(again) == text_of(retried)  # from now on, one answer

    runtime = runtime_factory(state_dir=replicated_state, state_url=postgres_url)
    decided_after = runtime.conversation(CONVERSATION).decisions()
    assert decided_after[: len(decided_before)] == decided_before  # nothing decided was lost or changed
    assert [d.call_id for d in decided_after[len(decided_before) :]] == ["interrupted"]
    assert all(lease.pid != three.process.pid for lease in runtime.state.leases.live())  # its lease is gone


def test_the_database_going_away_is_a_tool_error_naming_it_and_serving_resumes_when_it_is_back(
    postgres_cluster: PostgresCluster,
    postgres_url: str,
    fake_runtime_factory: RuntimeFactory,
    fake_policy_file: Path,
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    try:
        with replicas(state, postgres_url, 1, policy=fake_policy_file) as (only,):
            assert any(line.startswith("state on postgresql://sandbox:***@127.0.0.1:") for line in only.said)
            assert not any(postgres_cluster.password in line for line in only.said)
            assert "before" in text_of(call(only, "print('before')", "before"))
            postgres_cluster.stop()
            down = call(only, "print('during')", "during")
            assert down.is_error
            assert "StateUnavailable" in text_of(down)
            assert "postgresql://sandbox:***@127.0.0.1" in text_of(down)
            assert postgres_cluster.password not in text_of(down)
            postgres_cluster.start()
            assert "after" in text_of(call(only, "print('after')", "after"))  # the same replica, by itself
            assert replayed(call(only, "print('before')", "before"))
    finally:
        postgres_cluster.start()
        fake_runtime_factory(state_dir=state, state_url=postgres_url)


GATED = (  # a run that goes on until the test lets it end (its gate file exists), then says how often it ran
    "import os, time\nopen('{name}.txt', 'a').write('ran\\n')\ndeadline = time.time() + 60\n"
    "while not os.path.exists('{name}.go') and time.time() < deadline:\n    time.sleep(0.01)\n"
    "print('runs so far:', len(open('{name}.txt').readlines()))"
)


def fails_as_the_database_goes_away(
    cluster: PostgresCluster, replica: Replica, results: Path, name: str
) -> types.CallToolResult:
    """Run a gated call with the call id ``name`` on ``replica``; stop the database while it runs, then let it end.
    Its answer (the database is still stopped)."""
    with anyio.from_thread.start_blocking_portal() as portal:
        answer = portal.start_task_soon(_call, replica.url, GATED.format(name=name), name)
        deadline = time.monotonic() + WAIT_S
        while not (results / f"{name}.txt").exists():  # the run is under way: its claim was taken
            assert time.monotonic() < deadline, "the gated run never started"
            time.sleep(0.02)
        cluster.stop()
        (results / f"{name}.go").touch()
        return answer.result(timeout=WAIT_S)


@pytest.mark.first
def test_a_call_in_flight_when_the_database_goes_away_is_run_by_its_retry_once_the_database_is_back(
    postgres_cluster: PostgresCluster, postgres_url: str, fake_runtime_factory: RuntimeFactory, tmp_path: Path
) -> None:
    policy = tmp_path / "fake-short-lease.toml"
    # the lease renewed (and the writes owed made) every second; a retry held up by a claim fails within 15 s
    policy.write_text(f"{FAKE_POLICY}[state]\nlease_ttl_s = 3\ncall_wait_s = 15\n")
    state = tmp_path / "state"
    results = state / "conversations" / CONVERSATION / "results"
    try:
        with replicas(state, postgres_url, 2, policy=policy) as (one, two):
            assert "ready" in text_of(call(one, "print('ready')", "ready"))  # the conversation's folder exists
            for name, retried_on in (("retried-here", one), ("retried-elsewhere", two)):
                failed = fails_as_the_database_goes_away(postgres_cluster, one, results, name)
                assert failed.is_error
                assert "StateUnavailable" in text_of(failed)
                postgres_cluster.start()
                # no decision was stored: the retry runs the call (on another replica once the first gave its claim
                # back, which it owed the state while it was away); from then on, one answer
                retried = call(retried_on, GATED.format(name=name), name)
                assert not retried.is_error, text_of(retried)
                assert "runs so far: 2" in text_of(retried)
                again = call(two if retried_on is one else one, GATED.format(name=name), name)
                assert replayed(again)
                assert text_of(again) == text_of(retried)
    finally:
        postgres_cluster.start()
        fake_runtime_factory(state_dir=state, state_url=postgres_url)


TASKS_DRIVER = REPO / "tests" / "clients" / "replica_tasks_client.mjs"
SLEEPER = "import time\nopen('started.txt', 'w').write('x')\ntime.sleep(90)\nprint('never cancelled')"


def test_a_task_started_on_one_replica_is_read_listed_and_cancelled_on_another(
    postgres_url: str, fake_runtime_factory: RuntimeFactory, fake_policy_file: Path, tmp_path: Path
) -> None:
    require(SDK, "the TypeScript MCP SDK (@modelcontextprotocol/sdk)")
    state = tmp_path / "state"
    try:
        with replicas(state, postgres_url, 2, policy=fake_policy_file) as (a, b):
            request = {"a": a.url, "b": b.url, "code": SLEEPER, "timeout_ms": 120_000}
            deadline = time.monotonic() + DRIVER_TIMEOUT_S
            with node_driver(TASKS_DRIVER, request) as (driver, lines):
                created = json.loads(lines.get(timeout=WAIT_S))["created"]
                started = state / "conversations" / CONVERSATION / "results" / "started.txt"
                while not started.exists():  # the run is under way on replica A
                    assert time.monotonic() < deadline, "the task's run never started"
                    time.sleep(0.05)
                assert driver.stdin is not None
                driver.stdin.write("go\n")
                driver.stdin.flush()
                report = last_report(lines, deadline)
    finally:
        fake_runtime_factory(state_dir=state, state_url=postgres_url)
    assert report["b_get"]["taskId"] == created
    assert report["b_get"]["status"] == "working"  # replica B reads the task replica A runs
    assert created in report["b_listed"]
    assert report["b_cancelled"]["status"] == "cancelled"
    assert report["a_after"]["status"] == "cancelled"  # replica A says so too
    payload = report["b_payload"]  # the call's own end: replica A cancelled the run it was running
    assert "never cancelled" not in json.dumps(payload)
    assert payload["isError"] is True
