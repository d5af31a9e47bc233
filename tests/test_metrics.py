"""A host that embeds the Python API registers ``runtime.metrics`` in its own Prometheus registry and reads what its
calls did: by tool and status, how runs ended, spills, exports, approvals, admission, its sandboxes and pool, its
tenants' disk; with a bounded number of series whatever the calls name, and a scrape that survives an owner that
cannot answer. (The runs are the fake backend's; Prometheus itself scrapes ``serve`` in test_observability_serve.)
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from sandbox_runtime.errors import AdmissionRefused
from sandbox_runtime.models import HostResult, ToolCall
from sandbox_runtime.policy import load_policy
from sandbox_runtime.telemetry.metrics import OTHER_TENANTS, RuntimeMetrics, top_series
from tests.conftest import RuntimeFactory


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def _hosted(runtime_metrics: Collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(runtime_metrics)
    return registry


def test_a_hosts_registry_reads_calls_runs_spills_and_exports(fake_runtime_factory: RuntimeFactory) -> None:
    runtime = fake_runtime_factory()
    registry = _hosted(runtime.metrics)
    conversation = runtime.conversation("counted")
    conversation.call("run_python", {"code": "print(1)"})
    conversation.call("run_python", {"code": "raise SystemExit(3)"})
    conversation.call("run_python", {"code": "import time; time.sleep(30)", "timeout_s": 1})
    conversation.call("run_python", {"code": "print('x' * 5000)"})  # spilled
    conversation.call("no_such_tool", {"any": "thing"})
    conversation.call("read_file", {"path": "missing.txt"})  # its error saved to a file
    table = "import json\nrows = [{'n': i} for i in range(7)]\nopen('t.json', 'w').write(json.dumps(rows))\n"
    conversation.call("run_python", {"code": table})
    exported = conversation.call("export_table", {"source": "t.json", "format": "csv"})
    assert not exported.is_error, exported.text

    calls = "sandbox_runtime_calls_total"
    assert _value(registry, calls, tool="run_python", status="ok") == 3
    assert _value(registry, calls, tool="run_python", status="tool_error") == 2
    assert _value(registry, calls, tool="unknown", status="invalid_arguments") == 1  # not a label of its own
    assert _value(registry, calls, tool="read_file", status="tool_error") == 1
    assert _value(registry, "sandbox_runtime_call_duration_seconds_count", tool="run_python") == 5
    for status, count in (("ok", 3), ("error", 1), ("timeout", 1)):
        assert _value(registry, "sandbox_runtime_runs_total", status=status) == count
    assert _value(registry, "sandbox_runtime_run_duration_seconds_count", backend="fake") == 5
    assert _value(registry, "sandbox_runtime_run_duration_seconds_bucket", backend="fake", le="0.5") >= 3
    assert _value(registry, "sandbox_runtime_spills_total", kind="result") == 1
    assert _value(registry, "sandbox_runtime_spilled_bytes_total", kind="result") == 5001
    assert _value(registry, "sandbox_runtime_spills_total", kind="error") >= 2  # the unknown tool's, the read's
    assert _value(registry, "sandbox_runtime_exports_total", format="csv") == 1
    assert _value(registry, "sandbox_runtime_exported_rows_total", format="csv") == 7
    assert _value(registry, "sandbox_runtime_sandbox_start_seconds_count", backend="fake", purpose="conversation") == 1
    assert _value(registry, "sandbox_runtime_sandboxes", backend="fake", runtime="runc") == 1
    assert _value(registry, "sandbox_runtime_calls_in_flight") == 0
    assert _value(registry, "sandbox_runtime_info", version=_version(registry), backend="fake", state_store="sqlite")

    text = generate_latest(registry).decode()
    assert "no_such_tool" not in text
    assert "counted" not in text


def _version(registry: CollectorRegistry) -> str:
    for family in registry.collect():
        if family.name == "sandbox_runtime_info":
            return str(family.samples[0].labels["version"])
    raise AssertionError("no sandbox_runtime_info")


def test_approvals_are_counted_by_decision(fake_runtime_factory: RuntimeFactory) -> None:
    rules = {"approval": {"tool_rules": {"write_file": "ask", "edit_file": "deny"}}}
    answers = iter([True, False])
    runtime = fake_runtime_factory(load_policy("default").changed(rules, "test"), approver=lambda _r: next(answers))
    conversation = runtime.conversation("judged")
    conversation.call("write_file", {"path": "a.txt", "content": "x"})
    conversation.call("write_file", {"path": "b.txt", "content": "y"})
    conversation.call("edit_file", {"path": "a.txt", "old": "x", "new": "z"})
    conversation.call("read_file", {"path": "a.txt"})  # allowed by rule: nobody asked, not counted
    registry = runtime.metrics.registry
    for decision in ("allowed", "denied", "refused"):
        assert _value(registry, "sandbox_runtime_approvals_total", decision=decision) == 1


def test_the_turn_budget_and_a_hosts_own_result_count_as_spills(fake_runtime_factory: RuntimeFactory) -> None:
    policy = load_policy("default").changed({"spill": {"turn_budget_chars": 8000, "turn_floor_chars": 5000}}, "test")
    runtime = fake_runtime_factory(policy)
    big = "y" * 6000
    runtime.conversation("budget").run_turn(
        [HostResult(tool="search", call_id=f"h{i}", result=big) for i in range(3)]
        + [ToolCall(tool="run_python", arguments={"code": "print(1)"}, call_id="r1")]
    )
    registry = runtime.metrics.registry
    assert _value(registry, "sandbox_runtime_spills_total", kind="result") == 3
    assert _value(registry, "sandbox_runtime_budget_replacements_total") >= 1
    assert _value(registry, "sandbox_runtime_calls_total", tool="run_python", status="ok") == 1
    assert _value(registry, "sandbox_runtime_calls_total", tool="unknown", status="ok") == 0  # a host result is no call


def test_admission_waits_and_refusals_and_tenants_disk(fake_runtime_factory: RuntimeFactory) -> None:
    policy = load_policy("default").changed({"admission": {"tenant_disk_max_bytes": 1000}}, "test")
    runtime = fake_runtime_factory(policy)
    full = runtime.conversation("fills", tenant="acme")
    full.call("run_python", {"code": "open('big.bin', 'wb').write(b'z' * 5000)"})
    runtime.admission.measure_disk()  # the background look, now
    registry = runtime.metrics.registry
    assert _value(registry, "sandbox_runtime_tenant_results_bytes", tenant="acme") >= 5000
    assert _value(registry, "sandbox_runtime_tenant_results_quota_bytes", tenant="acme") == 1000
    with pytest.raises(AdmissionRefused):
        full.call("run_python", {"code": "print(1)"})
    assert _value(registry, "sandbox_runtime_admission_refused_total") == 1
    assert _value(registry, "sandbox_runtime_calls_total", tool="run_python", status="refused") == 1
    assert _value(registry, "sandbox_runtime_calls_total", tool="run_python", status="infrastructure") == 0
    assert _value(registry, "sandbox_runtime_admission_wait_seconds_count") == 1  # the call that ran
    assert _value(registry, "sandbox_runtime_admission_waiting_calls") == 0


def test_tenant_series_are_bounded_and_the_rest_summed() -> None:
    used = {f"tenant-{i:03d}": float(i) for i in range(200)}
    kept = top_series(used, 3)
    assert kept == {"tenant-199": 199.0, "tenant-198": 198.0, "tenant-197": 197.0, OTHER_TENANTS: sum(range(197))}
    assert top_series({"a": 1.0}, 3) == {"a": 1.0}


def test_a_scrape_survives_a_gauge_owner_that_cannot_answer(caplog: pytest.LogCaptureFixture) -> None:
    metrics = RuntimeMetrics(tools={"run_python"}, backend="fake")

    def broken() -> list[object]:
        raise OSError("the disk is gone")

    metrics.add_gauges("broken", broken)  # type: ignore[arg-type]
    metrics.calls.labels("run_python", "ok").inc()
    text = generate_latest(_hosted(metrics)).decode()
    assert 'sandbox_runtime_calls_total{status="ok",tool="run_python"} 1.0' in text
    assert "the broken gauges could not be read" in caplog.text


def test_two_runtimes_cannot_share_one_registry_unnoticed(fake_runtime_factory: RuntimeFactory) -> None:
    registry = _hosted(fake_runtime_factory().metrics)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(fake_runtime_factory().metrics)


def test_a_run_that_ends_its_executor_counts_as_an_executor_restart(fake_runtime_factory: RuntimeFactory) -> None:
    runtime = fake_runtime_factory()
    conversation = runtime.conversation("restarts")
    assert not conversation.call("run_python", {"code": "print(1)"}).is_error
    registry = _hosted(runtime.metrics)
    before = _value(registry, "sandbox_runtime_executor_restarts_total", backend="fake")
    conversation.call("run_python", {"code": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"})
    after = conversation.call("run_python", {"code": "print(2)"})  # a fresh executor
    assert not after.is_error, after.text
    assert _value(registry, "sandbox_runtime_executor_restarts_total", backend="fake") == before + 1
