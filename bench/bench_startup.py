"""Start-up of new conversations beside bare ``docker run``s of the image, measured side by side in one run.

Run from the repository root::

    .venv/bin/python bench/bench_startup.py [--cold-repeat 8] [--bursts 10,50,100] [--pool 10] [--policy gvisor]

Three parts, each beside its baseline measured in the same run (the case first in one round, the baseline
first in the next):

* **cold start, by phase**: ``conversation.run_python("print(1)")`` in a new conversation of a runtime without a
  pool (everything on the call's path), beside ``docker run --rm --network none <image> python3 -c 'print(1)'``
  (docker-py). The phases come from a profile of those same cold starts (``cProfile`` on the wall clock, so its
  own overhead is in them, mostly in "the rest"): the results folder with its quota volume, the engine's
  create, start and inspect, the resident executor's start (its exec, until it says it is ready), the first run,
  and the state store's statements.
* **bursts**: N new conversations at once (N threads, released together, each to its first ``print(1)``),
  beside N concurrent bare ``docker run``s: the wall time until the last result, and p50 / p95 per conversation.
  Every result is checked, and after each burst nothing may be left: no container of the run, no mount under
  its state directory.
* **the pool under bursts**: a runtime keeping a warm pool that follows demand (``[pool]``: the policy's floor,
  ``max_ready_count = --pool``), at rest at its floor; a first burst of ``--pool`` new conversations (mostly cold:
  the pool learns the demand), the time until the pool has grown to that many (started ``starts_at_once_max``
  side by side), then a second burst of as many: p50 / p95 of first results and how many took a pooled sandbox,
  for each burst.

Every container carries ``io.sandbox-runtime.bench=<uuid>`` and is removed at the end, with the state
directories. Numbers are reported, never asserted.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import docker
from benchkit import line, pair, percentile

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.policy import load_policy
from sandbox_runtime.sandbox.image import executor_image_tag

BENCH_LABEL = "io.sandbox-runtime.bench"
WAIT_S = 600.0  # the longest a burst or the pool's filling may take
# (phase, file the function is in, function): cumulative wall time per cold start
PHASES = (
    ("results folder and quota volume", "sandbox_runtime/store/folders.py", "prepare"),
    ("engine: create the container", "docker/api/container.py", "create_container"),
    ("engine: start it", "docker/api/container.py", "start"),
    ("engine: inspect it", "sandbox_runtime/sandbox/docker/backend.py", "inspect"),
    ("resident executor: exec until ready", "sandbox_runtime/sandbox/executors.py", "_open"),
    ("the first run", "sandbox_runtime/sandbox/executor_channel.py", "run"),
    ("state store statements", "sandbox_runtime/state/sqlite.py", "run"),
)
TOTAL = ("sandbox_runtime/api/conversation.py", "run_python")


def _first_result(runtime: Runtime, name: str) -> float:
    conversation = runtime.conversation(name)
    start = time.perf_counter()
    result = conversation.run_python("print(1)")
    elapsed = time.perf_counter() - start
    if (result.status, result.stdout) != ("ok", "1\n"):
        raise RuntimeError(f"{name}: {result.status} {result.stdout!r} {result.stderr[-500:]}")
    return elapsed


class Startup:
    def __init__(self, runtime: Runtime, client: docker.DockerClient, label: str) -> None:
        self.runtime, self.client, self.label = runtime, client, label
        self.image = runtime.manager.image

    def docker_run(self) -> float:
        start = time.perf_counter()
        out = self.client.containers.run(
            self.image,
            ["python3", "-c", "print(1)"],
            network_mode="none",
            remove=True,
            labels={BENCH_LABEL: self.label},
        )
        elapsed = time.perf_counter() - start
        if out != b"1\n":
            raise RuntimeError(f"docker run printed {out!r}")
        return elapsed

    def cold(self, profiler: cProfile.Profile) -> float:
        name = f"bench-cold-{uuid.uuid4().hex[:12]}"
        profiler.enable()
        try:
            return _first_result(self.runtime, name)
        finally:
            profiler.disable()
            self.runtime.conversation(name).delete()  # untimed: the number of running containers stays steady

    def burst(self, runtime: Runtime, n: int) -> tuple[float, list[float]]:
        """N new conversations at once: the wall time to the last first result, and each one's."""
        return _together(n, lambda i: _first_result(runtime, f"bench-burst-{n}-{i}-{uuid.uuid4().hex[:6]}"))

    def docker_burst(self, n: int) -> tuple[float, list[float]]:
        return _together(n, lambda _i: self.docker_run())

    def clear(self, runtime: Runtime) -> None:
        """Delete every conversation of ``runtime``, then check that nothing of them is left."""
        for record in runtime.state.conversations():
            runtime.conversation_by_key(record.id).delete()
        left = [c for c in self.client.containers.list(all=True, filters={"label": f"{BENCH_LABEL}={self.label}"})]
        left = [c for c in left if "io.sandbox-runtime.pool-slot" not in c.labels]
        mounts = [m for m in Path("/proc/self/mounts").read_text().splitlines() if str(runtime.state_dir) in m]
        conversation_mounts = [m for m in mounts if "/conversations/" in m]
        if left or conversation_mounts:
            raise RuntimeError(f"left behind: {len(left)} containers, {len(conversation_mounts)} mounts")


