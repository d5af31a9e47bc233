"""The runtime's Prometheus metrics: one :class:`RuntimeMetrics` per runtime, in a registry of its own.

``serve --http`` answers ``/metrics`` with it; a host that embeds the Python API registers the runtime's collector
in its own registry (``prometheus_client.REGISTRY.register(runtime.metrics)``). Counters and histograms are updated
where things happen; gauges of state (sandboxes, the pool, the admission queue, tenants' disk, upstreams) are read
from their owners when a scrape asks (:meth:`RuntimeMetrics.add_gauges`).

Cardinality is bounded by construction: no label names a conversation, a call or an argument. ``tool`` is one of
the runtime's tools (built-in, registered, or an upstream's, all set by configuration; any other name counts as
``unknown``), ``upstream`` one of the configured upstreams, ``tenant`` at most
``telemetry.metrics_tenant_series_max`` tenants (the rest summed as ``_other``), and every other label a fixed set
of values listed in ``docs/observability.md``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "CALL_SECONDS_BUCKETS",
    "OTHER_TENANTS",
    "START_SECONDS_BUCKETS",
    "UNKNOWN_TOOL",
    "GaugeSource",
    "Metric",
    "RuntimeMetrics",
    "counter",
    "gauge",
    "package_version",
    "top_series",
]

logger = logging.getLogger(__name__)

CALL_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
START_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
UNKNOWN_TOOL = "unknown"  # a call naming no tool of the runtime: its name is not a label value
OTHER_TENANTS = "_other"  # the tenants past telemetry.metrics_tenant_series_max, summed (no tenant is named so)
_PREFIX = "sandbox_runtime_"

GaugeSource = Callable[[], Iterable[Metric]]  # read at each scrape


def package_version() -> str:
    """This package's version, as installed ("unknown" when it runs from a tree that was never installed)."""
    try:
        return importlib.metadata.version("sandbox-runtime")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def gauge(
    name: str, documentation: str, samples: float | Iterable[tuple[Sequence[str], float]], labels: Sequence[str] = ()
) -> GaugeMetricFamily:
    """A gauge read at a scrape: one value, or ``(label values, value)`` pairs for ``labels``."""
    family = GaugeMetricFamily(_PREFIX + name, documentation, labels=list(labels) if labels else None)
    if isinstance(samples, int | float):
        family.add_metric([], samples)
    else:
        for values, value in samples:
            family.add_metric(list(values), value)
    return family


