"""The gateway in front of real upstream MCP servers.

- mcp-server-sqlite and mcp-server-time from PyPI, installed by scripts/setup-dev.sh into .venv-upstream (they are
  built on the 1.x SDK); without them those tests skip on a developer's machine and fail in CI;
- tests/upstreams/sdk_upstream.py, built on the 2.x SDK of this venv: the SDK's ``{"result": ...}`` wrapper, an
  output schema of its own, an image, progress and cancellation;
- a plain TCP listener standing in for an HTTP upstream that must never be asked anything.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import psutil
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandbox_runtime import Conversation
from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.cli.sample_data import make_sample_database
from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import UpstreamError
from sandbox_runtime.mcp.gateway import Gateway
from sandbox_runtime.mcp.resources import result_uri
from sandbox_runtime.policy import McpPolicy, UpstreamServer
from tests.conftest import RuntimeFactory
from tests.mcp_helpers import (
    BUILTIN_TOOLS,
    Elicitations,
    http_server,
    links_of,
    query_export_attach,
    run_bounded,
    stdio_params,
    structured,
    text_of,
)
from tests.upstreams.sdk_upstream import frame_rows, lines_text, png_bytes, wav_bytes

UPSTREAM_BIN = Path(__file__).resolve().parent.parent / ".venv-upstream" / "bin"
SQLITE_SERVER = UPSTREAM_BIN / "mcp-server-sqlite"
TIME_SERVER = UPSTREAM_BIN / "mcp-server-time"
SDK_UPSTREAM = [sys.executable, str(Path(__file__).resolve().parent / "upstreams" / "sdk_upstream.py")]
ROWS = 2000
MARKER_WAIT_S = 30.0

if not (SQLITE_SERVER.exists() and TIME_SERVER.exists()) and os.environ.get("CI"):
    raise RuntimeError(f"the upstream MCP servers are missing in {UPSTREAM_BIN}: scripts/setup-dev.sh installs them")
pypi_upstreams = pytest.mark.skipif(
    not (SQLITE_SERVER.exists() and TIME_SERVER.exists()),
    reason="upstream MCP servers not installed (run scripts/setup-dev.sh)",
)

INSERT_SCRIPT = """\
import json
values = ",".join(
    f"({i}, 'lib{i % 7}.so.{i % 3}', {i * 1.25}, 'frame {i} os_thr_id@entry={232155 + i}')" for i in range(2000)
)
with open("/mnt/results/args/insert.json", "w") as out:
    json.dump({"query": "INSERT INTO frames (id, library, size_kb, note) VALUES " + values}, out)
