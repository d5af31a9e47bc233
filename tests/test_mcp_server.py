"""The MCP server, driven by the official SDK's client over stdio and streamable HTTP (never by its handlers)."""

from __future__ import annotations

import base64
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from sandbox_runtime.cli.sample_data import make_sample_database
from sandbox_runtime.policy import load_policy
from tests.conftest import EVERY_BACKEND_POLICIES, RuntimeFactory, Served
from tests.mcp_helpers import (
    BUILTIN_TOOLS,
    Elicitations,
    call_meta,
    http_server,
    in_process_client,
    links_of,
    query_export_attach,
    request_meta,
    run_bounded,
    serve_command,
    stdio_params,
    structured,
    text_of,
)

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return make_sample_database(tmp_path / "shop.sqlite3", rows=360)


def asking_before_attaching(tmp_path: Path, policy: Path | str) -> Path:
    """A policy file that asks before every attachment, on the backend ``policy`` names."""
    asking = tmp_path / "ask.toml"
    backend = load_policy(policy).sandbox.backend
    asking.write_text(f'name = "ask"\n[sandbox]\nbackend = "{backend}"\n[approval.tool_rules]\nattach_file = "ask"\n')
    return asking


@pytest.mark.process
@pytest.mark.parametrize("engine_policy", EVERY_BACKEND_POLICIES)
def test_a_client_over_stdio_walks_query_export_attach_with_an_approval(
    served: Served, database: Path, tmp_path: Path
) -> None:
    state = served.state
    user = Elicitations(approve=True)
    params = stdio_params(state, "--database", str(database), policy=asking_before_attaching(tmp_path, served.policy))

    async def scenario() -> None:  # the SDK's default mode: it probes for 2026-07-28 and falls back
        async with Client(params, elicitation_callback=user, read_timeout_seconds=120) as client:
            assert client.protocol_version == "2025-11-25"
            listed = [t.name for t in (await client.list_tools()).tools]
            assert listed == [*BUILTIN_TOOLS, "sql_query"]
            assert listed == [t.name for t in (await client.list_tools()).tools]  # a stable order
            assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name) for name in listed)

            walked = await query_export_attach(client, user)
            attached = walked["attached"]
            assert not attached.is_error, text_of(attached)
            (download,) = links_of(attached)
            assert download.uri.split("/")[-2] == "attachments"
            kept = (await client.read_resource(download.uri)).contents[0]
            assert isinstance(kept, types.BlobResourceContents)
            assert base64.b64decode(kept.blob) == walked["xlsx"]

            failed = await client.call_tool("run_python", {"code": "import json\njson.loads('{broken')\n"})
            assert failed.is_error
            assert "JSONDecodeError" in text_of(failed)
            (error_link,) = links_of(failed)
            assert "/errors/" in error_link.uri
            full = (await client.read_resource(error_link.uri)).contents[0]
            assert isinstance(full, types.TextResourceContents)
            assert "Traceback" in full.text

            with pytest.raises(MCPError, match="Unknown tool: no_such_tool"):
                await client.call_tool("no_such_tool", {})
            bad = await client.call_tool("read_file", {"path": "/etc/passwd"})
            assert bad.is_error
            assert "PathOutsideResults" in text_of(bad)

    run_bounded(scenario)


@pytest.mark.process
def test_a_declined_approval_is_a_tool_error_and_nothing_is_attached(
    fake_runtime_factory: RuntimeFactory,
    fake_served_state: Path,
    database: Path,
    fake_policy_file: Path,
    tmp_path: Path,
) -> None:
    state = fake_served_state
    user = Elicitations(approve=False)
    params = stdio_params(
        state, "--database", str(database), policy=asking_before_attaching(tmp_path, fake_policy_file)
    )

    async def scenario() -> None:
        async with Client(params, mode="legacy", elicitation_callback=user, read_timeout_seconds=120) as client:
            walked = await query_export_attach(client, user)
            assert walked["attached"].is_error
            assert "declined" in text_of(walked["attached"])
            assert ["errors" in link.uri for link in links_of(walked["attached"])] == [True]  # no download

    run_bounded(scenario)
    runtime = fake_runtime_factory(state_dir=state)
    (record,) = runtime.state.conversations()
    assert runtime.conversation_by_key(record.id).attachments() == []


