"""Podman's service restarts (an upgrade, a crash, a restart by hand) while a conversation is idle: Podman has no
daemon holding the sandboxes (each runs under its own ``conmon``), so the sandbox keeps running, and the next
call, once the service answers again, re-attaches it (its resident executor is started afresh); where a Docker
daemon restart ends every sandbox (``tests/test_engine_restart.py``).

The test stops and starts the service CI starts (``scripts/start-podman.sh``, its pid in
/run/podman/sandbox-runtime-podman.pid: :data:`tests.engine_services.PODMAN_SERVICE`) and refuses to touch one
this project did not start: outside CI it skips, under CI it fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_runtime.policy import load_policy
from sandbox_runtime.sandbox.podman import PodmanBackend
from tests.conftest import RuntimeFactory
from tests.engine_services import PODMAN_SERVICE

pytestmark = pytest.mark.engine_restart  # the engines are this module's alone while it runs (tests/parallel.py)


@pytest.fixture
def service_pid(podman_backend: PodmanBackend) -> int:
    """The Podman service may be stopped and started by this test: only the one this project started."""
    return PODMAN_SERVICE.our_pid_or_skip()


def test_an_idle_sandbox_outlives_a_service_restart_and_the_next_call_reattaches_it(
    runtime_factory: RuntimeFactory, service_pid: int, tmp_path: Path
) -> None:
    policy = load_policy("podman")
    runtime = runtime_factory(policy)
    conversation = runtime.conversation("service-restart")
    first = conversation.run_python("open('kept.txt', 'w').write('written before the restart')")
    assert first.status == "ok", first.message
    (before,) = runtime.state.live_sandboxes()

    PODMAN_SERVICE.restart(service_pid, tmp_path / "podman.log")

    second = conversation.run_python("print(open('kept.txt').read())")
    assert (second.status, second.stdout) == ("ok", "written before the restart\n"), second.message
    (after,) = runtime.state.live_sandboxes()
    assert after.container_id == before.container_id  # the same sandbox, not a fresh one