print("written")
"""


def upstream_pid(marker: str) -> int:
    """The pid of the upstream server this test process started (found by its own command line)."""
    for child in psutil.Process().children(recursive=True):
        if any(marker in part for part in child.cmdline()):
            return child.pid
    raise AssertionError(f"no upstream process with {marker!r} in its command line")


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Path:
    return tmp_path / "upstream.sqlite3"


@pytest.fixture
def gateway(sqlite_db: Path) -> Iterator[Gateway]:
    upstreams = {
        "sqlite": UpstreamServer(command=[str(SQLITE_SERVER), "--db-path", str(sqlite_db)]),
        "time": UpstreamServer(command=[str(TIME_SERVER), "--local-timezone", "UTC"]),
    }
    with Gateway(McpPolicy(upstream_call_timeout_s=3.0, upstream_start_timeout_s=30.0), upstreams) as started:
        yield started


@pypi_upstreams
def test_an_mcp_client_sends_a_large_insert_by_delegate_call_and_gets_the_rows_as_a_spilled_table(
    runtime_factory: RuntimeFactory, served_state: Path, sqlite_db: Path
) -> None:
    state = served_state
    params = stdio_params(
        state, "--upstream", f"sqlite={SQLITE_SERVER} --db-path {sqlite_db}", "--upstream", f"time={TIME_SERVER}"
    )

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with Client(params, read_timeout_seconds=120) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            seen["names"] = names
            created = await client.call_tool(
                "sqlite__create_table",
                {"query": "CREATE TABLE frames (id INTEGER, library TEXT, size_kb REAL, note TEXT)"},
            )
            assert not created.is_error, text_of(created)
            wrote = await client.call_tool("run_python", {"code": INSERT_SCRIPT})
            assert not wrote.is_error, text_of(wrote)
            delegated = await client.call_tool(
                "delegate_call", {"tool": "sqlite__write_query", "args_file": "/mnt/results/args/insert.json"}
            )
            seen["delegated"] = text_of(delegated)
            read = await client.call_tool("sqlite__read_query", {"query": "SELECT * FROM frames ORDER BY id"})
            seen["read"] = structured(read)
            seen["read_links"] = links_of(read)
            spill = seen["read"]["file"]
            exported = await client.call_tool("export_table", {"source": spill["path"], "format": "csv"})
            seen["exported"] = structured(exported)["file"]
            csv_link = links_of(exported)[0]
            contents = (await client.read_resource(csv_link.uri)).contents[0]
            assert isinstance(contents, types.TextResourceContents)
            seen["csv"] = contents.text
            seen["bad_zone"] = await client.call_tool("time__get_current_time", {"timezone": "Mars/Olympus_Mons"})
        return seen

    seen = run_bounded(scenario)
    assert {"sqlite__read_query", "sqlite__write_query", "time__get_current_time"} <= set(seen["names"])
    assert seen["names"][:8] == BUILTIN_TOOLS
    assert "'affected_rows': 2000" in seen["delegated"]
    spill = seen["read"]["file"]
    assert (spill["rows"], spill["columns"], spill["format"]) == (ROWS, ["id", "library", "size_kb", "note"], "table")
    assert spill["column_types"][:3] == ["integer", "string", "number"]
    assert seen["read_links"][0].size == spill["bytes"]
    assert seen["exported"]["rows"] == ROWS
    csv_lines = seen["csv"].splitlines()
    assert csv_lines[0] == "id,library,size_kb,note"
    assert csv_lines[1 + 1717] == "1717,lib2.so.1,2146.25,frame 1717 os_thr_id@entry=233872"  # not retyped: exact
    zone = seen["bad_zone"]
    assert zone.is_error  # the upstream's isError is kept …
    assert "Error processing mcp-server-time query" in text_of(zone)  # its own words (a bug of its own inside)
    assert any("/errors/" in link.uri for link in links_of(zone))  # … and its full error is saved
    runtime = runtime_factory(state_dir=state)
    (record,) = runtime.state.conversations()
    calls = {c.tool: c for c in runtime.conversation_by_key(record.id).calls()}
    assert calls["delegate_call"].target == "sqlite__write_query"
    assert calls["delegate_call"].expanded is not None
    assert len(calls["delegate_call"].expanded) > 100_000


@pytest.fixture
def conversation(runtime_factory: RuntimeFactory, gateway: Gateway) -> Conversation:
    """A conversation of a runtime whose tools include the gateway's upstream tools."""
    runtime = runtime_factory()
    gateway.register(runtime)
    return runtime.conversation("gateway")


@pypi_upstreams
def test_an_upstream_that_dies_gives_a_clear_error_and_is_restarted(
    conversation: Conversation, gateway: Gateway, sqlite_db: Path
) -> None:
    first = conversation.call("sqlite__list_tables", {})
    assert not first.is_error, first.text

    os.kill(upstream_pid(str(sqlite_db)), signal.SIGKILL)
    failed = conversation.call("sqlite__list_tables", {})
    assert failed.is_error
    assert "UpstreamError" in failed.text
    assert "stopped during the call" in failed.text or "not running" in failed.text

    again = conversation.call("sqlite__list_tables", {})
    assert not again.is_error, again.text
    assert next(s for s in gateway.status() if s.name == "sqlite").starts == 2
    assert conversation.call("time__get_current_time", {"timezone": "UTC"}).is_error is False  # the other one

    registry = conversation.runtime.metrics.registry  # what the on-call engineer sees of it
    assert registry.get_sample_value("sandbox_runtime_upstream_call_errors_total", {"upstream": "sqlite"}) == 1
    assert registry.get_sample_value("sandbox_runtime_upstream_up", {"upstream": "sqlite"}) == 1
    assert registry.get_sample_value("sandbox_runtime_upstream_up", {"upstream": "time"}) == 1
    ok = {"tool": "sqlite__list_tables", "status": "ok"}
    assert registry.get_sample_value("sandbox_runtime_calls_total", ok) == 2


