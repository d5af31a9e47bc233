"""Replicas on one PostgreSQL state beside one server on SQLite: calls per second and warm latency, side by side.

Run from the repository root (PostgreSQL must be installed: ``scripts/setup-dev.sh``)::

    .venv/bin/python bench/bench_replicas.py [--conversations 6] [--rounds 10] [--repeat 10] [--fresh-connections]
    .venv/bin/python bench/bench_replicas.py --quick     # a smoke run, well under a minute

Three setups of ``sandbox-runtime serve --http 127.0.0.1:0``, all running at once, each with a state folder of its
own (the default policy, its warm pool included):

* ``(a)`` one server, its state in SQLite (the default: no URL; ``synchronous=FULL``);
* ``(b)`` one server, its state in PostgreSQL (a private server, ``tests/postgres_cluster.py``, with ``fsync`` and
  ``full_page_writes`` turned back on as in production; ``--pg-fsync off`` keeps the tests' setting);
* ``(c)`` three replicas on one PostgreSQL database and one shared state folder; the calls go round-robin over
  them (a client-side load balancer), so a conversation's calls move from replica to replica;
* ``(d)`` the same, with each conversation kept on one replica (a load balancer that routes by the conversation,
  or by the bearer token that names it): the setup the README recommends. A sandbox's resident executor belongs
  to the replica that started it, so a conversation that moves to another replica pays a fresh executor.

The workload: ``--conversations`` conversations per setup, each driven by a client of its own (the official MCP
SDK's, stateless 2026-07-28, one per conversation and replica, made before anything is timed) that sends
``run_python("print(1)")`` calls one after another, its conversation named in ``_meta``; throughput comes from the
conversations running side by side (one conversation's runs take turns, across replicas too). Each setup first
gets the same untimed warm-up (3 calls per conversation: the first starts its sandbox; in (c) every replica sees
every conversation), then the warm pools are left to refill. Then ``--rounds`` rounds, the setups in turn (a, b, c,
d, then d, c, b, a, ...): a burst of ``--repeat`` calls per conversation, all conversations at once (calls/s = calls /
the bursts' wall time; p50 and p95 over every call; ``run p50``: the server's own ``duration_s`` of the run in the
sandbox), then ``--repeat`` single calls of one client per setup, the setups in rotation: the warm path without
concurrency. All clients share this process's event loop, so a call's time includes waiting for it (alike for every
setup); the servers, PostgreSQL, Docker and the clients share the machine.

Each client keeps its connection alive, as every MCP client does (``--fresh-connections``: a new loopback
connection per request). Writing this benchmark found that a request on a kept-alive connection waited ~45 ms for
the client's delayed ACK; ``serve`` now sends at once (``TCP_NODELAY``, tests/test_http_transport.py).

Every sandbox carries ``io.sandbox-runtime.bench=<run id>``. At the end the servers are stopped by pid (SIGTERM,
then SIGKILL), every conversation is deleted by a runtime on each state, leftovers with the label are removed, and
the PostgreSQL server and the temporary folders go. Numbers are reported, never asserted.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import anyio
import docker
import httpx2
import mcp_types as types
import psycopg
from benchkit import percentile
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandbox_runtime import Runtime
from sandbox_runtime.mcp.results import META_CONVERSATION
from sandbox_runtime.policy import load_policy
from sandbox_runtime.state.location import STATE_URL_VARIABLE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for tests/
from tests.postgres_cluster import PostgresCluster

BENCH_LABEL = "io.sandbox-runtime.bench"
STATELESS = "2026-07-28"
CODE = "print(1)"
WARM_UP_CALLS = 3  # per conversation: the first starts its sandbox; in (c) each replica gets one
START_S = 60.0  # until a server prints its URL
STOP_S = 30.0  # after SIGTERM, before SIGKILL
CALL_S = 120.0  # one call
REFILL_S = 180.0  # until the warm pools are full again after the warm-up
QUIET = ("serving MCP at ", "SIGTERM: stopping", "state on ")  # what serve says at every start and stop


@dataclass
class Server:
    """One ``serve --http`` process; its stderr lines are kept (and queued until its URL is known)."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    url: str = ""


