"""Podman's service restarts (an upgrade, a crash, a restart by hand) while a conversation is idle: Podman has no
daemon holding the sandboxes (each runs under its own ``conmon``), so the sandbox keeps running, and the next
call, once the service answers again, re-attaches it (its resident executor is started afresh); where a Docker
daemon restart ends every sandbox (``tests/test_engine_restart.py``).

The test stops and starts a Podman service of its own: a ``podman system service`` on Podman's usual storage that
scripts/start-podman.sh starts for this module alone (its own socket and pid file, our containers.conf settings:
:func:`tests.engine_services.private_podman_service`); the runtime is pointed at it by ``CONTAINER_HOST``. So the
suite's other workers keep using the machine's service meanwhile, and nothing waits for anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_runtime.policy import load_policy
from sandbox_runtime.sandbox.podman import PodmanBackend
from tests.conftest import SESSION, TEST_LABEL, RuntimeFactory
from tests.engine_services import EngineService, private_podman_service


@pytest.fixture(scope="module")
def podman_service(
    podman_backend: PodmanBackend, podman_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineService]:
    """This module's own Podman service (the executor image is in the storage it shares with the machine's);
    stopped after the module's last test."""
    with private_podman_service(tmp_path_factory.mktemp("podman"), {TEST_LABEL: SESSION}) as service:
        yield service


@pytest.fixture
def service_pid(podman_service: EngineService, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[int]:
    """The service the test may stop and start: this module's own, which the test's runtimes use (running again
    afterwards, for their clean-up)."""
    monkeypatch.setenv("CONTAINER_HOST", podman_service.address)
    yield podman_service.pid()
    podman_service.start_if_stopped(tmp_path / "podman.log")


def test_an_idle_sandbox_outlives_a_service_restart_and_the_next_call_reattaches_it(
    runtime_factory: RuntimeFactory, podman_service: EngineService, service_pid: int, tmp_path: Path
) -> None:
    policy = load_policy("podman")
    runtime = runtime_factory(policy)
    conversation = runtime.conversation("service-restart")
    first = conversation.run_python("open('kept.txt', 'w').write('written before the restart')")
    assert first.status == "ok", first.message
    (before,) = runtime.state.live_sandboxes()

    podman_service.restart(service_pid, tmp_path / "podman.log")

    second = conversation.run_python("print(open('kept.txt').read())")
    assert (second.status, second.stdout) == ("ok", "written before the restart\n"), second.message
    (after,) = runtime.state.live_sandboxes()
    assert after.container_id == before.container_id  # the same sandbox, not a fresh one
