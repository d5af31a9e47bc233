"""A warm ``run_python`` call in two checkouts of this repository, side by side in one run: did a change make the
hot path slower?

Run from the repository root, naming another checkout (e.g. ``git worktree add ../before <commit>``)::

    .venv/bin/python bench/bench_checkouts.py --before ../before [--repeat 200] [--code 'print(1)'] [--json]

Each checkout gets a worker process of its own (this interpreter, the checkout first on ``sys.path``), with a
runtime, one conversation and its sandbox started and warmed up. The parent then asks the two workers for one
call each in turn (before, after, before, after, ...; the first of each pair alternates), so machine noise hits
both alike; each worker times its own ``conversation.call("run_python", {"code": ...})`` with
``time.perf_counter``. It prints p50 and p90 per checkout and the ratio of the p50s (after / before; ``--json``
adds the min). Numbers are reported, never asserted. Every container carries ``io.sandbox-runtime.bench=<uuid>``
and is removed at the end with the conversations and the temporary state directories.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from benchkit import pair, percentile

BENCH_LABEL = "io.sandbox-runtime.bench"
WARM_UP_CALLS = 10
REPLY_TIMEOUT_S = 300.0

# the worker: reads one line per call ("call" or "quit"), answers each with the seconds it took (or "bye")
WORKER = """
import sys, time
from pathlib import Path
import sandbox_runtime
from sandbox_runtime.api.runtime import Runtime

state_dir, label, code = sys.argv[1], sys.argv[2], sys.argv[3]
print(Path(sandbox_runtime.__file__).resolve().parent.parent, flush=True)
runtime = Runtime(Path(state_dir), extra_labels={"io.sandbox-runtime.bench": label})
conversation = runtime.conversation("bench")
try:
    for line in sys.stdin:
        if line.strip() != "call":
            break
        started = time.perf_counter()
        outcome = conversation.call("run_python", {"code": code})
        took = time.perf_counter() - started
        if outcome.is_error:
            raise SystemExit("the benchmark's call failed: " + outcome.text)
        print(took, flush=True)
finally:
    conversation.delete()
    runtime.close()
print("bye", flush=True)
"""


class Worker:
    """One checkout's worker process."""

    def __init__(self, name: str, checkout: Path, state_dir: Path, label: str, code: str) -> None:
        self.name = name
        environment = {**os.environ, "PYTHONPATH": str(checkout)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(state_dir), label, code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=environment,
            cwd=checkout,
        )
        imported = Path(self._line())
        if imported != checkout.resolve():
            raise SystemExit(f"the {name} worker imported sandbox_runtime from {imported}, not from {checkout}")
        self.samples: list[float] = []

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.name} worker ended early (exit code {self.process.wait(REPLY_TIMEOUT_S)})")
        return line.strip()

    def call(self, keep: bool) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("call\n")
        self.process.stdin.flush()
        took = float(self._line())
        if keep:
            self.samples.append(took)

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
        self.process.wait(REPLY_TIMEOUT_S)


def _figures(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": statistics.median(samples) * 1000,
        "p90_ms": percentile(samples, 90) * 1000,
        "min_ms": min(samples) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (the 'before' side)")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parent.parent, help="default: this one")
    parser.add_argument("--repeat", type=int, default=200, help="timed calls per checkout (default 200)")
    parser.add_argument("--code", default="print(1)", help="the code each call runs (default: print(1))")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    opts = parser.parse_args()
    label = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="sbrt-bench-", dir="/var/tmp") as scratch:
        workers = [
            Worker("before", opts.before, Path(scratch, "before"), label, opts.code),
            Worker("after", opts.after, Path(scratch, "after"), label, opts.code),
        ]
        try:
            for number in range(WARM_UP_CALLS + opts.repeat):
                order = workers if number % 2 == 0 else workers[::-1]
                for worker in order:
                    worker.call(keep=number >= WARM_UP_CALLS)
        finally:
            for worker in workers:
                worker.stop()
    before, after = (_figures(worker.samples) for worker in workers)
    report = {
        "code": opts.code,
        "repeat": opts.repeat,
        "before": {"checkout": str(opts.before), **before},
        "after": {"checkout": str(opts.after), **after},
        "p50_ratio": after["p50_ms"] / before["p50_ms"],
    }
    if opts.json:
        print(json.dumps(report, indent=2))
        return
    print(f"before: {opts.before}\nafter:  {opts.after}")
    print(f"\n  {'case':<56}{'n':>6}{'p50':>13}{'p90':>13}{'ratio':>8}")
    title = f"run_python({opts.code!r}) on a warm sandbox, interleaved; ratio: after / before"
    pair(title, ("after", workers[1].samples), ("before", workers[0].samples), 1000, "ms")


if __name__ == "__main__":
    main()
