"""What the benchmarks share: interleaved timing, percentiles, and the aligned result lines."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["Met", "bench_run", "interleaved", "line", "pair", "percentile", "print_targets"]

Met = list[tuple[str, str, str, bool]]  # (what, target, measured, met?) for the closing "targets" block


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def interleaved(cases: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """One untimed warm-up each, then ``repeat`` rounds over the cases; the order flips every round."""
    for fn in cases.values():
        fn()
    gc.collect()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for i in range(repeat):
        for name in names if i % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            cases[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


def line(label: str, values: list[float], scale: float, unit: str, ratio: float | None = None) -> None:
    """One aligned table line: n, p50, p90 (``-`` for a single sample) and, for a case, its p50 ratio."""
    p90 = f"{percentile(values, 90) * scale:.3f}" if len(values) > 1 else "-"
    shown = f"{ratio:.2f}x" if ratio is not None else ""
    p50 = statistics.median(values) * scale
    print(f"  {label:<56}{len(values):>6}{p50:>10.3f} {unit:<2}{p90:>10} {unit:<2}{shown:>8}")


def pair(
    title: str, case: tuple[str, list[float]], base: tuple[str, list[float]], scale: float, unit: str
) -> tuple[float, float]:
    """The case and its baseline, the ratio of their p50s on the case's line; returns (case p50 in ``unit``,
    ratio)."""
    print(f"\n{title}")
    ratio = statistics.median(case[1]) / statistics.median(base[1])
    line(*case, scale, unit, ratio)
    line(*base, scale, unit)
    return statistics.median(case[1]) * scale, ratio


@contextlib.contextmanager
def bench_run(prefix: str, parent: str) -> Iterator[Path]:
    """A fresh work folder for one run: the machine and column headers printed first, the wall time last, and
    every file removed at the end."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    started = time.monotonic()
    try:
        print(f"machine: nproc={len(os.sched_getaffinity(0))}, python={platform.python_version()}, dir={work}")
        print("cases and baselines interleaved per repetition (order flips each round); one untimed warm-up each")
        print(f"\n  {'case':<56}{'n':>6}{'p50':>13}{'p90':>13}{'ratio':>8}")
        yield work
        print(f"\nwall time {time.monotonic() - started:.0f} s (all temporary files are removed now)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def print_targets(met: Met) -> None:
    """The closing block: each target, what was measured, and met or not."""
    what_width = max((len(m[0]) for m in met), default=0) + 2
    target_width = max((len(m[1]) for m in met), default=0) + 2
    print("\ntargets")
    for what, target, value, ok in met:
        print(f"  {what:<{what_width}}{target:<{target_width}}{value:>10}  {'met' if ok else 'NOT MET'}")
