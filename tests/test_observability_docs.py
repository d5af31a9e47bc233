"""The operator's observability files in ``docs/observability/`` hold what Prometheus and Grafana will take, and
name only metrics the runtime really exposes: the rules pass ``promtool check rules`` and their unit tests
(``promtool test rules``), every dashboard expression parses as PromQL (checked by promtool too), and every
``sandbox_runtime_*`` name in the rules and the dashboard is a series of :class:`RuntimeMetrics` (or one of the
gauges its owners add at a scrape), every ``sandbox_runtime:*`` name a recording rule of the rules file. No
Prometheus server or Grafana runs here; without promtool the promtool tests are skipped, or fail when ``CI`` is
set."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox_runtime.telemetry.metrics import RuntimeMetrics
from tests.prometheus_server import PROMETHEUS, debian_binary

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "observability"
RULES = DOCS / "prometheus-rules.yml"
RULE_TESTS = DOCS / "prometheus-rules.test.yml"
DASHBOARD = DOCS / "grafana-dashboard.json"
PROMTOOL = PROMETHEUS.with_name("promtool")  # Debian's prometheus package ships both
PROMTOOL_S = 120.0

# Read from their owners at each scrape (RuntimeMetrics.add_gauges), so absent from a bare RuntimeMetrics registry.
SCRAPE_TIME_GAUGES = frozenset(
    {
        "sandbox_runtime_sandboxes",
        "sandbox_runtime_pool_sandboxes",
        "sandbox_runtime_pool_target_sandboxes",
        "sandbox_runtime_admission_waiting_calls",
        "sandbox_runtime_admission_running_calls",
        "sandbox_runtime_upstream_up",
        "sandbox_runtime_tenant_results_bytes",
        "sandbox_runtime_tenant_results_quota_bytes",
        "sandbox_runtime_state_disk_free_bytes",
        "sandbox_runtime_info",
    }
)
# the backend's and the audit log's own counts, read at a scrape
SCRAPE_TIME_COUNTERS = frozenset({"sandbox_runtime_executor_restarts", "sandbox_runtime_audit_entries_lost"})

REQUIRED_RECORDS = frozenset(
    {
        "sandbox_runtime:calls:rate5m",
        "sandbox_runtime:call_errors:ratio_rate5m",
        "sandbox_runtime:call_duration_seconds:p95_5m",
        "sandbox_runtime:runs:rate5m",
        "sandbox_runtime:pool_hits:ratio_rate5m",
        "sandbox_runtime:sandbox_start_seconds:p95_5m",
        "sandbox_runtime:admission_wait_seconds:p95_5m",
        "sandbox_runtime:tenant_disk_usage:ratio",
    }
)
REQUIRED_ALERTS = frozenset(
    {
        "SandboxRuntimeDown",
        "InternalErrors",
        "HighToolErrorRatio",
        "RunTimeoutsSpike",
        "MemoryLimitKills",
        "WarmPoolEmpty",
        "SandboxStartSlow",
        "SandboxStartFailures",
        "ExecutorRestartsSpike",
        "AdmissionRefusals",
        "AdmissionQueueBacklog",
        "UpstreamDown",
        "UpstreamErrors",
        "TenantNearDiskQuota",
        "StateDiskLow",
        "AuthFailuresSpike",
        "SandboxSpansDropped",
    }
)
DASHBOARD_ROWS = (
    "Overview",
    "Runs",
    "Sandboxes & pool",
    "Tenants & admission",
    "Data path",
    "Approvals & security",
    "Upstreams",
    "Process",
)

RUNTIME_NAME = re.compile(r"\bsandbox_runtime_[a-zA-Z0-9_]+")
RECORDED_NAME = re.compile(r"\bsandbox_runtime:[a-zA-Z0-9_:]+")
SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{")  # a metric name right before its label matchers
OTHER_METRICS = re.compile(r"up|process_[a-z_]+|python_[a-z_]+")  # the scrape's own, prometheus_client's own
# Grafana's variables, as Grafana would put them in before it sends the query
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}


# ------------------------------------------------------------------------------------------------------ helpers
def promtool_binary() -> Path:
    """``/usr/bin/promtool`` (missing: skipped, or failed when ``CI`` is set)."""
    return debian_binary(PROMTOOL)


def promtool(*args: str, cwd: Path = DOCS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool_binary()), *args], cwd=cwd, capture_output=True, text=True, timeout=PROMTOOL_S, check=False
    )


def exposed_series() -> set[str]:
    """Every sample name the runtime exposes: its instruments' (a counter as ``<name>_total``, a histogram as
    ``<name>_bucket``, ``_sum`` and ``_count``) and the ones read at a scrape."""
    metrics = RuntimeMetrics(tools={"run_python"}, backend="docker")
    names: set[str] = set(SCRAPE_TIME_GAUGES) | {f"{name}_total" for name in SCRAPE_TIME_COUNTERS}
    for family in metrics.registry.collect():
        if family.type == "counter":  # the family's name is without _total
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def load_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def dashboard_exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expression) of every panel query (rows hold none: the dashboard keeps them expanded)."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in load_rules() if "record" in rule}


def unknown_names(exprs: list[str]) -> list[str]:
    """The ``sandbox_runtime_*`` names in ``exprs`` that are no exposed series (suffix and all)."""
    exposed = exposed_series()
    return sorted({name for expr in exprs for name in RUNTIME_NAME.findall(expr)} - exposed)


# -------------------------------------------------------------------------------------------- the rules file
@pytest.mark.process
def test_rules_pass_promtool_check() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


@pytest.mark.process
def test_rules_pass_their_unit_tests() -> None:
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_rule_unit_tests_cover_the_key_rules() -> None:
    document = yaml.safe_load(RULE_TESTS.read_text())
    exprs = [case["expr"] for test in document["tests"] for case in test.get("promql_expr_test", [])]
    alerts = {case["alertname"] for test in document["tests"] for case in test.get("alert_rule_test", [])}
    assert any("sandbox_runtime:call_errors:ratio_rate5m" in expr for expr in exprs)
    assert {"WarmPoolEmpty", "UpstreamDown", "TenantNearDiskQuota"} <= alerts
    silent = [
        case
        for test in document["tests"]
        for case in test.get("alert_rule_test", [])
        if case["alertname"] == "TenantNearDiskQuota" and not case.get("exp_alerts")
    ]
    assert silent, "no test shows TenantNearDiskQuota silent under its threshold"


def test_rules_name_only_exposed_metrics() -> None:
    exprs = [rule["expr"] for rule in load_rules()]
    assert unknown_names(exprs) == []
    recorded = recorded_names()
    used = {name for expr in exprs for name in RECORDED_NAME.findall(expr)}
    assert used - recorded == set(), "rules use recording rules that are not defined"


def test_rules_hold_the_recordings_and_alerts_on_call_needs() -> None:
    rules = load_rules()
    assert recorded_names() >= REQUIRED_RECORDS
    assert all(name.startswith("sandbox_runtime:") for name in recorded_names())
    alerts = [rule for rule in rules if "alert" in rule]
    assert {alert["alert"] for alert in alerts} >= REQUIRED_ALERTS
    for alert in alerts:
        name = alert["alert"]
        assert "for" in alert, name
        assert alert["labels"]["severity"] in {"page", "ticket"}, name
        assert {"summary", "description", "runbook"} <= set(alert["annotations"]), name
    for rule in rules:  # every raw selector keeps to the runtime's jobs
        for name in RUNTIME_NAME.findall(rule["expr"]):
            assert re.search(re.escape(name) + r'\{[^}]*job=~"sandbox-runtime\.\*"', rule["expr"]), (name, rule)


# ----------------------------------------------------------------------------------------------- the dashboard
def test_dashboard_names_only_exposed_metrics_and_defined_recordings() -> None:
    dashboard = load_dashboard()
    exprs = [expr for _, expr in dashboard_exprs(dashboard)]
    assert exprs
    assert unknown_names(exprs) == []
    used = {name for expr in exprs for name in RECORDED_NAME.findall(expr)}
    assert used - recorded_names() == set(), "the dashboard uses recording rules the rules file does not define"
    exposed = exposed_series() | recorded_names()
    for title, expr in dashboard_exprs(dashboard):
        for name in SELECTOR.findall(expr):
            assert name in exposed or OTHER_METRICS.fullmatch(name), (title, name)


@pytest.mark.process
def test_dashboard_exprs_are_valid_promql(tmp_path: Path) -> None:
    """Each expression, with Grafana's variables put in, as a recording rule promtool must parse."""
    rules = []
    for n, (title, expr) in enumerate(dashboard_exprs(load_dashboard())):
        query = expr
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        assert "$" not in query, (title, expr)
        rules.append({"record": f"dashboard:panel_{n}:expr", "expr": query})
    check = tmp_path / "dashboard-exprs.yml"
    check.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool("check", "rules", str(check), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_dashboard_is_importable() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] == 39
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    instance = variables["instance"]
    assert instance["multi"] is True
    assert instance["includeAll"] is True
    assert "label_values(sandbox_runtime_info, instance)" in json.dumps(instance["query"])
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    taken: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["w"] > 0
        assert grid["h"] > 0
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"], panel["title"]
    rows = [panel["title"] for panel in sorted(panels, key=lambda p: p["gridPos"]["y"]) if panel["type"] == "row"]
    assert tuple(rows) == DASHBOARD_ROWS


def test_scrape_time_names_are_the_runtimes() -> None:
    """The explicit names above are ones the package itself adds at a scrape (``gauge("…")``/``counter("…")``)."""
    sources = "\n".join(path.read_text() for path in (ROOT / "sandbox_runtime").rglob("*.py"))
    for name in SCRAPE_TIME_GAUGES | SCRAPE_TIME_COUNTERS:
        short = name.removeprefix("sandbox_runtime_")
        assert re.search(r'\b(gauge|counter)\(\s*"' + re.escape(short) + '"', sources), name
