"""What metrics and tracing cost a warm call: the same warm ``print(1)`` with telemetry on (spans exported by OTLP/HTTP,
metrics scraped every second) and off (no tracer provider: every span a non-recording one), side by side.

Run from the repository root (Docker running: ``scripts/setup.sh``)::

    .venv/bin/python bench/bench_telemetry.py [--repeat 300]
    .venv/bin/python bench/bench_telemetry.py --quick     # a smoke run

OpenTelemetry's tracer provider is set once per process, so each side is a process of its own: two workers, each
with its runtime (default policy, real Docker) and one warm conversation, driven by this process one call at a time,
the order flipping every round, each call timed in its worker (``conversation.call("run_python", {"code":
"print(1)"})``: the whole pipeline). The "on" worker exports every span (the call's, the admission wait, the run)
through the SDK's batch processor to an OTLP/HTTP receiver this process runs on loopback, and a thread of it
renders ``/metrics`` every second as a scrape would. Target: the p50s at most 5 % apart. Sandboxes carry
``io.sandbox-runtime.bench=<run id>``; the conversations are deleted at the end. Numbers are reported, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from benchkit import Met, line, print_targets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for tests/
from tests.otlp_receiver import OtlpReceiver

SHARE_TARGET = 1.05  # telemetry on may cost at most 5 % of a warm call
SCRAPE_EVERY_S = 1.0


def worker(side: str, state_dir: str, label: str) -> None:
    """One side: read a line per call asked for, answer each with the call's seconds."""
    from prometheus_client import generate_latest  # noqa: PLC0415  (the worker's own imports)

    from sandbox_runtime import Runtime  # noqa: PLC0415  (idem)
    from sandbox_runtime.mcp.metrics_http import exposition_registry  # noqa: PLC0415  (idem)
    from sandbox_runtime.telemetry.export import export_traces_from_environment  # noqa: PLC0415  (idem)

    exported = export_traces_from_environment() if side == "on" else None
    runtime = Runtime(state_dir, "default", extra_labels={"io.sandbox-runtime.bench": label})
    conversation = runtime.conversation(f"warm-{side}")
    stop = threading.Event()
    if side == "on":
        registry = exposition_registry(runtime.metrics)

        def scrape() -> None:
            while not stop.wait(SCRAPE_EVERY_S):
                generate_latest(registry)

        threading.Thread(target=scrape, daemon=True).start()
    try:
        for _ in range(3):
            conversation.call("run_python", {"code": "print(1)"})
        print("ready", flush=True)
        for _request in sys.stdin:
            started = time.perf_counter()
            outcome = conversation.call("run_python", {"code": "print(1)"})
            took = time.perf_counter() - started
            assert not outcome.is_error, outcome.text
            print(json.dumps(took), flush=True)
    finally:
        stop.set()
        conversation.delete()
        runtime.close()
        if exported is not None:
            exported.shutdown()


class _Side:
    def __init__(self, side: str, work: Path, label: str, env: dict[str, str]) -> None:
        command = [sys.executable, __file__, "--worker", side, "--state", str(work / side), "--label", label]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.process.stdout is not None
        assert self.process.stdin is not None
        self._out, self._in = self.process.stdout, self.process.stdin
        ready = self._out.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"the {side} worker did not start (it said {ready!r})")

    def call(self) -> float:
        self._in.write("call\n")
        self._in.flush()
        return float(json.loads(self._out.readline()))

    def close(self) -> None:
        self._in.close()
        self.process.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--repeat", type=int, default=300, help="calls on each side (default 300)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 30 calls each")
    parser.add_argument("--worker", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--label", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        worker(opts.worker, opts.state, opts.label)
        return
    repeat = 30 if opts.quick else opts.repeat
    label = uuid.uuid4().hex[:12]
    print(f"run id {label}; {repeat} warm calls on each side, one at a time, the order flipping every round")
    with (
        tempfile.TemporaryDirectory(prefix="sbrt-bench-telemetry-", dir="/var/tmp", ignore_cleanup_errors=True) as work,
        OtlpReceiver() as receiver,
    ):
        plain = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
        traced = {**plain, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "bench"}
        sides = {"off": _Side("off", Path(work), label, plain), "on": _Side("on", Path(work), label, traced)}
        samples: dict[str, list[float]] = {"off": [], "on": []}
        try:
            for i in range(repeat):
                for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
                    samples[name].append(sides[name].call())
        finally:
            for side in sides.values():
                side.close()
        exported = len(receiver.spans)
    ratio = statistics.median(samples["on"]) / statistics.median(samples["off"])
    mean_ratio = statistics.fmean(samples["on"]) / statistics.fmean(samples["off"])
    print(f"\n  {'case':<56}{'n':>6}{'p50':>13}{'p90':>13}{'ratio':>8}")
    line("warm print(1), telemetry on (OTLP export, scraped 1/s)", samples["on"], 1000, "ms", ratio)
    line("warm print(1), telemetry off (no tracer provider)", samples["off"], 1000, "ms")
    print(
        f"  mean ratio {mean_ratio:.3f}x; spans the receiver got: {exported} ({exported / (repeat + 3):.1f} per call)"
    )
    met: Met = [("p50 on / off", f"<= {SHARE_TARGET:.2f}x", f"{ratio:.3f}x", ratio <= SHARE_TARGET)]
    print_targets(met)


if __name__ == "__main__":
    main()
