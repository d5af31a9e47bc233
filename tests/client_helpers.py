"""Helpers for the tests that drive ``sandbox-runtime serve`` with third-party MCP clients.

Each client lives where it installs (``scripts/setup-dev.sh`` puts them there): pydantic-ai beside the project in
``.venv`` (else ``.venv-pydantic-ai``), LangChain's adapter in ``.venv-langchain`` (it pins ``mcp<2``), the MCP
Inspector in ``.npm-tools``. A client in another environment runs one of the driver scripts of
``tests/clients/`` as a subprocess, which prints its report as JSON. A missing environment skips its test, except
when ``CI`` is set: then it fails, so CI never passes without running them (as for Docker in ``conftest.py``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import docker
import openpyxl
import pytest

from sandbox_runtime.sandbox.docker.backend import DockerBackend
from sandbox_runtime.sandbox.labels import LABEL_STATE_DIR
from tests.clients.walk import (
    EXCEPTION_LINE,
    EXPORT_COLUMNS,
    EXPORT_FILENAME,
    NOTE_TEXT,
    STDOUT_LINE,
)
from tests.conftest import SESSION, TEST_LABEL, RuntimeFactory
from tests.mcp_helpers import run_bounded, server_environment

REPO = Path(__file__).resolve().parents[1]
LANGCHAIN_PYTHON = REPO / ".venv-langchain" / "bin" / "python"
PYDANTIC_AI_PYTHON = REPO / ".venv-pydantic-ai" / "bin" / "python"
INSPECTOR = REPO / ".npm-tools" / "node_modules" / ".bin" / "mcp-inspector"
SETUP_HINT = "run scripts/setup-dev.sh"
DRIVER_TIMEOUT_S = 300.0
CALL_TIMEOUT_S = 120.0
WALKED_TOOLS = ["sql_query", "export_table", "attach_file", "run_python", "run_python", "run_python", "read_file"]
ORDERS = 360


def missing_environment(reason: str) -> NoReturn:
    """Skip the test for a client that is not installed here; under CI, fail it."""
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {reason}")
    pytest.skip(reason)


def require(path: Path, what: str) -> Path:
    if not path.exists():
        missing_environment(f"{what} is not installed ({path.relative_to(REPO)} is missing; {SETUP_HINT})")
    return path


def server_env() -> dict[str, str]:
    """The environment a client gives the stdio server it starts (as ``mcp_helpers.stdio_params`` does)."""
    return server_environment()


def run_driver(python: Path, module: str, request: dict[str, Any], timeout_s: float = DRIVER_TIMEOUT_S) -> Any:
    """``python -m module`` from the repository root, ``request`` as JSON on stdin; its JSON report (last line)."""
    return run_driver_with_stderr(python, module, request, timeout_s)[0]


def run_driver_with_stderr(
    python: Path, module: str, request: dict[str, Any], timeout_s: float = DRIVER_TIMEOUT_S
) -> tuple[Any, str]:
    """:func:`run_driver`, and what the driver and the servers it started wrote to stderr."""
    done = subprocess.run(
        [str(python), "-m", module],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout_s,
        check=False,
    )
    sys.stderr.write(done.stderr)  # the servers' stderr too: pytest shows it when the test fails
    if done.returncode != 0:
        raise AssertionError(f"{module} exited with {done.returncode}:\n{done.stderr[-6000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def pydantic_ai_walk(command: list[str]) -> dict[str, Any]:
    """The scripted walk through pydantic-ai's MCP client: in this process when pydantic-ai is installed beside
    the project, else in ``.venv-pydantic-ai`` by the driver script."""
    if importlib.util.find_spec("pydantic_ai") is not None and importlib.util.find_spec("fastmcp") is not None:
        driver = importlib.import_module("tests.clients.pydantic_ai_driver")
        report: dict[str, Any] = run_bounded(driver.walk, command, server_env(), CALL_TIMEOUT_S)
        return report
    if PYDANTIC_AI_PYTHON.exists():
        request = {"command": command, "env": server_env(), "timeout_s": CALL_TIMEOUT_S}
        walked: dict[str, Any] = run_driver(PYDANTIC_AI_PYTHON, "tests.clients.pydantic_ai_driver", request)
        return walked
    return missing_environment(
        f"pydantic-ai's MCP client is not installed (neither pydantic_ai in .venv nor .venv-pydantic-ai; {SETUP_HINT})"
    )


def _escaped(text: str) -> str:
    return json.dumps(text)[1:-1]


def contains(text: str, expected: str) -> bool:
    """``expected`` is in ``text`` as it is, or as a JSON string would carry it (a client may hand JSON)."""
    return expected in text or _escaped(expected) in text


def _shown(report: dict[str, Any]) -> str:
    return json.dumps(report["received"], indent=1)[:12_000]


def check_what_the_model_received(report: dict[str, Any]) -> None:
    """The walk went to its end, and each return the model was handed carries what it needed."""
    assert report["stopped"] is None, f"the model could not go on: {report['stopped']}\n{_shown(report)}"
    assert [c["tool"] for c in report["calls"]] == WALKED_TOOLS
    assert [r["tool"] for r in report["received"]] == WALKED_TOOLS, _shown(report)
    queried, exported, attached, printed, failed, noted, read = report["received"]

    # the rows went to a file: the model got its path (and exported from it) and its shape (under the inline cap
    # it sees the rows above that too)
    assert not queried["is_error"], queried["text"]
    assert "/mnt/results/spill/" in queried["text"]
    assert str(ORDERS) in queried["text"], queried["text"]
    source = report["calls"][1]["arguments"]["source"]
    assert source.startswith("/mnt/results/spill/")
    assert source in queried["text"]

    assert not exported["is_error"], exported["text"]
    assert report["calls"][2]["arguments"]["path"] in exported["text"]
    assert report["calls"][2]["arguments"]["path"].endswith(EXPORT_FILENAME)
    assert not attached["is_error"], attached["text"]
    assert EXPORT_FILENAME in attached["text"]

    assert not printed["is_error"], printed["text"]
    assert STDOUT_LINE in printed["text"]
    assert failed["is_error"], failed["text"]
    assert EXCEPTION_LINE in failed["text"], failed["text"]
    assert not noted["is_error"], noted["text"]
    assert not read["is_error"], read["text"]
    assert contains(read["text"], NOTE_TEXT), read["text"]


def check_one_conversation_did_the_work(runtime_factory: RuntimeFactory, state: Path) -> str:
    """From the host: the whole walk was one conversation, and the file the user was given is the export —
    every order, the chosen columns, sorted by total. Returns the conversation's id."""
    runtime = runtime_factory(state_dir=state)
    records = runtime.state.conversations()
    assert len(records) == 1, f"the walk made {len(records)} conversations: {[r.id for r in records]}"
    (record,) = records
    (attachment,) = runtime.conversation_by_key(record.id).attachments()
    assert attachment.filename == EXPORT_FILENAME
    sheet = openpyxl.load_workbook(io.BytesIO(Path(attachment.host_path).read_bytes()), read_only=True).active
    assert sheet is not None
    rows = list(sheet.iter_rows(values_only=True))
    assert list(rows[0]) == EXPORT_COLUMNS
    assert len(rows) == 1 + ORDERS
    totals: list[Any] = [row[2] for row in rows[1:]]
    assert totals == sorted(totals, reverse=True)
    return record.id


