"""The on-call engineer's view of ``serve --http``: a real Prometheus (Debian's) scrapes its ``/metrics`` behind the
bearer token while an MCP client calls it; a call made with the client's W3C trace context arrives at an OTLP/HTTP
receiver as one trace, from the client's span through the MCP server's and the run's down to a span the code opened
inside its sandbox (which has no network: the span came over the executor's pipe); and ``--log-format json`` gives
one JSON object per line, the call's lines carrying its trace id. Also: ``--metrics`` on a port of its own, guarded
like the MCP port, and not served on the MCP port under OAuth (any tenant's token would do there).
"""

from __future__ import annotations

import json
import os
import queue
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry import context as otel_context
from opentelemetry.propagate import extract
from opentelemetry.trace import SpanKind

from tests.mcp_helpers import SERVE_START_S, run_bounded, serve_command, serve_process, structured, text_of
from tests.oauth_issuer import oauth_policy, running_issuer
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.prometheus_server import PrometheusServer, values
from tests.span_capture import captured_spans

TOKEN = "observability-test-token"  # noqa: S105  (a test's own bearer token)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only, never a proxy

TRACED_CODE = """
import sandbox_tools as tools
with tools.span("load workbook", rows=3) as step:
    step.set_attribute("sheets", 2)
    tools.event("loaded")
    print(sum(range(10)))
"""


def _json_lines(lines: queue.Queue[str | None], seen: list[dict[str, Any]], until: str) -> str:
    """Read serve's stderr (each line must be one JSON object) until a message starts with ``until``; the rest
    of that message."""
    while True:
        line = lines.get(timeout=SERVE_START_S)
        if line is None:
            raise AssertionError(f"serve ended before it said {until!r}")
        record = json.loads(line)
        seen.append(record)
        if str(record.get("message", "")).startswith(until):
            return str(record["message"]).removeprefix(until).strip()


async def _calls(url: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=120) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        traced = await client.call_tool("run_python", {"code": TRACED_CODE})
        failed = await client.call_tool("run_python", {"code": "raise ValueError('no')"})
    return {"traced": traced, "failed": failed}


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, [span.describe() for span in spans]
    return found[0]


