"""Podman's service restarts (an upgrade, a crash, a restart by hand) while a conversation is idle: Podman has no
daemon holding the sandboxes (each runs under its own ``conmon``), so the sandbox keeps running, and the next
call, once the service answers again, re-attaches it (its resident executor is started afresh); where a Docker
daemon restart ends every sandbox (``tests/test_engine_restart.py``).

The test stops and starts the service CI starts (``scripts/start-podman.sh``, its pid in
/run/podman/sandbox-runtime-podman.pid) and refuses to touch one this project did not start: outside CI it
skips, under CI it fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandbox_runtime.policy import load_policy
from sandbox_runtime.sandbox.podman import PodmanBackend
from tests.conftest import RuntimeFactory

PROJECT = Path(__file__).resolve().parent.parent
PID_FILE = Path("/run/podman/sandbox-runtime-podman.pid")
STOP_WAIT_S = 30.0


@pytest.fixture
def service_pid(podman_backend: PodmanBackend) -> int:
    """The Podman service may be stopped and started by this test: only the one this project started."""
    try:
        pid = int(PID_FILE.read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        argv = []
    if argv[1:3] != [b"system", b"service"]:
        reason = "the Podman service was not started by scripts/start-podman.sh"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)
    return pid


def _restart_service(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"the Podman service {pid} did not end within {STOP_WAIT_S} s"
        time.sleep(0.05)
    done = subprocess.run(
        ["bash", str(PROJECT / "scripts" / "start-podman.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_an_idle_sandbox_outlives_a_service_restart_and_the_next_call_reattaches_it(
    runtime_factory: RuntimeFactory, service_pid: int
) -> None:
    policy = load_policy("podman")
    runtime = runtime_factory(policy)
    conversation = runtime.conversation("service-restart")
    first = conversation.run_python("open('kept.txt', 'w').write('written before the restart')")
    assert first.status == "ok", first.message
    (before,) = runtime.state.live_sandboxes()

    _restart_service(service_pid)

    second = conversation.run_python("print(open('kept.txt').read())")
    assert (second.status, second.stdout) == ("ok", "written before the restart\n"), second.message
    (after,) = runtime.state.live_sandboxes()
    assert after.container_id == before.container_id  # the same sandbox, not a fresh one
