"""The MCP Inspector's scripted CLI (``mcp-inspector --cli``, from npm in ``.npm-tools``) in front of
``sandbox-runtime serve`` over stdio: what a person checking the server with the reference tool sees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime.cli.sample_data import make_sample_database
from tests.client_helpers import INSPECTOR, REPO, require, server_env
from tests.clients.walk import STDOUT_CODE, STDOUT_LINE
from tests.conftest import EVERY_BACKEND_POLICIES, Served
from tests.mcp_helpers import BUILTIN_TOOLS, serve_command

INSPECTOR_TIMEOUT_S = 120.0
ANNOTATION_HINTS = {"readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"}


@pytest.fixture
def inspector() -> Path:
    return require(INSPECTOR, "the MCP Inspector (npm @modelcontextprotocol/inspector in .npm-tools)")


def inspect(inspector: Path, server: list[str], *method: str) -> Any:
    """``mcp-inspector --cli --method ... -- <server command>``; the JSON it prints. The server gets the environment
    every client here gives it."""
    environment = [option for item in server_env().items() for option in ("-e", "=".join(item))]
    done = subprocess.run(
        [str(inspector), "--cli", *environment, "--method", *method, "--", *server],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=INSPECTOR_TIMEOUT_S,
        check=False,
    )
    sys.stderr.write(done.stderr)
    assert done.returncode == 0, f"the Inspector exited with {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


@pytest.mark.process
def test_the_inspector_lists_every_tool_with_a_title_and_annotations(
    inspector: Path, fake_served_state: Path, fake_policy_file: Path, tmp_path: Path
) -> None:
    database = make_sample_database(tmp_path / "shop.sqlite3", rows=10)
    server = serve_command(fake_served_state, "--database", str(database), policy=fake_policy_file)

    listed = inspect(inspector, server, "tools/list")

    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert list(tools) == [*BUILTIN_TOOLS, "sql_query"]
    for name, tool in tools.items():
        assert isinstance(tool.get("title"), str), f"{name} has no title: {tool}"
        assert tool["title"].strip(), f"{name} has an empty title"
        annotations = tool.get("annotations")
        assert isinstance(annotations, dict), f"{name} has no annotations: {tool}"
        assert ANNOTATION_HINTS & set(annotations), f"{name} has no hints: {annotations}"
        assert all(isinstance(annotations[h], bool) for h in ANNOTATION_HINTS & set(annotations))
    assert tools["read_file"]["annotations"]["readOnlyHint"] is True
    assert tools["sql_query"]["annotations"]["readOnlyHint"] is True
    assert tools["run_python"]["annotations"]["readOnlyHint"] is False


@pytest.mark.process
@pytest.mark.parametrize("engine_policy", EVERY_BACKEND_POLICIES)
def test_the_inspector_calls_run_python_and_shows_its_stdout_first(inspector: Path, served: Served) -> None:
    called = inspect(
        inspector,
        serve_command(served.state, policy=served.policy),
        "tools/call",
        "--tool-name",
        "run_python",
        "--tool-arg",
        f"code={STDOUT_CODE}",
    )

    assert called["isError"] is False
    first = called["content"][0]
    assert first["type"] == "text"
    assert first["text"].startswith(STDOUT_LINE)
