"""A host that installed OpenTelemetry's SDK sees each call as one trace: the tool's execution, the sandbox's start,
the run, the spans the run's code opened inside the sandbox (over the executor's pipe: no network), and the tool
calls it made inside them; never an argument's value. The runs here are the fake backend's (the same executor and
pipe as a sandbox's, on the host); the trace from an MCP client through ``serve`` is in test_observability_serve.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from sandbox_runtime.mcp.gateway import Gateway
from sandbox_runtime.policy import McpPolicy, UpstreamServer, load_policy
from sandbox_runtime.policy.telemetry import TelemetryPolicy
from sandbox_runtime.telemetry.logs import JsonLogFormatter
from sandbox_runtime.telemetry.sandbox_spans import RunSpans
from sandbox_runtime.telemetry.tracing import tracer
from tests.conftest import RuntimeFactory
from tests.span_capture import captured_spans, named, parent_of

EXECUTOR_DIR = Path(__file__).resolve().parent.parent / "sandbox_runtime" / "_data" / "images" / "executor"
SDK_UPSTREAM = [sys.executable, str(Path(__file__).resolve().parent / "upstreams" / "sdk_upstream.py")]

TRACED_SCRIPT = """
import sandbox_tools as tools
with open("notes.txt", "w") as handle:
    handle.write("a secret argument value")
with tools.span("load workbook", path="notes.txt", rows=3) as step:
    step.set_attribute("sheets", 2)
    tools.event("loaded", bytes=23)
    with tools.span("read it back"):
        print(tools.read_file(path="notes.txt").text[:6])
try:
    with tools.span("fails"):
        raise ValueError("boom")
except ValueError:
    pass