def test_prometheus_a_trace_and_json_logs_show_what_a_call_did(tmp_path: Path, executor_image: str) -> None:
    del executor_image  # the sandboxes are Docker's: the image is built before serve starts
    stderr: list[dict[str, Any]] = []
    with OtlpReceiver() as receiver:
        env = {
            **os.environ,
            "SANDBOX_RUNTIME_MCP_TOKEN": TOKEN,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_SERVICE_NAME": "sandbox-runtime-under-test",
        }
        command = serve_command(tmp_path / "state", "--http", "127.0.0.1:0", "--log-format", "json")
        with serve_process(command, env=env) as (process, lines):
            url = _json_lines(lines, stderr, "serving MCP at ")
            target = url.removeprefix("http://").removesuffix("/mcp")
            with PrometheusServer(tmp_path / "prometheus", target, bearer_token=TOKEN, job="sandbox-runtime") as prom:
                with captured_spans() as client_spans:  # the client's own spans, as an instrumented agent has
                    attached = otel_context.attach(extract({"traceparent": f"00-{TRACE_ID}-{CLIENT_PARENT}-01"}))
                    try:
                        results = run_bounded(_calls, url)
                    finally:
                        otel_context.detach(attached)
                assert text_of(results["traced"]).startswith("45"), text_of(results["traced"])
                assert structured(results["failed"])["status"] == "error"

                ok = 'sandbox_runtime_calls_total{job="sandbox-runtime",tool="run_python",status="ok"}'
                assert values(prom.wait_for(ok, lambda r: values(r) == [1.0])) == [1.0]
                failed = 'sandbox_runtime_calls_total{tool="run_python",status="tool_error"}'
                assert values(prom.wait_for(failed, lambda r: values(r) == [1.0])) == [1.0]
                runs = 'sandbox_runtime_runs_total{status="error"}'
                assert values(prom.wait_for(runs, lambda r: values(r) == [1.0])) == [1.0]
                median = (
                    "histogram_quantile(0.5, sum by (le) "
                    '(sandbox_runtime_call_duration_seconds_bucket{tool="run_python"}))'
                )
                seconds = values(prom.wait_for(median))
                assert len(seconds) == 1, seconds
                assert 0 < seconds[0] < 60, seconds
                assert values(prom.wait_for("sandbox_runtime_info")) == [1.0]
                assert values(prom.wait_for('up{job="sandbox-runtime"}')) == [1.0]

            spans = receiver.wait_for(lambda got: any(span.name == "load workbook" for span in got))
            process.terminate()
            process.wait(timeout=60)
            while (line := lines.get(timeout=10)) is not None:
                stderr.append(json.loads(line))  # every line, to the last, is one JSON object

    trace = receiver.trace(TRACE_ID)
    sent = [s for s in client_spans if s.kind is SpanKind.CLIENT and s.name == "MCP send tools/call run_python"]
    client_call = min(sent, key=lambda s: s.start_time or 0)  # the SDK client's span of the first call
    assert client_call.parent is not None
    assert format(client_call.parent.span_id, "016x") == CLIENT_PARENT
    assert client_call.context is not None
    server = [s for s in trace if s.name == "tools/call run_python"]
    assert len(server) == 2, [s.describe() for s in spans]
    traced_server = next(s for s in server if s.parent_span_id == format(client_call.context.span_id, "016x"))
    assert traced_server.kind == "SPAN_KIND_SERVER"
    assert traced_server.resource["service.name"] == "sandbox-runtime-under-test"
    execute = next(
        s for s in trace if s.name == "execute_tool run_python" and s.parent_span_id == traced_server.span_id
    )
    assert execute.attributes["sandbox_runtime.call.status"] == "ok"
    assert execute.attributes["sandbox_runtime.tenant"] == "default"
    run = next(s for s in trace if s.name == "sandbox.run" and s.parent_span_id == execute.span_id)
    inside = _one(trace, "load workbook")
    assert inside.parent_span_id == run.span_id
    assert inside.attributes == {"rows": 3, "sheets": 2, "sandbox_runtime.from_sandbox": True}
    assert [name for name, _ in inside.events] == ["loaded"]
    assert run.start_ns <= inside.start_ns <= inside.end_ns <= run.end_ns

    assert all({"time", "level", "logger", "message"} <= record.keys() for record in stderr)
    traced_lines = [record for record in stderr if record.get("trace_id") == TRACE_ID]
    assert traced_lines, stderr
    assert all(record.get("tool") == "run_python" and record.get("call_id") for record in traced_lines)
    assert not any("sum(range(10))" in json.dumps(record) for record in stderr)  # no argument's value