def _together(n: int, job: Callable[[int], float]) -> tuple[float, list[float]]:
    times: list[float] = [0.0] * n
    errors: list[BaseException] = []
    gate = threading.Barrier(n + 1)

    def one(i: int) -> None:
        gate.wait(timeout=WAIT_S)
        try:
            times[i] = job(i)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    gate.wait(timeout=WAIT_S)
    start = time.perf_counter()
    for thread in threads:
        thread.join(WAIT_S)
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} of {n} failed; the first: {errors[0]!r}")
    return wall, times


def phases(profiler: cProfile.Profile, starts: int) -> list[tuple[str, float]]:
    """Each phase's wall time per cold start (ms), then the rest and the whole call."""
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    found: dict[str, float] = {}
    total = 0.0
    for (filename, _line, function), (_cc, _nc, _tt, cumulative, _callers) in stats.items():
        if filename.endswith(TOTAL[0]) and function == TOTAL[1]:
            total += cumulative
        for phase, where, name in PHASES:
            if filename.endswith(where) and function == name:
                found[phase] = found.get(phase, 0.0) + cumulative
    shown = [(phase, found.get(phase, 0.0) * 1000 / starts) for phase, _where, _name in PHASES]
    engine_and_executor = sum(ms for phase, ms in shown if phase != "state store statements")
    rest = total * 1000 / starts - engine_and_executor
    return [
        *shown,
        ("the rest (locks, records, pipeline, the profile's own cost)", rest),
        ("the whole call", total * 1000 / starts),
    ]


def cold_part(bench: Startup, repeat: int) -> None:
    profiler = cProfile.Profile(time.perf_counter)
    cold: list[float] = []
    runs: list[float] = []
    for i in range(repeat):
        if i % 2 == 0:
            cold.append(bench.cold(profiler))
            runs.append(bench.docker_run())
        else:
            runs.append(bench.docker_run())
            cold.append(bench.cold(profiler))
    pair("a new conversation's first result, no pool", ("cold start", cold), ("docker run --rm", runs), 1000, "ms")
    print(f"  p95: {percentile(cold, 95) / percentile(runs, 95):.2f}x of docker run's p95")
    print("\n  where a cold start's time goes (ms per start, wall clock, from a profile of the starts above)")
    for phase, ms in phases(profiler, len(cold)):
        print(f"    {phase:<62}{ms:>8.1f}")


def burst_part(bench: Startup, n: int, ours_first: bool) -> None:
    print(f"\nburst of {n} new conversations at once, beside {n} concurrent docker runs")
    results: dict[str, tuple[float, list[float]]] = {}
    for which in ("ours", "docker") if ours_first else ("docker", "ours"):
        results[which] = bench.burst(bench.runtime, n) if which == "ours" else bench.docker_burst(n)
        if which == "ours":
            bench.clear(bench.runtime)
    for which, what in (("ours", f"{n} conversations"), ("docker", f"{n} docker runs")):
        wall, each = results[which]
        ratio = f"  {wall / results['docker'][0]:.2f}x wall" if which == "ours" else ""
        print(
            f"  {what:<40} wall {wall:7.2f} s    p50 {statistics.median(each):6.2f} s"
            f"  p95 {percentile(each, 95):6.2f} s{ratio}"
        )
    print("  every result checked; nothing left (containers, mounts)")