print("done")
"""


def _sandbox_spans(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if (s.attributes or {}).get("sandbox_runtime.from_sandbox")]


def test_a_call_is_one_trace_from_the_tool_down_to_the_spans_its_code_opened(
    fake_runtime_factory: RuntimeFactory,
) -> None:
    runtime = fake_runtime_factory()
    conversation = runtime.conversation("traced-1", tenant="acme")
    with captured_spans() as spans:
        outcome = conversation.call("run_python", {"code": TRACED_SCRIPT}, call_id="call-traced-1")
    assert not outcome.is_error, outcome.text
    assert "done" in outcome.text

    call = named(spans, "execute_tool run_python")
    attributes = dict(call.attributes or {})
    key = conversation.key
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.name"] == "run_python"
    assert attributes["gen_ai.tool.call.id"] == "call-traced-1"
    assert attributes["sandbox_runtime.conversation.hash"] == hashlib.sha256(key.encode()).hexdigest()[:16]
    assert attributes["sandbox_runtime.tenant"] == "acme"
    assert attributes["sandbox_runtime.call.status"] == "ok"
    assert call.status.status_code is not StatusCode.ERROR

    run = named(spans, "sandbox.run")
    assert parent_of(run, spans) is call
    assert (run.attributes or {})["sandbox_runtime.run.status"] == "ok"
    start = named(spans, "sandbox.start")
    assert parent_of(start, spans) is call  # the conversation's first call starts its sandbox
    assert parent_of(named(spans, "admission.wait"), spans) is call

    load = named(spans, "load workbook")
    assert parent_of(load, spans) is run
    assert dict(load.attributes or {}) == {
        "path": "notes.txt",
        "rows": 3,
        "sheets": 2,
        "sandbox_runtime.from_sandbox": True,
    }
    assert [(event.name, dict(event.attributes or {})) for event in load.events] == [("loaded", {"bytes": 23})]
    inner = named(spans, "read it back")
    assert parent_of(inner, spans) is load
    read = named(spans, "execute_tool read_file")  # the script's own call, made inside its span
    assert parent_of(read, spans) is inner
    fails = named(spans, "fails")
    assert fails.status.status_code is StatusCode.ERROR
    assert fails.status.description == "ValueError: boom"
    assert run.start_time is not None
    assert load.start_time is not None
    assert load.end_time is not None
    assert run.start_time <= load.start_time <= load.end_time

    assert len({s.context.trace_id for s in spans if s.context is not None}) == 1
    shown = json.dumps([dict(s.attributes or {}) for s in spans], default=str)
    assert "secret argument" not in shown
    assert "import sandbox_tools" not in shown
    assert key not in shown


def test_spans_past_a_runs_limits_are_dropped_and_counted_and_never_fail_the_run(
    fake_runtime_factory: RuntimeFactory,
) -> None:
    limits = {"sandbox_spans_max_count": 3, "sandbox_span_attributes_max_count": 2, "sandbox_span_text_max_chars": 16}
    runtime = fake_runtime_factory(load_policy("default").changed({"telemetry": limits}, "test"))
    code = (
        "import sandbox_tools as tools\n"
        "for i in range(5):\n"
        "    forged = {'sandbox_runtime.tenant': 'someone else', 'gen_ai.tool.name': 'x'}\n"
        "    with tools.span(f'step number {i} of five', **forged, a='y' * 100, b=float('nan'), c=3):\n"
        "        pass\n"
        "print('ok')\n"
    )
    with captured_spans() as spans:
        outcome = runtime.conversation("limits").call("run_python", {"code": code})
    assert not outcome.is_error, outcome.text
    from_sandbox = _sandbox_spans(spans)
    assert [s.name for s in from_sandbox] == ["step number 0 of", "step number 1 of", "step number 2 of"]
    for opened in from_sandbox:
        assert dict(opened.attributes or {}) == {"a": "y" * 16, "b": "nan", "sandbox_runtime.from_sandbox": True}
        assert parent_of(opened, spans).name == "sandbox.run"
    assert named(spans, "execute_tool run_python").attributes["sandbox_runtime.tenant"] == "default"  # type: ignore[index]
    dropped = runtime.metrics.registry.get_sample_value("sandbox_runtime_sandbox_spans_dropped_total")
    assert dropped == 1  # the fourth: the run's sandbox_tools then opened no more


def test_a_span_the_run_left_open_ends_with_it_marked_failed(fake_runtime_factory: RuntimeFactory) -> None:
    runtime = fake_runtime_factory()
    code = "import time, sandbox_tools as tools\nwith tools.span('waits forever'):\n    time.sleep(120)\n"
    with captured_spans() as spans:
        outcome = runtime.conversation("hangs").call("run_python", {"code": code, "timeout_s": 2})
    assert outcome.is_error
    hung = named(spans, "waits forever")
    assert hung.status.status_code is StatusCode.ERROR
    assert hung.status.description == "the run ended before this span did"
    run = named(spans, "sandbox.run")
    assert parent_of(hung, spans) is run
    assert (run.attributes or {})["sandbox_runtime.run.status"] == "timeout"
    assert (run.attributes or {})["error.type"] == "timeout"
    call = named(spans, "execute_tool run_python")
    assert call.status.status_code is StatusCode.ERROR
    assert (call.attributes or {})["sandbox_runtime.call.failure"] == "tool_error"


def test_an_approval_is_a_span_of_the_call_it_judged(fake_runtime_factory: RuntimeFactory) -> None:
    policy = load_policy("default").changed({"approval": {"tool_rules": {"write_file": "ask"}}}, "test")
    asked: list[str] = []

    def approver(request: Any) -> bool | str:
        asked.append(request.tool)
        return "not today"

    runtime = fake_runtime_factory(policy, approver=approver)
    with captured_spans() as spans:
        outcome = runtime.conversation("judged").call("write_file", {"path": "a.txt", "content": "x"})
    assert outcome.is_error
    assert asked == ["write_file"]
    approval = named(spans, "approval")
    call = named(spans, "execute_tool write_file")
    assert parent_of(approval, spans) is call
    assert (approval.attributes or {})["sandbox_runtime.approval.answer"] == "deny"
    assert (call.attributes or {})["sandbox_runtime.call.failure"] == "denied"
    assert runtime.metrics.registry.get_sample_value("sandbox_runtime_approvals_total", {"decision": "denied"}) == 1


def test_a_line_logged_during_a_call_names_it_and_its_trace(fake_runtime_factory: RuntimeFactory) -> None:
    runtime = fake_runtime_factory()
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep(level=logging.INFO)
    handler.setFormatter(JsonLogFormatter())
    logger = logging.getLogger("sandbox_runtime")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with captured_spans() as spans:
            conversation = runtime.conversation("logged")
            conversation.call("run_python", {"code": "print('secret value 42')"}, call_id="call-logged")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    trace_id = format(named(spans, "execute_tool run_python").context.trace_id, "032x")
    started = [json.loads(line) for line in lines if "started sandbox" in line]
    assert len(started) == 1, lines
    assert started[0]["call_id"] == "call-logged"
    assert started[0]["conversation"] == conversation.key
    assert started[0]["tool"] == "run_python"
    assert started[0]["trace_id"] == trace_id
    assert started[0]["level"] == "info"
    assert started[0]["logger"] == "sandbox_runtime.sandbox.manager"
    assert not any("secret value" in line for line in lines)


def test_while_nothing_records_traces_a_run_sends_one_span_request_at_most() -> None:
    """Outside a recorded span the host says "off"; the run's sandbox_tools then sends no more."""
    assert RunSpans(TelemetryPolicy()).answer(1, {"op": "span", "phase": "start", "span": 1}) == {
        "id": 1,
        "ok": False,
        "error": "off",
    }
    with _sandbox_tools_against(lambda request: {"id": request["id"], "ok": False, "error": "off"}) as (tools, seen):
        with tools.span("one"):
            tools.event("two")
        with tools.span("three"):
            pass
    assert [request["op"] for request in seen] == ["span"]