def _get(url: str, token: str | None = None, host: str | None = None, method: str = "GET") -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if host is not None:
        headers["Host"] = host
    request = urllib.request.Request(url, headers=headers, method=method)  # noqa: S310  (a loopback URL the test made)
    try:
        with _OPENER.open(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


@pytest.mark.process
def test_metrics_on_a_port_of_their_own_take_the_token_and_oauth_keeps_them_off_the_mcp_port(
    tmp_path: Path, fake_policy_file: Path
) -> None:
    with running_issuer() as issuer:
        policy = oauth_policy(tmp_path, issuer, base=fake_policy_file.read_text())
        env = {**os.environ, "SANDBOX_RUNTIME_METRICS_TOKEN": "metrics-secret"}
        command = serve_command(tmp_path / "state", "--http", "127.0.0.1:0", "--metrics", "127.0.0.1:0", policy=policy)
        with serve_process(command, env=env) as (process, lines):
            said = _said(lines, ("serving metrics at ", "serving MCP at "))
            metrics_url, mcp_url = said["serving metrics at "], said["serving MCP at "]
            assert _get(metrics_url)[0] == 401
            status, body = _get(metrics_url, "metrics-secret")
            assert status == 200
            assert "sandbox_runtime_info{" in body
            assert "process_resident_memory_bytes" in body
            assert 'sandbox_runtime_auth_failures_total{status_code="401"} 1.0' in body
            token = issuer.token("tenant-a", mcp_url)
            status, body = _get(mcp_url.removesuffix("/mcp") + "/metrics", token)
            assert status == 404  # a tenant's access token reads no other tenant's numbers
            assert "--metrics" in body
            process.terminate()
            assert process.wait(timeout=60) == 0


@pytest.mark.process
def test_metrics_on_loopback_without_a_token_answer_only_to_loopback_names(
    tmp_path: Path, fake_policy_file: Path
) -> None:
    """A web page that rebinds its own name to 127.0.0.1 cannot read them: the Host is checked, as for /mcp."""
    env = _without_tokens()
    command = serve_command(
        tmp_path / "state", "--http", "127.0.0.1:0", "--metrics", "127.0.0.1:0", policy=fake_policy_file
    )
    with serve_process(command, env=env) as (process, lines):
        said = _said(lines, ("serving metrics at ", "serving MCP at "))
        own_port = said["serving metrics at "]
        mcp_port = said["serving MCP at "].removesuffix("/mcp") + "/metrics"
        for url in (own_port, mcp_port):
            status, body = _get(url)
            assert status == 200, body
            assert "sandbox_runtime_info{" in body
            port = url.split(":")[2].split("/")[0]
            assert _get(url, host=f"attacker.example:{port}")[0] == 421
            assert _get(url.replace("127.0.0.1", "localhost"))[0] == 200
            assert _get(url, method="POST")[0] == 405  # both ports answer alike: they share one answer
        process.terminate()
        assert process.wait(timeout=60) == 0


@pytest.mark.process
def test_metrics_off_loopback_without_a_token_are_refused_before_anything_starts(
    tmp_path: Path, fake_policy_file: Path
) -> None:
    env = _without_tokens()
    command = serve_command(
        tmp_path / "state", "--http", "127.0.0.1:0", "--metrics", "0.0.0.0:0", policy=fake_policy_file
    )
    assert "SANDBOX_RUNTIME_METRICS_TOKEN" in _refused_at_start(command, env)
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("variable", "value", "refusal"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "http/protobuf only"),
        ("OTEL_TRACES_EXPORTER", "zipkin", "only otlp"),
    ],
)
@pytest.mark.process
def test_an_exporter_setting_it_cannot_honour_is_refused_at_start(
    tmp_path: Path, fake_policy_file: Path, variable: str, value: str, refusal: str
) -> None:
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", variable: value}
    command = serve_command(tmp_path / "state", "--http", "127.0.0.1:0", policy=fake_policy_file)
    said = _refused_at_start(command, env)
    assert refusal in said
    assert variable in said


def _refused_at_start(command: list[str], env: dict[str, str]) -> str:
    """What serve said as it exited 2 (a usage error) without serving."""
    with serve_process(command, env=env) as (process, lines):
        assert process.wait(timeout=60) == 2
        return "".join(line for line in iter(lines.get, None))


def _without_tokens() -> dict[str, str]:
    """This process's environment without any token variable."""
    return {key: value for key, value in os.environ.items() if "TOKEN" not in key}


def _said(lines: queue.Queue[str | None], starts: tuple[str, ...]) -> dict[str, str]:
    found: dict[str, str] = {}
    while len(found) < len(starts):
        line = lines.get(timeout=SERVE_START_S)
        assert line is not None, f"serve ended before it said {starts}"
        for start in starts:
            if line.startswith(start):
                found[start] = line.removeprefix(start).strip()
    return found
