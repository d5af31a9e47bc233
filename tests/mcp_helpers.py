"""Helpers for tests that drive ``sandbox-runtime serve`` with the MCP SDK's own client."""

from __future__ import annotations

import base64
import io
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
import mcp_types as types
import openpyxl
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientRequestContext

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.cli.sample_data import SAMPLE_ORDER_COLUMNS
from sandbox_runtime.mcp.server import McpService
from tests.conftest import ENGINE_VARIABLES, SESSION, TEST_LABEL

T = TypeVar("T")
BUILTIN_TOOLS = [
    "run_python",
    "read_file",
    "write_file",
    "edit_file",
    "export_table",
    "render_table",
    "attach_file",
    "delegate_call",
]
SERVE_START_S = 60.0
SCENARIO_S = 300.0


def run_bounded(scenario: Callable[..., Awaitable[T]], *args: Any, limit_s: float = SCENARIO_S) -> T:
    """Run an async scenario to its end, failing it after ``limit_s`` seconds."""

    async def bounded() -> T:
        with anyio.fail_after(limit_s):
            return await scenario(*args)

    return anyio.run(bounded)


@asynccontextmanager
async def in_process_client(runtime: Runtime, **options: Any) -> AsyncIterator[Client]:
    """The MCP SDK's client of the server ``serve`` runs over stdio, on ``runtime``, in this process (the SDK's
    in-memory transport): for tests of what the server answers, where no transport is what is tested."""
    async with Client(McpService(runtime, transport="stdio").server, **options) as client:
        yield client


def serve_command(state_dir: Path, *serve_args: str, policy: Path | str | None = None) -> list[str]:
    """The command line of ``sandbox-runtime serve`` run by this interpreter."""
    command = [sys.executable, "-m", "sandbox_runtime.cli.main", "--state-dir", str(state_dir)]
    command += ["--label", f"{TEST_LABEL}={SESSION}"]  # cleaned up by label like every test sandbox
    if policy is not None:
        command += ["--policy", str(policy)]
    return [*command, "serve", *serve_args]


def server_environment() -> dict[str, str]:
    """The environment a client gives the stdio server it starts: ``PATH``, and each engine's address when it is
    set (a test with no engine has it name nothing, and so does the server it starts)."""
    engines = {variable: os.environ[variable] for variable in ENGINE_VARIABLES.values() if variable in os.environ}
    return {"PATH": os.environ.get("PATH", ""), **engines}


def stdio_params(state_dir: Path, *serve_args: str, policy: Path | str | None = None) -> StdioServerParameters:
    command = serve_command(state_dir, *serve_args, policy=policy)
    return StdioServerParameters(command=command[0], args=command[1:], env=server_environment())


@contextmanager
def serve_process(
    command: list[str], *, stdin: int = subprocess.DEVNULL, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str | None]]]:
    """``serve`` in a subprocess, its stderr echoed and put on a queue line by line (None once it closed); killed by
    pid if it still runs at the end, its pipes closed."""
    process = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            sys.stderr.write(f"[serve] {line}")
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        yield process, lines
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        reader.join(timeout=10)
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def line_starting(lines: queue.Queue[str | None], start: str, *, within_s: float = SERVE_START_S) -> str:
    """The rest of the first line of ``serve``'s stderr that starts with ``start`` (bounded)."""
    return line_matching(lines, re.escape(start), within_s=within_s).removeprefix(start).strip()


def line_matching(lines: queue.Queue[str | None], pattern: str, *, within_s: float = SERVE_START_S) -> str:
    """The first line of ``serve``'s stderr whose start matches ``pattern`` (bounded)."""
    deadline = time.monotonic() + within_s
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        if line is None:
            raise AssertionError(f"serve ended before it printed {pattern!r}")
        if re.match(pattern, line):
            return line