def start_server(state_dir: Path, label: str, state_url: str | None) -> Server:
    command = [sys.executable, "-m", "sandbox_runtime.cli.main", "--state-dir", str(state_dir)]
    command += ["--label", f"{BENCH_LABEL}={label}", "serve", "--http", "127.0.0.1:0"]
    env = {k: v for k, v in os.environ.items() if k not in (STATE_URL_VARIABLE, "SANDBOX_RUNTIME_MCP_TOKEN")}
    if state_url is not None:
        env[STATE_URL_VARIABLE] = state_url
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    server, started = Server(process), queue.Queue[str | None]()

    def pump() -> None:
        assert process.stderr is not None
        for text in process.stderr:
            server.lines.append(text.rstrip())
            started.put(text)
        started.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + START_S
    while not server.url:
        try:
            text = started.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            text = None
        if text is None or time.monotonic() > deadline:
            stop_server(server)
            raise RuntimeError(f"serve printed no URL within {START_S:.0f} s: {server.lines[-10:]}")
        if text.startswith(QUIET[0]):
            server.url = text.removeprefix(QUIET[0]).strip()
    return server


def stop_server(server: Server) -> None:
    """SIGTERM to its pid, then SIGKILL when it has not ended within ``STOP_S``."""
    if server.process.poll() is None:
        server.process.terminate()
    try:
        server.process.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(timeout=STOP_S)


class Setup:
    """The servers of one setup, a persistent client per (conversation, replica), and what was measured."""

    def __init__(self, name: str, servers: list[Server], *, sticky: bool = False) -> None:
        self.name, self.servers, self.sticky = name, servers, sticky
        self.turn = itertools.count()  # the round-robin over the replicas, shared by all of the setup's calls
        self.clients: dict[tuple[int, int], Client] = {}
        self.burst_samples: list[float] = []
        self.run_samples: list[float] = []  # the server's own duration_s of each burst call's run in the sandbox
        self.single_samples: list[float] = []
        self.busy_s = 0.0

    async def open(self, stack: AsyncExitStack, conversations: int, fresh: bool) -> None:
        limits = httpx2.Limits(max_keepalive_connections=0 if fresh else None)
        for number, (replica, server) in itertools.product(range(conversations), enumerate(self.servers)):
            http = await stack.enter_async_context(httpx2.AsyncClient(timeout=CALL_S, limits=limits))
            client = Client(streamable_http_client(server.url, http_client=http), mode=STATELESS)
            self.clients[number, replica] = await stack.enter_async_context(client)
            await self.clients[number, replica].list_tools()

    async def call(self, number: int) -> tuple[float, float]:
        """One call of the conversation on the next replica (its own, when sticky): (its time, the server's time of
        the run itself)."""
        replica = number if self.sticky else next(self.turn)
        client = self.clients[number, replica % len(self.servers)]
        meta = cast(types.RequestParamsMeta, {META_CONVERSATION: f"bench-{number}"})
        start = time.perf_counter()
        result = await client.call_tool("run_python", {"code": CODE}, meta=meta)
        took = time.perf_counter() - start
        if result.is_error:
            said = " ".join(b.text for b in result.content if isinstance(b, types.TextContent))
            raise RuntimeError(f"{self.name}: run_python failed: {said[:500]}")
        return took, float((result.structured_content or {}).get("duration_s") or 0.0)

    async def burst(self, conversations: int, calls: int, keep: bool = True) -> None:
        """``calls`` calls per conversation, one after another; all conversations at once."""

        async def drive(number: int) -> None:
            for _ in range(calls):
                took, run_s = await self.call(number)
                if keep:
                    self.burst_samples.append(took)
                    self.run_samples.append(run_s)

        start = time.perf_counter()
        async with anyio.create_task_group() as group:
            for number in range(conversations):
                group.start_soon(drive, number)
        if keep:
            self.busy_s += time.perf_counter() - start


def wait_for_pools(engine: docker.DockerClient, label: str, expected: int) -> None:
    """Until ``expected`` containers with the run's label run (the pools refilled after the warm-up), bounded."""
    deadline = time.monotonic() + REFILL_S
    while (found := len(engine.containers.list(filters={"label": f"{BENCH_LABEL}={label}"}))) < expected:
        if time.monotonic() > deadline:
            print(f"note: {found} of {expected} sandboxes run after {REFILL_S:.0f} s; measuring anyway")
            return
        time.sleep(0.5)
    time.sleep(2.0)  # the last pooled sandbox's executor loads