def test_a_client_without_elicitation_gets_the_policys_fallback(
    fake_runtime_factory: RuntimeFactory, fake_policy_file: Path, tmp_path: Path
) -> None:
    runtime = fake_runtime_factory(asking_before_attaching(tmp_path, fake_policy_file))

    async def scenario() -> None:
        async with in_process_client(runtime, mode="legacy") as client:
            await client.call_tool("write_file", {"path": "/mnt/results/note.txt", "content": "hello"})
            refused = await client.call_tool("attach_file", {"path": "/mnt/results/note.txt"})
            assert refused.is_error
            assert "no approver is available" in text_of(refused)
            misnamed = await client.call_tool(
                "read_file",
                {"path": "note.txt"},
                meta=request_meta({"sandbox-runtime/conversation": "not a valid id!"}),
            )
            assert misnamed.is_error
            assert text_of(misnamed).startswith("InvalidConversationId:")

    run_bounded(scenario)


async def _http_client_calls(url: str, token: str) -> dict[str, Any]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        seen: dict[str, Any] = {}
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as first:
            wrote = await first.call_tool("write_file", {"path": "/mnt/results/a.txt", "content": "from the first"})
            seen["first"] = call_meta(wrote)["conversation"]
            big = await first.call_tool("run_python", {"code": "print('row,' * 2000)"})
            seen["big"] = structured(big)
            (link,) = links_of(big)
            contents = (await first.read_resource(link.uri)).contents[0]
            assert isinstance(contents, types.TextResourceContents)
            seen["big_text"] = contents.text
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as second:
            read = await second.call_tool("read_file", {"path": "/mnt/results/a.txt"})
            seen["second"] = call_meta(read)["conversation"]
            seen["second_read"] = read
            named = await second.call_tool(
                "read_file",
                {"path": "/mnt/results/a.txt"},
                meta=request_meta(
                    {"sandbox-runtime/conversation": "named-one", "sandbox-runtime/call-id": "host-call-7"}
                ),
            )
            seen["named"] = named
        return seen


@pytest.mark.process
@pytest.mark.parametrize("engine_policy", EVERY_BACKEND_POLICIES)
def test_http_needs_the_token_and_keeps_one_conversation_per_token_across_sessions(served: Served) -> None:
    state = served.state
    token = "t0ken-" + "x" * 26
    with http_server(state, env={"SANDBOX_RUNTIME_MCP_TOKEN": token}, policy=served.policy) as url:
        assert url.startswith("http://127.0.0.1:")
        assert url.endswith("/mcp")
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        }
        accept = {"Accept": "application/json, text/event-stream"}
        assert httpx2.post(url, json=initialize, headers=accept, timeout=30).status_code == 401
        wrong = {**accept, "Authorization": "Bearer wrong"}
        assert httpx2.post(url, json=initialize, headers=wrong, timeout=30).status_code == 401
        good = {**accept, "Authorization": f"Bearer {token}"}
        answer = httpx2.post(url, json=initialize, headers=good, timeout=30)
        assert answer.status_code == 200
        assert '"protocolVersion":"2025-06-18"' in answer.text.replace(" ", "")

        seen = run_bounded(_http_client_calls, url, token)

    assert seen["first"] == seen["second"]  # one conversation per token, whatever the sessions
    assert seen["first"].startswith("mcp-http-")
    assert not seen["second_read"].is_error  # a path of the first session is valid in the second
    assert "from the first" in text_of(seen["second_read"])
    assert seen["named"].is_error  # another conversation, named in _meta: its own folder
    assert "PathNotFound" in text_of(seen["named"])
    assert call_meta(seen["named"])["call-id"] == "host-call-7"
    assert call_meta(seen["named"])["conversation"] == "named-one"
    assert seen["big"]["file"]["chars"] >= 8000
    assert seen["big_text"].startswith("row,row,")
    runtime = served.runtimes(state_dir=state)
    decided = {d.call_id: d for d in runtime.conversation("named-one").decisions()}
    assert decided["host-call-7"].text == text_of(seen["named"])  # history can replay it byte for byte


@pytest.mark.process
def test_serving_http_off_loopback_without_a_token_is_refused_before_anything_starts(tmp_path: Path) -> None:
    command = serve_command(tmp_path / "state", "--http", "0.0.0.0:0")
    environment = {k: v for k, v in os.environ.items() if k != "SANDBOX_RUNTIME_MCP_TOKEN"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=environment, check=False)
    assert done.returncode == 2
    assert "needs OAuth (mcp.auth) or a bearer token: set $SANDBOX_RUNTIME_MCP_TOKEN" in done.stderr
    assert not (tmp_path / "state").exists()