@pypi_upstreams
def test_an_upstream_that_hangs_times_out_and_is_replaced(conversation: Conversation, sqlite_db: Path) -> None:
    assert not conversation.call("sqlite__list_tables", {}).is_error
    stalled = upstream_pid(str(sqlite_db))
    os.kill(stalled, signal.SIGSTOP)
    try:
        hung = conversation.call("sqlite__list_tables", {})
        assert hung.is_error
        assert "did not answer sqlite__list_tables" not in hung.text  # the upstream's own tool name is shown
        assert "did not answer list_tables within 3 s" in hung.text
        recovered = conversation.call("sqlite__list_tables", {})
        assert not recovered.is_error, recovered.text
        assert upstream_pid(str(sqlite_db)) != stalled
    finally:
        if psutil.pid_exists(stalled):
            os.kill(stalled, signal.SIGKILL)


@pypi_upstreams
def test_results_of_upstream_tools_spill_like_any_other(conversation: Conversation) -> None:
    now = conversation.call("time__get_current_time", {"timezone": "Europe/Berlin"})
    assert not now.is_error
    assert json.loads(now.text)["timezone"] == "Europe/Berlin"  # structuredContent, the wrapper stripped
    assert now.descriptor is None  # short: inline, no file


@pypi_upstreams
def test_an_http_client_walks_spill_export_attach_with_an_approval_and_delegates_to_an_upstream(
    served_state: Path, tmp_path: Path, sqlite_db: Path
) -> None:
    database = make_sample_database(tmp_path / "shop.sqlite3", rows=360)
    policy = tmp_path / "ask.toml"
    policy.write_text('name = "ask"\n[approval.tool_rules]\nattach_file = "ask"\n')
    user = Elicitations(approve=True)
    token = "http-token-" + "y" * 24
    serve_args = ("--database", str(database), "--upstream", f"sqlite={SQLITE_SERVER} --db-path {sqlite_db}")

    async def walk(url: str) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode="legacy", elicitation_callback=user) as client:
                seen["tools"] = [tool.name for tool in (await client.list_tools()).tools]
                walked = await query_export_attach(client, user)
                seen["attached"] = walked["attached"]
                seen["resources"] = [r.uri for r in (await client.list_resources()).resources]
                await client.call_tool("sqlite__create_table", {"query": "CREATE TABLE notes (id INTEGER, body TEXT)"})
                await client.call_tool(
                    "write_file",
                    {
                        "path": "/mnt/results/args/note.json",
                        "content": json.dumps({"query": "INSERT INTO notes VALUES (1, '" + "n" * 50_000 + "')"}),
                    },
                )
                delegated = await client.call_tool(
                    "delegate_call", {"tool": "sqlite__write_query", "args_file": "/mnt/results/args/note.json"}
                )
                seen["delegated"] = text_of(delegated)
                counted = await client.call_tool("sqlite__read_query", {"query": "SELECT length(body) AS n FROM notes"})
                seen["counted"] = text_of(counted)
        return seen

    with http_server(served_state, *serve_args, env={"SANDBOX_RUNTIME_MCP_TOKEN": token}, policy=policy) as url:
        seen = run_bounded(walk, url)
    assert {"sql_query", "sqlite__write_query"} <= set(seen["tools"])
    assert not seen["attached"].is_error, text_of(seen["attached"])
    assert len(user.messages) == 1  # asked once, over the HTTP stream of the attach call
    assert any(uri.endswith(".table.jsonl") for uri in seen["resources"])
    assert "'affected_rows': 1" in seen["delegated"]
    assert "50000" in seen["counted"]