async def measure(setups: list[Setup], opts: argparse.Namespace, refill: tuple[docker.DockerClient, str, int]) -> None:
    """Warm-up, then the interleaved rounds. A failure is raised once every client is closed, as itself: passed
    through the clients' task groups, it would come out nested in as many exception groups."""
    failure: Exception | None = None
    with anyio.fail_after(opts.limit_s):
        async with AsyncExitStack() as stack:
            try:
                for setup in setups:
                    await setup.open(stack, opts.conversations, opts.fresh_connections)
                for setup in setups:
                    await setup.burst(opts.conversations, WARM_UP_CALLS, keep=False)
                await anyio.to_thread.run_sync(wait_for_pools, *refill)
                for i in range(opts.rounds):
                    for setup in setups if i % 2 == 0 else setups[::-1]:
                        await setup.burst(opts.conversations, opts.repeat)
                    for j in range(opts.repeat):  # rotated (a b c, b c a, ...): no setup gets two calls in a row
                        turn = (i * opts.repeat + j) % len(setups)
                        for setup in setups[turn:] + setups[:turn]:
                            setup.single_samples.append((await setup.call(0))[0])
            except Exception as error:  # raised below, unwrapped
                failure = error
    while isinstance(failure, ExceptionGroup):
        failure = failure.exceptions[0]
    if failure is not None:
        raise failure


def clean(state_dir: Path, url: str | None) -> None:
    """Delete every conversation of a state (its sandbox, mounts and folders)."""
    runtime = Runtime(state_dir, state_url=url, reap_interval_s=None, retention_interval_s=None)
    try:
        for record in runtime.state.conversations():
            runtime.conversation(record.id).delete()
    finally:
        runtime.close()


def p50(values: list[float]) -> float:
    return statistics.median(values)


def report(setups: list[Setup]) -> None:
    a, b, c, d = setups
    rate = {s.name: len(s.burst_samples) / s.busy_s for s in setups}
    print(f"\n  {'all conversations at once':<44}{'calls':>7}{'calls/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'run p50':>9}")
    for s in setups:
        values, runs = s.burst_samples, s.run_samples
        shown = f"{rate[s.name]:>9.1f}{p50(values) * 1e3:>9.1f}{percentile(values, 95) * 1e3:>9.1f}"
        print(f"  {s.name:<44}{len(values):>7}{shown}{p50(runs) * 1e3:>9.1f}")
    print(f"\n  {'single client, sequential':<44}{'calls':>7}{'':>9}{'p50 ms':>9}{'p95 ms':>9}")
    for s in setups:
        values = s.single_samples
        print(f"  {s.name:<44}{len(values):>7}{'':>9}{p50(values) * 1e3:>9.1f}{percentile(values, 95) * 1e3:>9.1f}")
    ratios = {
        "(b)/(a) p50, all at once: the cost of the shared store on the warm path": (b.burst_samples, a.burst_samples),
        "(b)/(a) p50, single client: the same without concurrency": (b.single_samples, a.single_samples),
        "(c)/(b) p50, single client: each call on another replica than the last": (c.single_samples, b.single_samples),
        "(d)/(b) p50, single client: a conversation kept on one replica": (d.single_samples, b.single_samples),
    }
    print()
    for what, (case, base) in ratios.items():
        print(f"  {what:<80}{p50(case) / p50(base):>6.2f}x")
    print(f"  {'(c)/(b) calls/s':<80}{rate[c.name] / rate[b.name]:>6.2f}x")
    print(f"  {'(c)/(a) calls/s':<80}{rate[c.name] / rate[a.name]:>6.2f}x")
    print(f"  {'(d)/(b) calls/s: three replicas, each conversation on one':<80}{rate[d.name] / rate[b.name]:>6.2f}x")
    print(f"  {'(d)/(a) calls/s':<80}{rate[d.name] / rate[a.name]:>6.2f}x")