class _Host:
    """The host's end of a run's tool-call pipe, answering each line with ``reply(request)``."""

    def __init__(self, reply: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.calls_read, self.calls_write = os.pipe()
        self.replies_read, self.replies_write = os.pipe()
        self.seen: list[dict[str, Any]] = []
        self._reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with os.fdopen(self.calls_read, "rb") as calls, os.fdopen(self.replies_write, "wb", buffering=0) as replies:
            for line in calls:
                request = json.loads(line)
                self.seen.append(request)
                replies.write(json.dumps(self._reply(request)).encode() + b"\n")


def test_past_the_limit_a_run_opens_no_more_spans_but_ends_those_open() -> None:
    def host(request: dict[str, Any]) -> dict[str, Any]:
        full = request["op"] == "span" and request["phase"] == "start" and request["span"] > 1
        return {"id": request["id"], "ok": not full, **({"error": "limit"} if full else {})}

    with _sandbox_tools_against(host) as (tools, seen), tools.span("kept"):
        with tools.span("refused"):
            tools.event("not sent")
        with tools.span("not sent either"):
            pass
    assert [(r["op"], r.get("phase"), r.get("name")) for r in seen] == [
        ("span", "start", "kept"),
        ("span", "start", "refused"),
        ("span", "end", None),
    ]


@contextlib.contextmanager
def _sandbox_tools_against(
    reply: Callable[[dict[str, Any]], dict[str, Any]],
) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    """The image's ``sandbox_tools`` (loaded from its file, apart from any other copy) connected to a host that
    answers with ``reply``; the requests it sent."""
    spec = importlib.util.spec_from_file_location("sandbox_tools_under_test", EXECUTOR_DIR / "sandbox_tools.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    host = _Host(reply)
    module._connect(host.calls_write, host.replies_read)
    try:
        yield module, host.seen
    finally:
        os.close(host.calls_write)
        host.thread.join(timeout=10)
        os.close(host.replies_read)


@pytest.mark.process
def test_an_upstream_call_carries_the_trace_to_the_upstream_server(fake_runtime_factory: RuntimeFactory) -> None:
    runtime = fake_runtime_factory()
    upstreams = {"sdk": UpstreamServer(command=SDK_UPSTREAM)}
    with Gateway(McpPolicy(upstream_start_timeout_s=30.0), upstreams) as gateway:
        gateway.register(runtime)
        with captured_spans() as spans:
            outcome = runtime.conversation("upstream").call("sdk__trace_context", {})
    assert not outcome.is_error, outcome.text
    call = named(spans, "execute_tool sdk__trace_context")
    upstream = named(spans, "upstream.call")
    assert parent_of(upstream, spans) is call
    assert (upstream.attributes or {})["sandbox_runtime.upstream"] == "sdk"
    sent = named(spans, "MCP send tools/call trace_context")  # the SDK client's, on the gateway's event loop
    assert parent_of(sent, spans) is upstream
    assert sent.context is not None
    received = outcome.text.strip()  # what the upstream server got in _meta: this trace, the client span's id
    version, trace_id, parent_id, _flags = received.split("-")
    assert (version, trace_id, parent_id) == ("00", f"{sent.context.trace_id:032x}", f"{sent.context.span_id:016x}")


def test_a_spill_and_an_export_are_spans_of_their_calls(fake_runtime_factory: RuntimeFactory) -> None:
    conversation = fake_runtime_factory().conversation("data-path")
    code = "import json\nopen('t.json', 'w').write(json.dumps([{'n': i} for i in range(5)]))\nprint('x' * 3000)"
    with captured_spans() as spans:
        assert not conversation.call("run_python", {"code": code}).is_error
        assert not conversation.call("export_table", {"source": "t.json", "format": "xlsx"}).is_error
    spill = named(spans, "spill.write")
    assert parent_of(spill, spans).name == "execute_tool run_python"
    assert dict(spill.attributes or {}) == {"sandbox_runtime.spill.format": "text", "sandbox_runtime.spill.bytes": 3001}
    export = named(spans, "export")
    assert parent_of(export, spans).name == "execute_tool export_table"
    assert (export.attributes or {})["sandbox_runtime.export.rows"] == 5
    assert (export.attributes or {})["sandbox_runtime.export.format"] == "xlsx"


def test_hostile_span_requests_get_refusals_and_the_host_goes_on() -> None:
    hostile: list[dict[str, Any]] = [
        {"op": "event", "span": [1], "name": {"x": 1}, "attributes": [1, 2]},
        {"op": "span", "phase": "end", "span": {"a": 1}},
        {"op": "span", "phase": "start", "span": "7", "name": "not a number"},
        {"op": "span", "phase": "start", "span": 1, "name": None, "attributes": {"k": {"deep": [1]}, "n": 2**70}},
        {"op": "span", "phase": "start", "span": 1, "name": "the same number again"},
        {"op": "span", "phase": "sideways", "span": 1},
        {"op": "span", "phase": "end", "span": 99},
        {"op": "event", "span": 1, "name": "x" * 10_000},
    ]
    with captured_spans() as spans, tracer.start_as_current_span("sandbox.run"):
        run = RunSpans(TelemetryPolicy())
        replies = [run.answer(n, request) for n, request in enumerate(hostile)]
        run.close()  # span 1 was left open
    assert [reply["ok"] for reply in replies] == [True, True, False, True, False, False, True, True]
    assert [reply["id"] for reply in replies] == list(range(len(hostile)))
    opened = named(spans, "span")  # a start without a name
    assert dict(opened.attributes or {}) == {
        "k": "{'deep': [1]}",
        "n": str(2**70),
        "sandbox_runtime.from_sandbox": True,
    }
    assert [(event.name, len(event.name)) for event in opened.events] == [("x" * 256, 256)]
    assert opened.status.status_code is StatusCode.ERROR
