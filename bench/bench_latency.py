"""Latency and scale of the runtime beside plain Docker, measured side by side in one run.

Run from the repository root::

    .venv/bin/python bench/bench_latency.py [--repeat 20] [--cold-repeat 5] [--threads 8] [--policy gvisor] [--json]

The latency cases are interleaved round-robin (A, B, C, A, B, C, ...) so that machine noise hits them all alike:

* ``cold_start``     ``conversation.call("run_python", {"code": "pass"})`` in a new conversation of a runtime with
                     a warm pool (as ``serve`` keeps one): the conversation takes a ready sandbox (folders, quota
                     volume, container and executor made ahead). Before each sample the pool is full (an untimed
                     wait); after it, the time until the pool is full again is kept (``pool refill``).
* ``cold_start_no_pool``  the same in a runtime without a pool: folders, quota volume, container start, executor
                     and the first run, all on the call's path. The self-check runs once per process; a warm-up
                     conversation made before measuring absorbs it, so it is NOT in these numbers.
* ``docker_run``     docker-py ``containers.run(image, ["python", "-c", "pass"], remove=True)``: baseline.
* ``warm_print``     ``conversation.call("run_python", {"code": "print(1)"})`` in a conversation whose sandbox
                     runs: the whole pipeline (records, spill check, the script file) and the resident executor.
* ``exec_print``     ``exec_create`` + ``exec_start`` of ``python -c 'print(1)'`` in that same container: baseline.
* ``warm_office``    ``run_python`` by path of a document script (openpyxl, 1,000 x 5 rows, saved).
* ``exec_office``    plain exec of ``python`` on the same script in the same container: baseline.

Then the scale cases (``scale_cases.py``, in the runtime without a pool): throughput of ``--threads`` threads over
as many conversations beside raw exec into the same containers, the memory of ``--idle`` idle conversations
beside as many bare containers of the image (and per sandbox waiting in the pool), the runtime's RSS after
``--conversations`` live conversations, and the host disk of a conversation's quota volume.

Every container carries ``io.sandbox-runtime.bench=<uuid>`` and is removed at the end, with the conversations
and the temporary state directory. Numbers are reported, never asserted.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import platform
import pstats
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import NotRequired, TypedDict

import docker
from scale_cases import idle_density, pool_memory, rss_and_volumes, throughput

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.sandbox.image import executor_image_tag
from sandbox_runtime.sandbox.profile import code_user, exec_environment
from sandbox_runtime.sandbox.run_protocol import PYTHON

BENCH_LABEL = "io.sandbox-runtime.bench"
OFFICE_SCRIPT = """\
import openpyxl
book = openpyxl.Workbook()
sheet = book.active
sheet.append(["id", "name", "amount", "region", "note"])
for i in range(1000):
    sheet.append([i, f"item {i}", i * 1.5, "north" if i % 2 else "south", "x" * 20])