def sandboxes_of(state: Path) -> list[str]:
    """Ids of this test session's sandbox containers made for the state directory ``state``."""
    backend = DockerBackend()
    try:
        return [c.id for c in backend.list_containers({TEST_LABEL: SESSION, LABEL_STATE_DIR: str(state.resolve())})]
    finally:
        backend.close()


@contextlib.contextmanager
def watching_sandboxes(state: Path) -> Iterator[list[tuple[str, str]]]:
    """Docker's ``create``/``destroy`` events, in order, of this session's sandboxes for ``state`` while the block
    runs, as (action, container id). Events still in flight when the block ends may be missed (never invented)."""
    client = docker.from_env()
    labels = [f"{TEST_LABEL}={SESSION}", f"{LABEL_STATE_DIR}={state.resolve()}"]
    stream = client.api.events(filters={"type": "container", "label": labels}, decode=True)
    seen: list[tuple[str, str]] = []

    def pump() -> None:
        with contextlib.suppress(Exception):  # closing the stream ends the iteration with an error
            for event in stream:
                if event.get("Action") in ("create", "destroy"):
                    seen.append((str(event["Action"]), str(event["id"])))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        stream.close()
        reader.join(timeout=10)
        client.close()


def most_alive_at_once(events: list[tuple[str, str]]) -> int:
    alive: set[str] = set()
    most = 0
    for action, container in events:
        if action == "create":
            alive.add(container)
        else:
            alive.discard(container)
        most = max(most, len(alive))
    return most
