"""The official SDK's client in the stateless 2026-07-28 era over streamable HTTP (``Client(..., mode=
"2026-07-28")``: no ``initialize``, no session — every request stands alone), in front of ``sandbox-runtime serve
--http``. Without a session or a ``_meta`` conversation, the server keeps one conversation per server (no token),
so the paths one request hands the model are valid in the next."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandbox_runtime.cli.sample_data import make_sample_database
from tests.client_helpers import (
    CALL_TIMEOUT_S,
    check_one_conversation_did_the_work,
    check_what_the_model_received,
)
from tests.clients.walk import ScriptedModel
from tests.conftest import EVERY_BACKEND_POLICIES, Served
from tests.mcp_helpers import BUILTIN_TOOLS, http_server, run_bounded

STATELESS = "2026-07-28"
CONVERSATION_META = "sandbox-runtime/conversation"


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return make_sample_database(tmp_path / "shop.sqlite3", rows=360)


async def _stateless_walk(url: str) -> dict[str, Any]:
    """The scripted walk; the model is handed each result's ``content[0]`` text. Also records every HTTP request
    the client sent (its ``mcp-*`` headers and JSON-RPC body)."""
    sent: list[dict[str, Any]] = []

    async def record(request: httpx2.Request) -> None:
        headers = {k.lower(): v for k, v in request.headers.items() if k.lower().startswith("mcp-")}
        body = json.loads(request.content) if request.content else None
        sent.append({"http": request.method, "headers": headers, "body": body})

    model = ScriptedModel()
    async with (
        httpx2.AsyncClient(event_hooks={"request": [record]}, timeout=CALL_TIMEOUT_S) as http,
        Client(streamable_http_client(url, http_client=http), mode=STATELESS) as client,
    ):
        assert client.protocol_version == STATELESS
        offered = [tool.name for tool in (await client.list_tools()).tools]
        while (call := model.next_call()) is not None:
            result = await client.call_tool(call.tool, call.arguments)
            first = result.content[0]
            assert isinstance(first, types.TextContent), result
            raw = {"structured": result.structured_content, "meta": result.meta}
            model.receive(call.tool, first.text, is_error=result.is_error, raw=raw)
    return {**model.report(), "offered": offered, "sent": sent}


@pytest.mark.process
@pytest.mark.parametrize("engine_policy", EVERY_BACKEND_POLICIES)
def test_a_stateless_client_keeps_its_paths_valid_from_one_request_to_the_next(served: Served, database: Path) -> None:
    with http_server(served.state, "--database", str(database), policy=served.policy) as url:
        report = run_bounded(_stateless_walk, url)

    # what the stateless era sent: no handshake, no session, the version on every request
    bodies = [s["body"] for s in report["sent"] if s["body"] is not None]
    assert [b["method"] for b in bodies] == ["tools/list"] + ["tools/call"] * len(report["calls"])
    assert all("mcp-session-id" not in s["headers"] for s in report["sent"])
    assert all(s["headers"].get("mcp-protocol-version") == STATELESS for s in report["sent"])
    assert all(b["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] == STATELESS for b in bodies)
    assert all(CONVERSATION_META not in b["params"]["_meta"] for b in bodies)  # the client names no conversation

    assert sorted(report["offered"]) == sorted([*BUILTIN_TOOLS, "sql_query"])
    check_what_the_model_received(report)
    conversation = check_one_conversation_did_the_work(served.runtimes, served.state)
    assert {r["raw"]["meta"][CONVERSATION_META] for r in report["received"]} == {conversation}
