"""Latency of the runtime beside plain Docker, measured side by side in one run.

Run from the repository root::

    .venv/bin/python bench/bench_latency.py [--repeat 20] [--cold-repeat 5] [--json] [--profile]

The cases are interleaved round-robin (A, B, C, A, B, C, ...) so that machine noise hits them all alike:

* ``cold_start``     ``runtime.conversation(<new id>).run_python("pass")``: folders, quota volume, container
                     start and the first run. The self-check runs once per process; a warm-up conversation
                     made before measuring absorbs it, so it is NOT in these numbers.
* ``docker_run``     docker-py ``containers.run(image, ["python", "-c", "pass"], remove=True)``: baseline.
* ``warm_pass``      ``run_python("pass")`` in a conversation whose sandbox is running.
* ``exec_pass``      ``exec_create`` + ``exec_start`` of ``python -c pass`` in that same container: baseline.
* ``warm_import``    ``run_python`` of ``import openpyxl, docx, pptx``.
* ``exec_import``    plain exec of the same import in the same container: baseline.

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

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.sandbox.image import executor_image_tag
from sandbox_runtime.sandbox.profile import PYTHON, code_user, exec_environment

BENCH_LABEL = "io.sandbox-runtime.bench"
IMPORT_CODE = "import openpyxl, docx, pptx"
COLD_CASES = ("cold_start", "docker_run")
ORDER = ("cold_start", "docker_run", "warm_pass", "exec_pass", "warm_import", "exec_import")
RATIOS = (("warm_pass", "exec_pass"), ("warm_import", "exec_import"), ("cold_start", "docker_run"))


class Report(TypedDict):
    """What one run reports, as printed by :func:`print_table` or as JSON."""

    machine: dict[str, object]
    repeat: int
    cold_repeat: int
    stats: dict[str, dict[str, float]]
    ratios: dict[str, float]
    profile_warm_pass: NotRequired[str]


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
    """The cases as zero-argument callables over one runtime, one warm conversation and one docker client."""

    def __init__(self, runtime: Runtime, client: docker.DockerClient, label: str) -> None:
        self.runtime, self.client, self.label = runtime, client, label
        self.warm = runtime.conversation(f"bench-warm-{label[:8]}")
        self.container_id = self.warm.sandbox().container_id
        self.exec_part: list[float] = []  # ExecResult.duration_s (backend.exec alone) of each warm_pass

    def check(self, result: object, what: str) -> None:
        status = getattr(result, "status", None)
        if status != "ok":
            raise RuntimeError(f"{what}: run_python ended {status}: {getattr(result, 'message', result)}")

    def cold_start(self) -> float:
        conversation = self.runtime.conversation(f"bench-cold-{uuid.uuid4().hex[:12]}")
        start = time.perf_counter()
        result = conversation.run_python("pass")
        elapsed = time.perf_counter() - start
        self.check(result, "cold start")
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

    def warm_run(self, code: str) -> float:
        start = time.perf_counter()
        result = self.warm.run_python(code)
        elapsed = time.perf_counter() - start
        self.check(result, f"warm run of {code!r}")
        if code == "pass":
            self.exec_part.append(result.duration_s)
        return elapsed

    def plain_exec(self, code: str) -> float:
        api, policy = self.client.api, self.runtime.policy
        start = time.perf_counter()
        exec_id = api.exec_create(
            self.container_id,
            [PYTHON, "-c", code],
            user=code_user(policy),
            environment=exec_environment(policy),
        )["Id"]
        api.exec_start(exec_id)
        elapsed = time.perf_counter() - start
        exit_code = api.exec_inspect(exec_id).get("ExitCode")  # untimed sanity check
        if exit_code != 0:
            raise RuntimeError(f"plain exec of {code!r} exited {exit_code}")
        return elapsed

    def cases(self) -> dict[str, Callable[[], float]]:
        return {
            "cold_start": self.cold_start,
            "docker_run": self.docker_run,
            "warm_pass": lambda: self.warm_run("pass"),
            "exec_pass": lambda: self.plain_exec("pass"),
            "warm_import": lambda: self.warm_run(IMPORT_CODE),
            "exec_import": lambda: self.plain_exec(IMPORT_CODE),
        }

    def profile_warm(self, top: int = 12) -> str:
        profiler = cProfile.Profile()
        profiler.runcall(self.warm.run_python, "pass")
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
        return out.getvalue()


def run(repeat: int, cold_repeat: int, bench: Bench) -> dict[str, list[float]]:
    """Round-robin over the cases; the cold ones are spread evenly across the rounds."""
    cases = bench.cases()
    for fn in cases.values():  # one untimed warm-up each: page cache, first-use costs
        fn()
    bench.exec_part.clear()
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
    print(f"\n{'case':<30}{'n':>4}{'p50 ms':>10}{'p90 ms':>10}{'min ms':>10}")
    for name, s in stats.items():
        print(f"{name:<30}{s['n']:>4}{s['p50_ms']:>10.1f}{s['p90_ms']:>10.1f}{s['min_ms']:>10.1f}")
    print()
    for key, value in ratios.items():
        print(f"ratio {key:<34} {value:6.2f}x  (p50 / p50)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="warm repetitions per case (default 20)")
    parser.add_argument("--cold-repeat", type=int, default=5, help="cold repetitions per case (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--profile", action="store_true", help="also cProfile one warm run_python('pass')")
    opts = parser.parse_args()

    label = uuid.uuid4().hex
    state_dir = tempfile.mkdtemp(prefix="sandbox-bench-")
    client = docker.from_env()
    runtime = Runtime(
        state_dir,
        image=executor_image_tag(),
        extra_labels={BENCH_LABEL: label},
        sweep_on_start=False,
        reap_interval_s=None,
    )
    try:
        warmup = runtime.conversation(f"bench-warmup-{label[:8]}")  # absorbs the once-per-process self-check
        warmup.run_python("pass")
        warmup.delete()
        bench = Bench(runtime, client, label)
        samples = run(opts.repeat, opts.cold_repeat, bench)
        samples["warm_pass: backend.exec part"] = bench.exec_part
        stats = summarize(samples)
        ratios = {f"{a} / {b}": stats[a]["p50_ms"] / stats[b]["p50_ms"] for a, b in RATIOS}
        report: Report = {
            "machine": machine_facts(client, runtime),
            "repeat": opts.repeat,
            "cold_repeat": opts.cold_repeat,
            "stats": stats,
            "ratios": ratios,
        }
        if opts.profile:
            report["profile_warm_pass"] = bench.profile_warm()
        if opts.json:
            print(json.dumps(report, indent=2))
        else:
            print_table(report)
            if opts.profile:
                print("\ncProfile of one warm run_python('pass'), top cumulative:")
                print(report["profile_warm_pass"])
    finally:
        for record in runtime.state.conversations():  # every conversation this run made, even after an error
            runtime.conversation(record.id).delete()
        for container in client.containers.list(all=True, filters={"label": f"{BENCH_LABEL}={label}"}):
            container.remove(force=True)
        runtime.close()
        client.close()
        shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