book.save("/mnt/results/exports/bench-office.xlsx")
"""
OFFICE_PATH = "/mnt/results/scripts/bench_office.py"
COLD_CASES = ("cold_start", "cold_start_no_pool", "docker_run")
ORDER = ("cold_start", "cold_start_no_pool", "docker_run", "warm_print", "exec_print", "warm_office", "exec_office")
RATIOS = (
    ("warm_print", "exec_print"),
    ("warm_office", "exec_office"),
    ("cold_start", "docker_run"),
    ("cold_start_no_pool", "docker_run"),
)
READY_WITHIN_S = 120.0


class Report(TypedDict):
    """What one run reports, as printed by :func:`print_table` or as JSON."""

    machine: dict[str, object]
    repeat: int
    cold_repeat: int
    stats: dict[str, dict[str, float]]
    ratios: dict[str, float]
    scale: dict[str, float]
    profile_warm_print: NotRequired[str]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        name: {
            "n": len(v),
            "p50_ms": statistics.median(v) * 1e3,
            "p90_ms": percentile(v, 90) * 1e3,
            "p95_ms": percentile(v, 95) * 1e3,
            "min_ms": min(v) * 1e3,
        }
        for name, v in samples.items()
        if v
    }


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def machine_facts(client: docker.DockerClient, runtime: Runtime) -> dict[str, object]:
    version = client.api.version()
    info = client.api.info()
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "docker_version": version.get("Version"),
        "docker_api": version.get("ApiVersion"),
        "kernel": info.get("KernelVersion"),
        "cgroup": f"v{info.get('CgroupVersion')} {info.get('CgroupDriver')}",
        "container_runtime": runtime.policy.sandbox.runtime,
        "quota_mode": runtime.store.quota_mode,
        "host_python": platform.python_version(),
        "image": runtime.manager.image,
    }


class Bench:
    """The cases as zero-argument callables over a runtime with a warm pool, one without, one warm conversation
    and one docker client."""

    def __init__(self, runtime: Runtime, plain: Runtime, client: docker.DockerClient, label: str) -> None:
        self.runtime, self.plain, self.client, self.label = runtime, plain, client, label
        self.warm = runtime.conversation(f"bench-warm-{label[:8]}")
        self.container_id = self.warm.sandbox().container_id
        (self.warm.folders.results / "scripts" / "bench_office.py").write_text(OFFICE_SCRIPT)
        self.backend_part: list[float] = []  # RunPythonResult.duration_s (the run in the sandbox) of warm_print
        self.refill: list[float] = []  # after a pooled cold start: until the pool was full again

    def call(self, conversation: object, arguments: dict[str, object], what: str) -> dict[str, object]:
        outcome = conversation.call("run_python", arguments)  # type: ignore[attr-defined]
        details = outcome.details or {}
        if outcome.is_error or details.get("status") != "ok":
            raise RuntimeError(f"{what}: run_python ended {details.get('status')}: {outcome.text[:500]}")
        return dict(details)

    def cold_start(self, runtime: Runtime) -> float:
        pool = runtime.pool
        if pool is not None and not pool.wait_until_ready(timeout_s=READY_WITHIN_S):
            raise RuntimeError("the warm pool did not fill")
        conversation = runtime.conversation(f"bench-cold-{uuid.uuid4().hex[:12]}")
        start = time.perf_counter()
        self.call(conversation, {"code": "pass"}, "cold start")
        elapsed = time.perf_counter() - start
        if pool is not None:
            if not conversation.sandbox().pooled:
                raise RuntimeError("a cold start of the pooled runtime did not take from the pool")
            refilling = time.perf_counter()
            if not pool.wait_until_ready(timeout_s=READY_WITHIN_S):  # the next cases run with the pool at rest
                raise RuntimeError("the warm pool did not refill")
            self.refill.append(time.perf_counter() - refilling)
        conversation.delete()  # untimed; keeps the number of running containers steady
        return elapsed

    def docker_run(self) -> float:
        image = self.runtime.manager.image
        labels = {BENCH_LABEL: self.label}
        return timed(
            lambda: self.client.containers.run(
                image, ["python", "-c", "pass"], network_mode="none", remove=True, labels=labels
            )
        )

    def warm_run(self, arguments: dict[str, object]) -> float:
        start = time.perf_counter()
        details = self.call(self.warm, arguments, f"warm run of {arguments}")
        elapsed = time.perf_counter() - start
        if arguments.get("code") == "print(1)":
            self.backend_part.append(float(details.get("duration_s") or 0.0))  # type: ignore[arg-type]
        return elapsed

    def plain_exec(self, argv: list[str]) -> float:
        api, policy = self.client.api, self.runtime.policy
        start = time.perf_counter()
        exec_id = api.exec_create(
            self.container_id,
            [PYTHON, *argv],
            user=code_user(policy),
            environment=exec_environment(policy),
            workdir=policy.sandbox.results_mount_path,
        )["Id"]
        api.exec_start(exec_id)
        elapsed = time.perf_counter() - start
        exit_code = api.exec_inspect(exec_id).get("ExitCode")  # untimed sanity check
        if exit_code != 0:
            raise RuntimeError(f"plain exec of {argv!r} exited {exit_code}")
        return elapsed

    def cases(self) -> dict[str, Callable[[], float]]:
        return {
            "cold_start": lambda: self.cold_start(self.runtime),
            "cold_start_no_pool": lambda: self.cold_start(self.plain),
            "docker_run": self.docker_run,
            "warm_print": lambda: self.warm_run({"code": "print(1)"}),
            "exec_print": lambda: self.plain_exec(["-c", "print(1)"]),
            "warm_office": lambda: self.warm_run({"script_path": OFFICE_PATH}),
            "exec_office": lambda: self.plain_exec([OFFICE_PATH]),
        }

    def profile_warm(self, top: int = 12) -> str:
        profiler = cProfile.Profile()
        profiler.runcall(self.warm.call, "run_python", {"code": "print(1)"})
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
        return out.getvalue()


def run(repeat: int, cold_repeat: int, bench: Bench) -> dict[str, list[float]]:
    """Round-robin over the cases; the cold ones are spread evenly across the rounds."""
    cases = bench.cases()
    for fn in cases.values():  # one untimed warm-up each: page cache, first-use costs
        fn()
    bench.backend_part.clear()
    rounds = max(repeat, cold_repeat)
    samples: dict[str, list[float]] = {name: [] for name in ORDER}
    for i in range(rounds):
        for name in ORDER:
            n = cold_repeat if name in COLD_CASES else repeat
            if (i + 1) * n // rounds > i * n // rounds:
                samples[name].append(cases[name]())
    return samples


def print_table(report: Report) -> None:
    facts, stats, ratios = report["machine"], report["stats"], report["ratios"]
    print("machine: " + ", ".join(f"{k}={v}" for k, v in facts.items()))
    print(
        f"repeat={report['repeat']} cold_repeat={report['cold_repeat']} (interleaved round-robin; "
        "self-check excluded by a warm-up conversation; one untimed warm-up per case)"
    )
    print(f"\n{'case':<36}{'n':>4}{'p50 ms':>10}{'p90 ms':>10}{'p95 ms':>10}{'min ms':>10}")
    for name, s in stats.items():
        row = f"{name:<36}{s['n']:>4}{s['p50_ms']:>10.1f}{s['p90_ms']:>10.1f}{s['p95_ms']:>10.1f}{s['min_ms']:>10.1f}"
        print(row)
    print()
    for key, value in ratios.items():
        print(f"ratio {key:<44} {value:7.3f}x")
    print()
    for key, value in report["scale"].items():
        print(f"{key:<56} {value:10.2f}")


def measure(bench: Bench, opts: argparse.Namespace) -> Report:
    """Every case, side by side: the latency cases interleaved, then the scale cases (without a pool)."""
    runtime, plain, client = bench.runtime, bench.plain, bench.client
    samples = run(opts.repeat, opts.cold_repeat, bench)
    samples["warm_print: the run in the sandbox"] = bench.backend_part
    samples["pool refill after a cold start (to full)"] = bench.refill
    stats = summarize(samples)
    ratios = {f"{a} / {b} (p50)": stats[a]["p50_ms"] / stats[b]["p50_ms"] for a, b in RATIOS}
    for cold in ("cold_start", "cold_start_no_pool"):
        ratios[f"{cold} / docker_run (p95)"] = stats[cold]["p95_ms"] / stats["docker_run"]["p95_ms"]
    scale = pool_memory(runtime)
    rates, parallel = throughput(plain, client, opts.threads, opts.parallel_runs, blocks=3)
    scale[f"runs/s, {opts.threads} threads, ours"] = rates["ours"]
    scale[f"runs/s, {opts.threads} threads, raw exec"] = rates["raw"]
    ratios[f"throughput ours / raw exec ({opts.threads} threads)"] = rates["ours"] / rates["raw"]
    for conversation in parallel:
        conversation.delete()
    scale.update(idle_density(plain, client, opts.idle, {BENCH_LABEL: bench.label}, OFFICE_SCRIPT))
    scale.update(rss_and_volumes(plain, opts.conversations))
    report: Report = {
        "machine": machine_facts(client, runtime),
        "repeat": opts.repeat,
        "cold_repeat": opts.cold_repeat,
        "stats": stats,
        "ratios": ratios,
        "scale": scale,
    }
    if opts.profile:
        report["profile_warm_print"] = bench.profile_warm()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="warm repetitions per case (default 20)")
    parser.add_argument("--cold-repeat", type=int, default=5, help="cold repetitions per case (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--profile", action="store_true", help="also cProfile one warm run_python('print(1)')")
    parser.add_argument("--policy", default="default", help="the policy to run under (gvisor: runsc)")
    parser.add_argument("--threads", type=int, default=8, help="threads (and conversations) for throughput")
    parser.add_argument("--parallel-runs", type=int, default=25, help="runs per thread per throughput block")
    parser.add_argument("--conversations", type=int, default=50, help="live conversations for the RSS case")
    parser.add_argument("--idle", type=int, default=20, help="idle conversations (and bare containers) for memory")
    opts = parser.parse_args()

    label = uuid.uuid4().hex
    state_dir = tempfile.mkdtemp(prefix="sandbox-bench-")
    plain_dir = tempfile.mkdtemp(prefix="sandbox-bench-plain-")
    client = docker.from_env()
    runtimes = [
        Runtime(
            folder,
            opts.policy,
            image=executor_image_tag(),
            extra_labels={BENCH_LABEL: label},
            sweep_on_start=False,
            reap_interval_s=None,
            warm_pool=pooled,
        )
        for folder, pooled in ((state_dir, True), (plain_dir, False))
    ]
    try:
        for each in runtimes:
            warmup = each.conversation(f"bench-warmup-{label[:8]}")  # absorbs the once-per-process self-check
            warmup.run_python("pass")
            warmup.delete()
        bench = Bench(runtimes[0], runtimes[1], client, label)
        report = measure(bench, opts)
        if opts.json:
            print(json.dumps(report, indent=2))
        else:
            print_table(report)
            if opts.profile:
                print("\ncProfile of one warm run_python('print(1)'), top cumulative:")
                print(report["profile_warm_print"])
    finally:
        for each in runtimes:
            for record in each.state.conversations():  # every conversation this run made, even after an error
                each.conversation(record.id).delete()
            each.close()  # the pool's waiting sandboxes and their slots go with it
        for container in client.containers.list(all=True, filters={"label": f"{BENCH_LABEL}={label}"}):
            container.remove(force=True)
        client.close()
        shutil.rmtree(state_dir, ignore_errors=True)
        shutil.rmtree(plain_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
