"""Every test not marked ``docker`` runs with no Docker engine at all (the fake backend's part of the suite among
them): they run in a pytest of their own with the engine out of reach (``DOCKER_HOST`` names a socket that does
not exist) and ``CI`` set, so that a test that still reached for the engine would fail rather than skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
RUN_TIMEOUT_S = 900


def test_every_test_not_marked_docker_passes_with_no_engine_in_reach(tmp_path: Path) -> None:
    environment = {
        **os.environ,
        "CI": "true",
        "DOCKER_HOST": f"unix://{tmp_path}/no-engine-here.sock",
        "PYTEST_ADDOPTS": "",
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not docker"]
    command += ["--basetemp", str(tmp_path / "inner"), "--ignore", __file__, str(HERE)]
    try:
        done = subprocess.run(
            command, env=environment, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the engine-free part did not finish in {RUN_TIMEOUT_S} s: {exc.stdout!r}")
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in summary, summary
    assert "failed" not in summary, summary
    assert "error" not in summary, summary
