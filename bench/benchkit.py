"""What the benchmarks share: interleaved timing, percentiles, and the aligned result lines."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable

__all__ = ["Met", "interleaved", "line", "pair", "percentile"]

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