def counter(
    name: str, documentation: str, samples: Iterable[tuple[Sequence[str], float]], labels: Sequence[str]
) -> CounterMetricFamily:
    """A counter its owner keeps, read at a scrape (exposed as ``<name>_total``)."""
    family = CounterMetricFamily(_PREFIX + name, documentation, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def top_series(values: Mapping[str, float], limit: int) -> dict[str, float]:
    """The ``limit`` largest of ``values`` by name, and the rest summed under :data:`OTHER_TENANTS` (when any)."""
    ranked = sorted(values.items(), key=lambda item: (-item[1], item[0]))
    kept = dict(ranked[:limit])
    if len(ranked) > limit:
        kept[OTHER_TENANTS] = sum(value for _, value in ranked[limit:])
    return kept


class _Gauges(Collector):
    """The gauges read from their owners at each scrape; a source that fails is logged and skipped (the scrape
    still answers with everything else)."""

    def __init__(self) -> None:
        self._sources: list[tuple[str, GaugeSource]] = []
        self._guard = threading.Lock()

    def add(self, name: str, source: GaugeSource) -> None:
        with self._guard:
            self._sources = [(n, s) for n, s in self._sources if n != name] + [(name, source)]

    def remove(self, name: str) -> None:
        with self._guard:
            self._sources = [(n, s) for n, s in self._sources if n != name]

    def collect(self) -> Iterator[Metric]:
        with self._guard:
            sources = list(self._sources)
        for name, source in sources:
            try:
                metrics = list(source())
            except Exception:  # a scrape must not fail because one owner could not answer
                logger.warning("the %s gauges could not be read for a scrape", name, exc_info=True)
                continue
            yield from metrics


class RuntimeMetrics(Collector):
    """Every metric of one runtime (see the module text, and ``docs/observability.md`` for the list)."""

    def __init__(self, *, tools: Collection[str] = (), backend: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.backend = backend
        self._tools = tools  # the runtime's own mapping: tools it registers later are known too
        r = self.registry
        self.calls = Counter(
            _PREFIX + "calls", "Tool calls that ran, by tool and how they ended.", ["tool", "status"], registry=r
        )
        self.call_seconds = Histogram(
            _PREFIX + "call_duration_seconds",
            "A call's own time (approval and tool; its wait for a run slot excluded).",
            ["tool"],
            buckets=CALL_SECONDS_BUCKETS,
            registry=r,
        )
        self.calls_in_flight = Gauge(_PREFIX + "calls_in_flight", "Tool calls running now.", registry=r)
        self.runs = Counter(_PREFIX + "runs", "run_python runs, by how they ended.", ["status"], registry=r)
        self.run_seconds = Histogram(
            _PREFIX + "run_duration_seconds",
            "A run_python run in its sandbox.",
            ["backend"],
            buckets=CALL_SECONDS_BUCKETS,
            registry=r,
        )
        self.sandbox_start_seconds = Histogram(
            _PREFIX + "sandbox_start_seconds",
            "Starting a hardened sandbox, for a conversation's call or ahead of need for the warm pool.",
            ["backend", "purpose"],
            buckets=START_SECONDS_BUCKETS,
            registry=r,
        )
        self.sandbox_start_failures = Counter(
            _PREFIX + "sandbox_start_failures", "Sandbox starts that failed.", ["backend"], registry=r
        )
        self.pool_takes = Counter(
            _PREFIX + "pool_takes",
            "New conversations that found a warm sandbox waiting (hit) or none (miss).",
            ["result"],
            registry=r,
        )
        self.spills = Counter(
            _PREFIX + "spills", "Results (or errors) written to a file instead of shown whole.", ["kind"], registry=r
        )
        self.spilled_bytes = Counter(_PREFIX + "spilled_bytes", "Bytes of those files.", ["kind"], registry=r)
        self.budget_replacements = Counter(
            _PREFIX + "budget_replacements", "Results the per-turn budget replaced by their stand-ins.", registry=r
        )
        self.exports = Counter(_PREFIX + "exports", "Tables exported to a file, by format.", ["format"], registry=r)
        self.exported_rows = Counter(_PREFIX + "exported_rows", "Rows of those tables.", ["format"], registry=r)
        self.approvals = Counter(
            _PREFIX + "approvals",
            "Calls a person approved (allowed), turned down (denied), or a rule refused without asking (refused).",
            ["decision"],
            registry=r,
        )
        self.admission_wait_seconds = Histogram(
            _PREFIX + "admission_wait_seconds",
            "How long a call waited for a run slot of its tenant.",
            buckets=CALL_SECONDS_BUCKETS,
            registry=r,
        )
        self.admission_refused = Counter(
            _PREFIX + "admission_refused", "Calls refused after waiting the longest for a run slot.", registry=r
        )
        self.upstream_call_errors = Counter(
            _PREFIX + "upstream_call_errors",
            "Calls an upstream MCP server failed or did not answer.",
            ["upstream"],
            registry=r,
        )
        self.retention_removed_files = Counter(
            _PREFIX + "retention_removed_files",
            "Spill, error and argument files removed when they expired.",
            registry=r,
        )
        self.retention_removed_bytes = Counter(_PREFIX + "retention_removed_bytes", "Bytes of those files.", registry=r)
        self.auth_failures = Counter(
            _PREFIX + "auth_failures", "Requests serve --http refused (401, 403).", ["status_code"], registry=r
        )
        self.sandbox_spans_dropped = Counter(
            _PREFIX + "sandbox_spans_dropped", "Spans and events from inside sandboxes past a run's limits.", registry=r
        )
        self._instruments = [m for m in vars(self).values() if isinstance(m, Counter | Gauge | Histogram)]
        self._gauges = _Gauges()
        r.register(self._gauges)

    def tool(self, name: str) -> str:
        """``name`` as a label value: one of the runtime's tools, else ``unknown``."""
        return name if name in self._tools else UNKNOWN_TOOL

    def add_gauges(self, name: str, source: GaugeSource) -> None:
        """Read ``source`` at each scrape (one per ``name``: adding it again replaces it)."""
        self._gauges.add(name, source)

    def remove_gauges(self, name: str) -> None:
        self._gauges.remove(name)

    def collect(self) -> Iterator[Metric]:
        """Every metric, as a Prometheus collector gives them."""
        yield from self.registry.collect()

    def describe(self) -> Iterator[Metric]:
        """The names of its counters and histograms, without reading any owner: a registry that holds two
        runtimes' collectors refuses the second (their series would collide)."""
        for instrument in self._instruments:
            yield from instrument.describe()
