"""The gateway in front of real upstream MCP servers from PyPI (mcp-server-sqlite, mcp-server-time).

They are installed by scripts/setup.sh into .venv-upstream (they are built on the 1.x SDK). Without them the
tests skip on a developer's machine and fail in CI.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import psutil
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandbox_runtime import Conversation
from sandbox_runtime.mcp.gateway import Gateway
from sandbox_runtime.policy import McpPolicy, UpstreamServer
from sandbox_runtime.sample_data import make_sample_database
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

UPSTREAM_BIN = Path(__file__).resolve().parent.parent / ".venv-upstream" / "bin"
SQLITE_SERVER = UPSTREAM_BIN / "mcp-server-sqlite"
TIME_SERVER = UPSTREAM_BIN / "mcp-server-time"
ROWS = 2000

if not (SQLITE_SERVER.exists() and TIME_SERVER.exists()):
    if os.environ.get("CI"):
        raise RuntimeError(f"the upstream MCP servers are missing in {UPSTREAM_BIN}: scripts/setup.sh installs them")
    pytest.skip("upstream MCP servers not installed (run scripts/setup.sh)", allow_module_level=True)

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
            spill = seen["read"]["descriptor"]
            exported = await client.call_tool("export_table", {"source": spill["path"], "format": "csv"})
            seen["exported"] = structured(exported)["descriptor"]
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
    spill = seen["read"]["descriptor"]
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
    calls = {c.tool: c for c in runtime.conversation(record.id).calls()}
    assert calls["delegate_call"].target == "sqlite__write_query"
    assert calls["delegate_call"].expanded is not None
    assert len(calls["delegate_call"].expanded) > 100_000


@pytest.fixture
def conversation(runtime_factory: RuntimeFactory, gateway: Gateway) -> Conversation:
    """A conversation of a runtime whose tools include the gateway's upstream tools."""
    runtime = runtime_factory()
    gateway.register(runtime)
    return runtime.conversation("gateway")


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


def test_results_of_upstream_tools_spill_like_any_other(conversation: Conversation) -> None:
    now = conversation.call("time__get_current_time", {"timezone": "Europe/Berlin"})
    assert not now.is_error
    assert json.loads(now.text)["timezone"] == "Europe/Berlin"  # structuredContent, the wrapper stripped
    assert now.descriptor is None  # short: inline, no file


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
            # an upstream's structuredContent is its result (here: the inner runtime's own descriptor)
            assert json.loads(read.text)["tool"] == "read_file"
        monkeypatch.setenv("INNER_TOKEN", "wrong")
        with Gateway(McpPolicy(upstream_start_timeout_s=5.0), upstreams) as refused:
            (status,) = refused.status()
            assert not status.running
            assert status.error is not None
