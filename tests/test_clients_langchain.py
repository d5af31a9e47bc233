"""LangChain's MCP adapter (``langchain-mcp-adapters``, in ``.venv-langchain``: it pins ``mcp<2``) in front of
``sandbox-runtime serve``, with its default session handling: a new MCP session for every tool call — over stdio, a
new server process. The paths a call hands the model must stay valid for the next call all the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sandbox_runtime.cli.sample_data import make_sample_database
from tests.client_helpers import (
    CALL_TIMEOUT_S,
    LANGCHAIN_PYTHON,
    WALKED_TOOLS,
    check_one_conversation_did_the_work,
    check_what_the_model_received,
    most_alive_at_once,
    require,
    run_driver,
    run_driver_with_stderr,
    sandboxes_of,
    server_env,
    watching_sandboxes,
)
from tests.conftest import EVERY_BACKEND_POLICIES, RuntimeFactory, Served
from tests.mcp_helpers import BUILTIN_TOOLS, http_server, serve_command

DRIVER = "tests.clients.langchain_driver"


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return make_sample_database(tmp_path / "shop.sqlite3", rows=360)


@pytest.fixture
def langchain_python() -> Path:
    return require(LANGCHAIN_PYTHON, "LangChain's MCP adapter (.venv-langchain)")


@pytest.mark.first
def test_langchain_starting_a_server_process_per_call_keeps_one_conversation_and_one_sandbox(
    runtime_factory: RuntimeFactory, served_state: Path, database: Path, langchain_python: Path
) -> None:
    command = serve_command(served_state, "--database", str(database))
    connection = {"transport": "stdio", "command": command[0], "args": command[1:], "env": server_env()}

    with watching_sandboxes(served_state) as sandbox_events:
        report, stderr = run_driver_with_stderr(
            langchain_python, DRIVER, {"connection": connection, "timeout_s": CALL_TIMEOUT_S}
        )

    # get_tools() and then every call had a server process of its own (each prints its tools when it starts)
    assert len(re.findall(r"^\d+ tools: run_python", stderr, re.MULTILINE)) == 1 + len(WALKED_TOOLS)
    assert sorted(report["offered"]) == sorted([*BUILTIN_TOOLS, "sql_query"])
    check_what_the_model_received(report)
    assert report["received"][0]["raw"]["status"] == "success"
    check_one_conversation_did_the_work(runtime_factory, served_state)
    assert len(sandboxes_of(served_state)) <= 1, "the walk left more than one sandbox for its conversation"
    # each server process ends its sandbox when its client goes; the next one starts afresh: never two at once
    assert sandbox_events, "no sandbox was seen starting"
    assert most_alive_at_once(sandbox_events) == 1, sandbox_events


@pytest.mark.process
@pytest.mark.parametrize("engine_policy", EVERY_BACKEND_POLICIES)
def test_langchain_over_http_with_a_session_per_call_keeps_the_paths_it_was_given(
    served: Served, database: Path, langchain_python: Path
) -> None:
    with http_server(served.state, "--database", str(database), policy=served.policy) as url:
        connection = {"transport": "streamable_http", "url": url, "timeout": CALL_TIMEOUT_S}
        report = run_driver(langchain_python, DRIVER, {"connection": connection, "timeout_s": CALL_TIMEOUT_S})

    check_what_the_model_received(report)
    check_one_conversation_did_the_work(served.runtimes, served.state)