def durable(cluster: PostgresCluster, on: bool) -> str:
    """Set fsync and full_page_writes (the tests' cluster runs without them; a production server with them);
    returns the server's version."""
    with psycopg.connect(cluster.url(), autocommit=True, connect_timeout=10) as admin:
        value = "on" if on else "off"
        admin.execute(f"ALTER SYSTEM SET fsync = {value}")
        admin.execute(f"ALTER SYSTEM SET full_page_writes = {value}")
        admin.execute("SELECT pg_reload_conf()")
        row = admin.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--conversations", type=int, default=6, help="conversations (clients) per setup (default 6)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds over the setups (default 10)")
    parser.add_argument("--repeat", type=int, default=10, help="calls per conversation per burst (default 10)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 conversations, 2 rounds, 3 calls")
    parser.add_argument("--fresh-connections", action="store_true", help="a new connection per request")
    parser.add_argument("--pg-fsync", choices=("on", "off"), default="on", help="PostgreSQL's fsync (default on)")
    parser.add_argument("--limit-s", type=float, default=1800.0, help="the whole measurement's bound (default 1800)")
    opts = parser.parse_args()
    if opts.quick:
        opts.conversations, opts.rounds, opts.repeat = 3, 2, 3
    label = uuid.uuid4().hex[:12]
    engine = docker.from_env()
    started = time.monotonic()
    servers: list[Server] = []
    with (
        tempfile.TemporaryDirectory(prefix="sbrt-bench-replicas-", dir="/var/tmp", ignore_cleanup_errors=True) as work,
        PostgresCluster() as cluster,
    ):
        version = durable(cluster, opts.pg_fsync == "on")
        print(
            f"machine: nproc={len(os.sched_getaffinity(0))}, python={platform.python_version()}, run id={label}, "
            f"pid={os.getpid()}; PostgreSQL {version} on 127.0.0.1:{cluster.port} (fsync={opts.pg_fsync}; "
            "SQLite: synchronous=FULL)\n"
            f"{opts.conversations} conversations per setup, each one client calling run_python({CODE!r}) in turn; "
            f"{opts.rounds} rounds (a b c d, d c b a, ...) of {opts.repeat} calls per conversation, all at once, then "
            f"{opts.repeat} single calls per setup; {WARM_UP_CALLS} untimed warm-up calls per conversation first; "
            f"{'a new connection per request' if opts.fresh_connections else 'kept-alive connections'}"
        )
        stores: dict[str, tuple[Path, str | None]] = {
            "(a) 1 server, SQLite": (Path(work, "a"), None),
            "(b) 1 server, PostgreSQL": (Path(work, "b"), cluster.create_database(f"bench_{label}_b")),
            "(c) 3 replicas, PostgreSQL, round-robin": (Path(work, "c"), cluster.create_database(f"bench_{label}_c")),
            "(d) 3 replicas, PostgreSQL, by conversation": (
                Path(work, "d"),
                cluster.create_database(f"bench_{label}_d"),
            ),
        }
        try:
            setups = []
            for (name, (state_dir, url)), count in zip(stores.items(), (1, 1, 3, 3), strict=True):
                group = [start_server(state_dir, label, url) for _ in range(count)]
                servers += group
                setups.append(Setup(name, group, sticky=name.startswith("(d)")))
            ready = load_policy("default").pool.ready_count
            expected = len(setups) * opts.conversations + ready * len(servers)  # conversations' sandboxes, full pools
            anyio.run(measure, setups, opts, (engine, label, expected))
        finally:
            for server in servers:
                stop_server(server)
            for state_dir, url in stores.values():
                if state_dir.exists():
                    clean(state_dir, url)
            leftovers = engine.containers.list(all=True, filters={"label": f"{BENCH_LABEL}={label}"})
            for container in leftovers:
                container.remove(force=True)
            engine.close()
    report(setups)
    said = [f"[serve {s.process.pid}] {text}" for s in servers for text in s.lines if not text.startswith(QUIET)]
    said = [text for text in said if " tools: " not in text]
    print(f"\nserve said, besides its start and stop lines: {len(said)} lines" + ("" if said else " (nothing)"))
    for text in said[:20]:
        print(f"  {text}")
    if leftovers:
        print(f"note: {len(leftovers)} containers with the run's label were left after the cleanup (now removed)")
    print(f"\nwall time {time.monotonic() - started:.0f} s (servers stopped, conversations deleted, PostgreSQL gone)")


if __name__ == "__main__":
    main()
