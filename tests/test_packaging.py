"""The core Python API installs and runs without the ``mcp`` extra (the MCP SDK and the HTTP server stack).

A host whose framework pins another ``mcp`` major embeds the runtime without it. Instead of a second venv, each
check runs this interpreter in a subprocess whose import system refuses every module of the extra, as if it
were not installed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox_runtime.sandbox.docker.backend import DockerBackend

# the top-level modules of the extra's packages (mcp, mcp-types, anyio, httpx2, starlette, uvicorn) and of the
# SDK's own HTTP dependencies
REFUSED = ("mcp", "mcp_types", "uvicorn", "starlette", "sse_starlette", "anyio", "httpx2", "httpcore2")

REFUSING_FINDER = textwrap.dedent(
    f"""
    import sys

    REFUSED = {REFUSED!r}


    class RefuseTheMcpExtra:
        '''A meta path finder that makes the mcp extra look uninstalled.'''

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in REFUSED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None


    sys.meta_path.insert(0, RefuseTheMcpExtra())
    """
)


def without_mcp(code: str, *, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in this interpreter with the mcp extra refused."""
    return subprocess.run(
        [sys.executable, "-c", REFUSING_FINDER + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        check=False,
    )


def cli_without_mcp(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return without_mcp(
        f"import sys\nfrom sandbox_runtime.cli.main import main\nsys.exit(main({list(args)!r}))\n", cwd=cwd
    )


@pytest.mark.process
def test_the_finder_really_refuses_the_extra(tmp_path: Path) -> None:
    done = without_mcp("import mcp\n", cwd=tmp_path)
    assert done.returncode == 1
    assert "ModuleNotFoundError: No module named 'mcp'" in done.stderr


@pytest.mark.process
def test_the_public_api_and_every_core_module_import_without_the_mcp_extra(tmp_path: Path) -> None:
    done = without_mcp(
        """
        import importlib
        import pkgutil

        import sandbox_runtime
        from sandbox_runtime import *  # noqa: F403  (the star import of __all__ is under test)
        from sandbox_runtime import Runtime, TableStream, ToolCall

        core = [
            info.name
            for info in pkgutil.walk_packages(sandbox_runtime.__path__, "sandbox_runtime.")
            # the MCP layer needs the mcp extra, each framework adapter its framework's extra
            if not info.name.startswith(("sandbox_runtime.mcp", "sandbox_runtime._data", "sandbox_runtime.adapters."))
        ]
        for name in core:
            importlib.import_module(name)
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in REFUSED)
        assert not loaded, loaded
        print(len(core), "core modules")
        """,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[0]) >= 20


def test_the_cli_works_without_the_mcp_extra_and_serve_says_what_to_install(
    tmp_path: Path, docker_backend: DockerBackend
) -> None:
    del docker_backend  # `ls` asks the engine for the sandboxes
    version = cli_without_mcp("--version", cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("sandbox-runtime ")

    state = tmp_path / "state"
    listed = cli_without_mcp("--state-dir", str(state), "ls", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []

    for serve in (["serve"], ["serve", "--http", "127.0.0.1:0"]):
        refused = cli_without_mcp("--state-dir", str(tmp_path / "served"), *serve, cwd=tmp_path)
        assert refused.returncode == 2
        (line,) = refused.stderr.splitlines()  # one line, no traceback
        assert "pip install 'sandbox-runtime[mcp]'" in line
        assert line.startswith("error: serve needs the mcp extra")
        assert not (tmp_path / "served").exists()  # nothing started


def test_the_mcp_stack_is_an_extra_and_dev_pulls_it_in() -> None:
    metadata = importlib.metadata.metadata("sandbox-runtime")
    assert {"mcp", "dev"} <= set(metadata.get_all("Provides-Extra") or [])
    by_extra: dict[str, set[str]] = {}
    for requirement in metadata.get_all("Requires-Dist") or []:
        name = re.match(r"[A-Za-z0-9._-]+(\[[^]]*\])?", requirement)
        extra = re.search(r"""extra == ["']([^"']+)["']""", requirement)
        assert name is not None
        by_extra.setdefault(extra.group(1) if extra else "", set()).add(name.group(0).lower())
    assert by_extra["mcp"] == {
        "mcp",
        "anyio",
        "httpx2",
        "starlette",
        "uvicorn",
        "pyjwt[crypto]",
        "opentelemetry-sdk",  # serve exports traces when OTEL_* asks; the core needs only the API
        "opentelemetry-exporter-otlp-proto-http",
    }
    assert {"prometheus-client", "opentelemetry-api"} <= by_extra[""]  # Runtime.metrics and the spans, always
    assert not by_extra[""] & {"mcp", "mcp-types", "anyio", "httpx2", "starlette", "uvicorn"}
    assert "sandbox-runtime[mcp]" in by_extra["dev"]