@contextmanager
def http_server(
    state_dir: Path,
    *serve_args: str,
    env: dict[str, str] | None = None,
    policy: Path | str | None = None,
    host: str = "127.0.0.1",
) -> Iterator[str]:
    """``serve --http HOST:0`` in a subprocess; yields the endpoint URL it printed; stops it by pid (SIGTERM, then
    SIGKILL). ``env`` is laid over this process's environment, without any token of its own (``env`` may give
    one)."""
    shown = f"[{host}]" if ":" in host else host
    command = serve_command(state_dir, "--http", f"{shown}:0", *serve_args, policy=policy)
    inherited = {key: value for key, value in os.environ.items() if key != "SANDBOX_RUNTIME_MCP_TOKEN"}
    with serve_process(command, env={**inherited, **(env or {})}) as (process, lines):
        try:
            yield line_starting(lines, "serving MCP at ")
        finally:
            stop_by_pid(process)


def stop_by_pid(process: subprocess.Popen[str]) -> None:
    """Stop a server this test started as a service manager does: SIGTERM, then SIGKILL after 30 s."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def links_of(result: types.CallToolResult) -> list[types.ResourceLink]:
    return [block for block in result.content if isinstance(block, types.ResourceLink)]


def structured(result: types.CallToolResult) -> dict[str, Any]:
    """The tool's structured result; it always repeats the text the model is given, whole."""
    assert isinstance(result.structured_content, dict)
    assert result.structured_content.get("text", text_of(result)) == text_of(result)
    return result.structured_content


def request_meta(values: dict[str, str]) -> types.RequestParamsMeta:
    """A request's ``_meta`` with this server's own keys (``sandbox-runtime/...``)."""
    # RequestParamsMeta is an open TypedDict (PEP 728 extra_items), which mypy does not support yet: to it, any key
    # beyond the declared ones is an error
    return cast(types.RequestParamsMeta, values)


def call_meta(result: types.CallToolResult) -> dict[str, Any]:
    """The call's metadata (``_meta`` of the result): call id, conversation, replaced, replayed, turn."""
    meta = dict(result.meta or {})
    return {key.removeprefix("sandbox-runtime/"): value for key, value in meta.items()}


XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


class Elicitations:
    """A client user who answers approval forms, and remembers what was asked."""

    def __init__(self, approve: bool) -> None:
        self.approve = approve
        self.messages: list[str] = []

    async def __call__(self, context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        assert params.requested_schema["required"] == ["approve"]
        self.messages.append(params.message)
        if self.approve:
            return types.ElicitResult(action="accept", content={"approve": True})
        return types.ElicitResult(action="decline")


async def query_export_attach(client: Client, user: Elicitations) -> dict[str, Any]:
    """The path-first walk every client should manage: query → spill → export from the path → attach."""
    queried = await client.call_tool("sql_query", {"query": "SELECT * FROM orders ORDER BY order_id"})
    assert not queried.is_error, text_of(queried)
    spill = structured(queried)["file"]
    assert (spill["rows"], spill["columns"], spill["format"]) == (360, list(SAMPLE_ORDER_COLUMNS), "table")
    assert spill["path"] in text_of(queried)
    (link,) = links_of(queried)
    assert (link.size, link.mime_type) == (spill["bytes"], "application/jsonl")
    read = (await client.read_resource(link.uri)).contents[0]
    assert isinstance(read, types.TextResourceContents)
    assert len(read.text.splitlines()) == 1 + 360

    exported = await client.call_tool(
        "export_table",
        {
            "source": spill["path"],
            "format": "xlsx",
            "columns": ["order_id", "customer", "total"],
            "sort": {"column": "total", "direction": "desc"},
            "filename": "top-orders.xlsx",
        },
    )
    assert not exported.is_error, text_of(exported)
    export = structured(exported)["file"]
    (xlsx_link,) = links_of(exported)
    assert (xlsx_link.mime_type, xlsx_link.size) == (XLSX, export["bytes"])
    blob = (await client.read_resource(xlsx_link.uri)).contents[0]
    assert isinstance(blob, types.BlobResourceContents)
    sheet = openpyxl.load_workbook(io.BytesIO(base64.b64decode(blob.blob)), read_only=True).active
    assert sheet is not None
    rows = list(sheet.iter_rows(values_only=True))
    assert rows[0] == ("order_id", "customer", "total")
    assert len(rows) == 361
    totals = [r[2] for r in rows[1:]]
    assert totals == sorted(totals, reverse=True)

    attached = await client.call_tool("attach_file", {"path": export["path"]})
    assert user.messages
    assert export["path"] in user.messages[-1]
    return {"attached": attached, "xlsx": base64.b64decode(blob.blob)}