def pool_part(bench: Startup, pooled: Runtime, n: int) -> None:
    pool = pooled.pool
    if pool is None or not pool.wait_until_ready(timeout_s=WAIT_S):
        raise RuntimeError("the pool did not fill")
    print(f"\nthe pool (at rest: {pool.ready()} ready, ceiling {n}) under two bursts of {n} new conversations")
    for number, burst in enumerate(("burst 1 (from its floor)", "burst 2 (once it grew)")):
        before = {record.id for record in pooled.state.conversations()}
        wall, each = bench.burst(pooled, n)
        records = [record for record in pooled.state.conversations() if record.id not in before]
        took = sum(1 for record in records if pooled.conversation_by_key(record.id).sandbox().pooled)
        line(f"{burst}: {took} of {n} pooled, wall {wall:.2f} s", each, 1000, "ms")
        print(f"  p95 {percentile(each, 95) * 1000:.1f} ms")
        if number == 0:
            growing = time.monotonic()
            if not pool.wait_until_ready(n, timeout_s=WAIT_S):
                raise RuntimeError(f"the pool did not grow to {n}: {pool.ready()} ready, target {pool.target()}")
            print(f"  the pool grew to {n} ready in {time.monotonic() - growing:.2f} s")
    bench.clear(pooled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold-repeat", type=int, default=8, help="cold starts and docker runs each (default 8)")
    parser.add_argument("--bursts", default="10,50,100", help="burst sizes, comma-separated (default 10,50,100)")
    parser.add_argument("--pool", type=int, default=10, help="the pool's max_ready_count, and its bursts (default 10)")
    parser.add_argument("--policy", default="default", help="the policy to run under (gvisor: runsc)")
    opts = parser.parse_args()
    label = uuid.uuid4().hex
    sizes = [int(size) for size in opts.bursts.split(",") if size]
    # one connection per concurrent docker run: the baseline never waits for the client's own pool
    client = docker.from_env(timeout=int(WAIT_S), max_pool_size=max([*sizes, opts.pool]) + 5)
    folders = [tempfile.mkdtemp(prefix="sandbox-bench-startup-") for _ in range(2)]
    policy = load_policy(opts.policy)
    pooled_policy = policy.changed({"pool": {"max_ready_count": opts.pool}}, f"a pool growing to {opts.pool}")
    image = executor_image_tag()
    labels = {BENCH_LABEL: label}
    runtimes = [  # without a pool (cold starts, bursts), and keeping --pool sandboxes ready
        Runtime(
            folder,
            chosen,
            image=image,
            extra_labels=labels,
            sweep_on_start=False,
            reap_interval_s=None,
            retention_interval_s=None,
            warm_pool=pooled,
        )
        for folder, chosen, pooled in ((folders[0], policy, False), (folders[1], pooled_policy, True))
    ]
    started = time.monotonic()
    try:
        bench = Startup(runtimes[0], client, label)
        _first_result(runtimes[0], "bench-warmup")  # absorbs the once-per-process self-check
        bench.docker_run()
        bench.clear(runtimes[0])
        print(f"machine: cores={len(os.sched_getaffinity(0))}, policy={opts.policy}, image={bench.image}")
        print(f"\n  {'case':<56}{'n':>6}{'p50':>13}{'p90':>13}{'ratio':>8}")
        cold_part(bench, opts.cold_repeat)
        for index, n in enumerate(sizes):
            burst_part(bench, n, ours_first=index % 2 == 0)
        pool_part(bench, runtimes[1], opts.pool)
        print(f"\nwall time {time.monotonic() - started:.0f} s")
    finally:
        for runtime in runtimes:
            for record in runtime.state.conversations():
                runtime.conversation_by_key(record.id).delete()
            runtime.close()
        for container in client.containers.list(all=True, filters={"label": f"{BENCH_LABEL}={label}"}):
            container.remove(force=True)
        client.close()
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