def test_an_upstream_over_streamable_http_with_a_token(
    runtime_factory: RuntimeFactory, served_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "inner-" + "z" * 26
    monkeypatch.setenv("INNER_TOKEN", token)
    with http_server(served_state, env={"SANDBOX_RUNTIME_MCP_TOKEN": token}) as url:
        upstreams = {"inner": UpstreamServer(url=url, token_variable="INNER_TOKEN")}  # noqa: S106  (a name)
        with Gateway(McpPolicy(), upstreams) as gateway:
            (status,) = gateway.status()
            assert status.running, status.error
            runtime = runtime_factory()
            assert "inner__write_file" in gateway.register(runtime)
            conversation = runtime.conversation("gateway-http")
            written = conversation.call("inner__write_file", {"path": "/mnt/results/n.txt", "content": "x" * 3000})
            assert not written.is_error, written.text
            read = conversation.call("inner__read_file", {"path": "/mnt/results/n.txt"})
            assert not read.is_error, read.text
            # an upstream's structuredContent (its tool declares an output schema) is its result: here the inner
            # runtime's own result object, saved whole as JSON
            assert read.descriptor is not None
            assert read.descriptor.format == "json"
            root = runtime.store.results_root(conversation.folders)
            inner = json.loads(root.read_text(read.descriptor.path, max_bytes=1 << 20))
            assert (inner["text"], inner["path"]) == ("x" * 3000, "/mnt/results/n.txt")
        monkeypatch.setenv("INNER_TOKEN", "wrong")
        with Gateway(McpPolicy(upstream_start_timeout_s=5.0), upstreams) as refused:
            (status,) = refused.status()
            assert not status.running
            assert status.error is not None


# --------------------------------------------------------------------- an upstream built on the 2.x Python SDK
@pytest.fixture
def sdk_gateway() -> Iterator[Gateway]:
    with Gateway(McpPolicy(upstream_start_timeout_s=30.0), {"sdk": UpstreamServer(command=SDK_UPSTREAM)}) as started:
        (status,) = started.status()
        assert status.running, status.error
        yield started


@pytest.fixture
def sdk_runtime(runtime_factory: RuntimeFactory, sdk_gateway: Gateway) -> Runtime:
    runtime = runtime_factory()
    sdk_gateway.register(runtime)
    return runtime


def saved_text(runtime: Runtime, conversation: Conversation, path: str) -> str:
    return runtime.store.results_root(conversation.folders).read_text(path, max_bytes=1 << 24)


def test_a_999_character_text_from_an_sdk_upstream_is_shown_as_it_is_without_the_sdk_wrapper(
    sdk_runtime: Runtime,
) -> None:
    conversation = sdk_runtime.conversation("sdk-text")
    shown = conversation.call("sdk__text", {"chars": 999})
    assert not shown.is_error, shown.text
    assert shown.text == lines_text(999)  # the upstream's lines, not {"result": "line 00000: …\\n…"}
    assert shown.descriptor is None  # 999 characters: under the 1,000-character threshold (the wrapper made 1,026)
    assert shown.structured is None  # the wrapper is not the tool's own structured result


def test_a_5000_character_text_from_an_sdk_upstream_spills_as_a_text_file_of_its_own_lines(
    sdk_runtime: Runtime,
) -> None:
    conversation = sdk_runtime.conversation("sdk-long-text")
    spilled = conversation.call("sdk__text", {"chars": 5000})
    assert not spilled.is_error, spilled.text
    d = spilled.descriptor
    assert d is not None
    assert (d.format, d.chars) == ("text", 5000)
    assert d.path.endswith(".txt")
    assert saved_text(sdk_runtime, conversation, d.path).splitlines() == lines_text(5000).splitlines()
    assert spilled.text.startswith("line 00000: the quick brown fox")  # the preview is the text, too


def test_an_upstream_tools_own_structured_result_is_kept_and_a_large_one_spills_as_a_table(
    sdk_runtime: Runtime,
) -> None:
    spec = sdk_runtime.tools["sdk__frames"]
    assert spec.title == "Frames as a table"
    assert spec.output_schema is not None
    assert set(spec.output_schema["properties"]) == {"columns", "rows"}  # the upstream's own, passed on
    assert sdk_runtime.tools["sdk__text"].output_schema is None  # the SDK's {"result": string} is not its own
    conversation = sdk_runtime.conversation("sdk-frames")

    small = conversation.call("sdk__frames", {"count": 3})
    assert not small.is_error, small.text
    assert small.structured == {"columns": ["id", "library", "size_kb"], "rows": frame_rows(3)}
    assert json.loads(small.text) == small.structured

    large = conversation.call("sdk__frames", {"count": ROWS})
    d = large.descriptor
    assert d is not None
    assert (d.format, d.rows, d.columns) == ("table", ROWS, ["id", "library", "size_kb"])
    assert d.column_types == ["integer", "string", "number"]

    listed = conversation.call("sdk__frame_list", {"count": ROWS})  # records the SDK wrapped in {"result": [...]}
    d = listed.descriptor
    assert d is not None
    assert (d.format, d.rows, d.columns) == ("table", ROWS, ["id", "library", "size_kb"])


def test_an_image_from_an_upstream_is_saved_with_its_bytes_named_in_the_text_and_linked(
    sdk_runtime: Runtime,
) -> None:
    conversation = sdk_runtime.conversation("sdk-image")
    shown = conversation.call("sdk__image", {"side": 16}, call_id="image-1")
    assert not shown.is_error, shown.text
    expected = png_bytes(16)
    path = "/mnt/results/spill/sdk__image-image-1-1.png"
    assert shown.text == f"[image saved as {path}: image/png, {len(expected):,} bytes]"
    root = sdk_runtime.store.results_root(conversation.folders)
    assert root.read_bytes(path, max_bytes=1 << 20) == expected
    (link,) = shown.blocks
    assert link["type"] == "resource_link"
    assert link["uri"] == result_uri("sdk-image", path, "/mnt/results")
    assert (link["mimeType"], link["size"], link["name"]) == ("image/png", len(expected), "sdk__image-image-1-1.png")


def test_an_audio_clip_from_an_upstream_is_saved_as_a_wav_file_with_its_bytes(sdk_runtime: Runtime) -> None:
    conversation = sdk_runtime.conversation("sdk-audio")
    shown = conversation.call("sdk__clip", {"samples": 800}, call_id="clip-1")
    expected = wav_bytes(800)
    path = "/mnt/results/spill/sdk__clip-clip-1-1.wav"
    assert shown.text == f"[audio saved as {path}: audio/wav, {len(expected):,} bytes]"
    assert sdk_runtime.store.results_root(conversation.folders).read_bytes(path, max_bytes=1 << 20) == expected
    (link,) = shown.blocks
    assert (link["mimeType"], link["size"]) == ("audio/wav", len(expected))


def test_an_upstreams_progress_reaches_the_caller_in_order(sdk_runtime: Runtime) -> None:
    heard: list[tuple[float, float | None, str | None]] = []
    control = CallControl(progress=lambda progress, total, message: heard.append((progress, total, message)))
    done = sdk_runtime.conversation("sdk-progress").call("sdk__steps", {"count": 5}, control=control)
    assert not done.is_error, done.text
    assert done.text == "5 steps done"
    assert heard == [(float(step), 5.0, f"step {step} of 5") for step in range(1, 6)]


def test_a_call_the_caller_cancels_is_cancelled_upstream_and_the_model_is_told(
    sdk_runtime: Runtime, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled.txt"
    cancelled = threading.Event()
    # the upstream's first progress report says it is waiting: the caller cancels then
    control = CallControl(cancelled=cancelled, progress=lambda *_: cancelled.set())
    outcome = sdk_runtime.conversation("sdk-cancel").call(
        "sdk__wait_for_cancel", {"marker": str(marker)}, control=control
    )
    assert outcome.is_error
    assert "the call of wait_for_cancel on the upstream MCP server 'sdk' was cancelled" in outcome.text
    deadline = time.monotonic() + MARKER_WAIT_S  # the upstream heard notifications/cancelled (it writes the marker)
    while not marker.exists():
        assert time.monotonic() < deadline, "the upstream never heard of the cancel"
        time.sleep(0.05)
    assert marker.read_text() == "cancelled\n"


# ------------------------------------------------------------------------------------------ token variables
def test_an_http_upstream_whose_token_variable_is_unset_or_empty_is_down_and_is_never_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        upstreams = {"crm": UpstreamServer(url=f"http://127.0.0.1:{port}/mcp", token_variable="SRT_TEST_CRM_TOKEN")}  # noqa: S106  (a name)
        for value in (None, ""):
            if value is None:
                monkeypatch.delenv("SRT_TEST_CRM_TOKEN", raising=False)
            else:
                monkeypatch.setenv("SRT_TEST_CRM_TOKEN", value)
            with Gateway(McpPolicy(upstream_start_timeout_s=5.0), upstreams) as gateway:
                (status,) = gateway.status()
                assert not status.running
                assert status.error is not None
                assert "SRT_TEST_CRM_TOKEN" in status.error
                assert "not set or empty" in status.error
                with pytest.raises(UpstreamError, match="SRT_TEST_CRM_TOKEN"):
                    gateway.call("crm", "anything", {})  # a call says why, and still sends nothing
                (up,) = gateway.gauges()  # what a scrape reads: down
                assert [(sample.labels, sample.value) for sample in up.samples] == [({"upstream": "crm"}, 0.0)]
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody ever connected: no request went out with an empty token


def test_a_token_variable_is_only_for_an_http_upstream_and_must_name_a_variable() -> None:
    with pytest.raises(ValueError, match="`token_variable` is for a `url` upstream"):
        UpstreamServer(command=["mcp-server-time"], token_variable="TIME_TOKEN")  # noqa: S106  (a name)
    with pytest.raises(ValueError, match="must name an environment variable"):
        UpstreamServer(url="http://127.0.0.1:9/mcp", token_variable="not a name")  # noqa: S106  (a bad name, on purpose)


def test_an_mcp_client_sees_an_sdk_upstreams_text_structure_and_progress_and_its_cancel_reaches_the_upstream(
    served_state: Path, tmp_path: Path
) -> None:
    params = stdio_params(served_state, "--upstream", f"sdk={' '.join(SDK_UPSTREAM)}")
    marker = tmp_path / "cancelled-over-mcp.txt"

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with Client(params, read_timeout_seconds=120) as client:
            seen["tools"] = {tool.name: tool for tool in (await client.list_tools()).tools}
            seen["text"] = await client.call_tool("sdk__text", {"chars": 999})
            seen["frames"] = await client.call_tool("sdk__frames", {"count": 3})
            heard: list[float] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                heard.append(progress)

            seen["steps"] = await client.call_tool("sdk__steps", {"count": 3}, progress_callback=on_progress)
            seen["heard"] = list(heard)

            with anyio.CancelScope() as waiting:

                async def cancel_once_waiting(progress: float, total: float | None, message: str | None) -> None:
                    waiting.cancel()  # the upstream said it waits: the client gives up on the call

                await client.call_tool(
                    "sdk__wait_for_cancel", {"marker": str(marker)}, progress_callback=cancel_once_waiting
                )
            seen["cancelled"] = waiting.cancelled_caught
            with anyio.fail_after(MARKER_WAIT_S):  # the cancel travels client → serve → gateway → upstream
                while not marker.exists():
                    await anyio.sleep(0.05)
            seen["after"] = await client.call_tool("sdk__text", {"chars": 10})
        return seen

    seen = run_bounded(scenario)
    assert seen["tools"]["sdk__text"].title == "Numbered lines"
    text = seen["text"]
    assert not text.is_error, text_of(text)
    assert text_of(text) == lines_text(999)  # the lines themselves: no {"result": ...}, no spill
    assert not links_of(text)
    assert structured(text)["file"] is None

    frames = seen["frames"]
    assert frames.structured_content == {"columns": ["id", "library", "size_kb"], "rows": frame_rows(3)}
    assert '"title": "Frames"' in json.dumps(seen["tools"]["sdk__frames"].output_schema)  # the upstream's own

    assert text_of(seen["steps"]) == "3 steps done"
    assert seen["heard"] == [1.0, 2.0, 3.0]

    assert seen["cancelled"]
    assert marker.read_text() == "cancelled\n"
    assert text_of(seen["after"]) == lines_text(10)  # the gateway and the upstream serve on


def test_a_structured_result_with_links_names_the_links_after_the_value_the_model_reads(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory()
    link = {"type": "resource_link", "uri": "crm://reports/7", "name": "report 7", "mimeType": "text/csv", "size": 512}
    runtime.register_tool(
        "crm_report",
        lambda arguments: {
            "content": [{"type": "text", "text": '{"rows": 3}'}, link],
            "structuredContent": {"rows": 3},
        },
        description="A report and its file.",
        input_schema={"type": "object"},
        output_schema={"type": "object", "properties": {"rows": {"type": "integer"}}},
    )
    shown = runtime.conversation("host-structured").call("crm_report", {})
    assert shown.text == '{"rows":3}\n[resource_link crm://reports/7: report 7 (text/csv, 512 bytes)]'
    assert shown.structured == {"rows": 3}
    assert shown.blocks == [link]
