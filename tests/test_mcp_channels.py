"""What reaches the model through every MCP channel, one conversation across sessions, cancel and progress.

Driven with the SDK's own client over stdio (it validates every result against the tool's ``outputSchema``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandbox_runtime.api.runtime import Runtime
from tests.conftest import RuntimeFactory
from tests.mcp_helpers import (
    BUILTIN_TOOLS,
    call_meta,
    http_server,
    in_process_client,
    run_bounded,
    stdio_params,
    structured,
    text_of,
)
from tests.sandbox_processes import run_processes


# the live processes of runs, listed by a command the runner does not start (the runner's own sweep would end
# leftovers before a script could see them)
def code_processes_left(runtime: Runtime, conversation_id: str) -> int:
    return len(run_processes(runtime, conversation_id))


async def cancel_a_long_run(client: Client, host: Runtime, conversation_id: str, script: str) -> float:
    """Start ``script`` (it writes /mnt/results/started first), cancel the call once it runs, and return how long
    after the cancel the last process of the run was gone from the sandbox."""
    results = host.conversation(conversation_id).folders.results
    async with anyio.create_task_group() as group:
        group.start_soon(client.call_tool, "run_python", {"code": script}, 180.0)
        with anyio.fail_after(60):
            while not (results / "started").exists():
                await anyio.sleep(0.05)
        group.cancel_scope.cancel()  # the client cancels: notifications/cancelled, or (stateless) closing the stream
    cancelled_at = time.monotonic()
    with anyio.fail_after(10):
        while await anyio.to_thread.run_sync(code_processes_left, host, conversation_id):
            await anyio.sleep(0.1)
    return time.monotonic() - cancelled_at


def test_every_tool_says_what_it_is_and_every_result_carries_the_whole_text_in_both_channels(
    runtime: Runtime,
) -> None:
    async def scenario() -> dict[str, Any]:
        async with in_process_client(runtime, read_timeout_seconds=120) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            seen: dict[str, Any] = {"tools": listed}
            seen["small"] = await client.call_tool("run_python", {"code": "print(6 * 7)"})
            seen["failed"] = await client.call_tool("run_python", {"code": "rows = [{}]\nrows[0]['amount']\n"})
            await client.call_tool("write_file", {"path": "notes/a.txt", "content": "alpha\nbeta\n"})
            seen["read"] = await client.call_tool("read_file", {"path": "/mnt/results/notes/a.txt"})
            seen["big"] = await client.call_tool(
                "run_python", {"code": "print('\\n'.join(str(i) for i in range(999)))"}
            )
            seen["bad"] = await client.call_tool("read_file", {"path": "/etc/passwd"})
            return seen

    seen = run_bounded(scenario)
    tools: dict[str, types.Tool] = seen["tools"]
    assert list(tools) == BUILTIN_TOOLS
    for tool in tools.values():
        assert tool.title
        assert tool.title != tool.name
        assert tool.annotations is not None
        assert tool.annotations.open_world_hint is (tool.name == "delegate_call")
        assert tool.output_schema is not None
        Draft202012Validator.check_schema(tool.output_schema)
    assert tools["read_file"].annotations is not None
    assert tools["read_file"].annotations.read_only_hint
    assert tools["run_python"].annotations is not None
    assert tools["run_python"].annotations.destructive_hint

    small = structured(seen["small"])  # the channel pydantic-ai hands the model: the stdout is there
    assert (small["status"], small["exit_code"], small["file"]) == ("ok", 0, None)
    assert small["text"].startswith("42\n")
    assert "call_id" not in small
    assert "sandbox-runtime/call-id" not in small
    meta = call_meta(seen["small"])
    assert meta["conversation"].startswith("mcp-stdio-")
    assert meta["call-id"].startswith("call-")
    assert (meta["replaced"], meta["replayed"]) == (False, False)

    failed = structured(seen["failed"])
    assert seen["failed"].is_error
    assert failed["status"] == "error"
    assert "KeyError: 'amount'" in failed["text"]
    assert failed["error_path"].startswith("/mnt/results/errors/")
    assert failed["error"] == {  # the exception as fields, and where the model's own script raised it
        "type": "KeyError",
        "message": "'amount'",
        "file": failed["script_path"],
        "line": 2,
        "signal": None,
    }
    assert structured(seen["read"])["text"].startswith("alpha\nbeta")
    assert structured(seen["read"])["path"] == "/mnt/results/notes/a.txt"
    big = structured(seen["big"])
    assert big["file"]["path"].startswith("/mnt/results/spill/run_python-")
    assert big["file"]["path"] in big["text"]
    assert seen["bad"].is_error
    assert "PathOutsideResults" in structured(seen["bad"])["text"]
    for name, result in seen.items():
        if name != "tools":
            tool = tools["run_python" if name in ("small", "failed", "big") else "read_file"]
            assert tool.output_schema is not None
            Draft202012Validator(tool.output_schema).validate(result.structured_content)


def test_a_client_that_starts_a_server_process_per_call_keeps_one_conversation(
    runtime_factory: RuntimeFactory, served_state: Path
) -> None:
    async def one_call(tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        async with Client(stdio_params(served_state), read_timeout_seconds=120) as client:
            return await client.call_tool(tool, arguments)

    async def scenario() -> list[types.CallToolResult]:
        code = "print('\\n'.join(f'{i},lib{i}.so.0' for i in range(300)))"
        made = await one_call("run_python", {"code": code})
        path = structured(made)["file"]["path"]
        exported = await one_call("export_table", {"source": path, "format": "csv"})
        return [made, exported]

    made, exported = run_bounded(scenario)
    assert not exported.is_error, text_of(exported)
    assert call_meta(made)["conversation"] == call_meta(exported)["conversation"]
    runtime = runtime_factory(state_dir=served_state)
    assert [record.id for record in runtime.state.conversations()] == [call_meta(made)["conversation"]]


def test_cancelling_a_long_run_ends_it_in_the_sandbox_and_the_next_call_starts_at_once(
    runtime_factory: RuntimeFactory, served_state: Path
) -> None:
    script = (
        "import os, subprocess, sys, time\n"
        "open('/mnt/results/started', 'w').close()\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(5); "
        'open("/mnt/results/late", "w").close()\'], start_new_session=True)\n'
        "time.sleep(120)\n"
    )

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with Client(stdio_params(served_state), read_timeout_seconds=180) as client:
            warm = await client.call_tool("run_python", {"code": "print('warm')"})
            seen["conversation"] = call_meta(warm)["conversation"]
            host = runtime_factory(state_dir=served_state)
            results = host.conversation(seen["conversation"]).folders.results
            seen["gone_after_s"] = await cancel_a_long_run(client, host, seen["conversation"], script)
            began = time.monotonic()
            seen["after"] = await client.call_tool("run_python", {"code": "print('next')"})
            seen["next_call_s"] = time.monotonic() - began
            with anyio.move_on_after(6):  # longer than the child would have waited before writing
                while not (results / "late").exists():
                    await anyio.sleep(0.1)
            seen["late_exists"] = (results / "late").exists()
        return seen

    seen = run_bounded(scenario)
    assert seen["gone_after_s"] < 2.5  # every process of the cancelled run ended in the sandbox
    assert text_of(seen["after"]).startswith("next\n")
    assert seen["next_call_s"] < 5  # the conversation took the next call at once
    assert not seen["late_exists"]
    runtime = runtime_factory(state_dir=served_state)
    decisions = runtime.conversation(seen["conversation"]).decisions()
    cancelled = [d for d in decisions if "Cancelled by the caller" in d.text]
    assert len(cancelled) == 1, [d.text for d in decisions]
    assert cancelled[0].is_error
    statuses = [record.status for record in runtime.conversation(seen["conversation"]).calls()]
    assert statuses == ["ok", "cancelled", "ok"]


def test_a_long_run_reports_progress_every_second_to_a_client_that_asks(served_state: Path) -> None:
    reports: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, total, message))

    async def scenario() -> types.CallToolResult:
        async with Client(stdio_params(served_state), read_timeout_seconds=120) as client:
            code = "import time\nfor i in range(8):\n    print(i, flush=True)\n    time.sleep(0.5)\n"
            return await client.call_tool("run_python", {"code": code, "timeout_s": 30}, progress_callback=on_progress)

    result = run_bounded(scenario)
    assert not result.is_error, text_of(result)
    assert len(reports) >= 3, reports
    elapsed = [r[0] for r in reports]
    assert elapsed == sorted(elapsed)
    assert all(total == 30 for _, total, _ in reports)
    assert all(message and "bytes of output" in message for _, _, message in reports)


def test_a_stateless_http_request_that_goes_away_ends_its_run_in_the_sandbox(
    runtime_factory: RuntimeFactory, served_state: Path
) -> None:
    script = "open('/mnt/results/started', 'w').close()\nimport time\ntime.sleep(120)\n"

    async def scenario(url: str) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with (
            httpx2.AsyncClient(timeout=180) as http,
            Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as client,
        ):
            warm = await client.call_tool("run_python", {"code": "print('warm')"})
            seen["conversation"] = call_meta(warm)["conversation"]
            host = runtime_factory(state_dir=served_state)
            seen["gone_after_s"] = await cancel_a_long_run(client, host, seen["conversation"], script)
            seen["after"] = await client.call_tool("run_python", {"code": "print('next')"})
        return seen

    with http_server(served_state) as url:
        seen = run_bounded(scenario, url)
    assert seen["conversation"] == "mcp-http"
    assert seen["gone_after_s"] < 2.5
    assert text_of(seen["after"]).startswith("next\n")
    statuses = [r.status for r in runtime_factory(state_dir=served_state).conversation("mcp-http").calls()]
    assert statuses == ["ok", "cancelled", "ok"]
