"""pydantic-ai's MCP client in front of ``sandbox-runtime serve`` over stdio, its model a scripted
``FunctionModel`` (no LLM) that picks each call from what the previous one returned and records what it read."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_runtime.cli.sample_data import make_sample_database
from tests.client_helpers import (
    check_one_conversation_did_the_work,
    check_what_the_model_received,
    pydantic_ai_walk,
)
from tests.conftest import EVERY_BACKEND_POLICIES, Served
from tests.mcp_helpers import BUILTIN_TOOLS, serve_command


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return make_sample_database(tmp_path / "shop.sqlite3", rows=360)


@pytest.mark.process
@pytest.mark.parametrize("engine_policy", EVERY_BACKEND_POLICIES)
def test_a_pydantic_ai_agent_exports_query_rows_by_path_and_its_model_reads_stdout_errors_and_files(
    served: Served, database: Path
) -> None:
    report = pydantic_ai_walk(serve_command(served.state, "--database", str(database), policy=served.policy))

    assert sorted(report["offered"]) == sorted([*BUILTIN_TOOLS, "sql_query"])  # the model was offered every tool
    check_what_the_model_received(report)
    assert report["output"] == "Here is your spreadsheet."
    check_one_conversation_did_the_work(served.runtimes, served.state)
