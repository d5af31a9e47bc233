"""The Docker engine restarts in the middle of a run (SECURITY.md, Faults).

Stories: a host's conversation is running a script when the daemon stops (an upgrade, a crash, a restart by
hand). The call raises :class:`EngineLost` — an infrastructure failure, not the script's ``error`` — and files
the script wrote stay readable while the engine is down. Once the engine is started again (the way
scripts/setup.sh starts it), the conversation's next call works in a fresh sandbox, and nothing of the old one is
left: no container, no second quota mount, no container processes. An MCP client hears the same as a tool error
that names the cause, and the server goes on serving.

These tests stop and start a Docker engine of their own: a dockerd that scripts/start-engine.sh starts for this
module alone (its own data root, exec root, containerd and socket; our config file, no bridge:
:func:`tests.engine_services.private_dockerd`), with the executor image loaded into it from the machine's engine;
the runtimes and the MCP server are pointed at it by ``DOCKER_HOST``. So the suite's other workers keep using the
machine's engine meanwhile, and nothing waits for anything.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client

from sandbox_runtime.api.conversation import Conversation
from sandbox_runtime.errors import EngineLost, EngineUnavailable
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.docker.backend import DockerBackend
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION, LABEL_STATE_DIR
from tests.conftest import SESSION, TEST_LABEL, RuntimeFactory
from tests.engine_services import DOCKERD_STOP_WAIT_S, EngineService, private_dockerd
from tests.mcp_helpers import run_bounded, stdio_params, text_of

ENGINE_STOP_S = DOCKERD_STOP_WAIT_S
IMAGE_LOAD_TIMEOUT_S = 300
STARTED_WAIT_S = 60.0
# the script marks that it runs, then waits far longer than the test: only the engine's end can end it
LONG_RUN = "open('/mnt/results/started.txt', 'w').write('the run began')\nimport time\ntime.sleep(600)\n"


@pytest.fixture(scope="module")
def dockerd(
    docker_backend: DockerBackend, executor_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineService]:
    """This module's own engine, with the executor image in it (loaded from the machine's engine); removed, with
    everything in it, after the module's last test."""
    with private_dockerd(tmp_path_factory.mktemp("dockerd"), {TEST_LABEL: SESSION}) as service:
        _load_image(executor_image, docker_backend.engine_address, service.address)
        yield service


def _load_image(image: str, source: str, target: str) -> None:
    """``docker save`` from one engine piped into ``docker load`` on another."""
    with subprocess.Popen(["docker", "-H", source, "save", image], stdout=subprocess.PIPE) as save:
        load = subprocess.run(
            ["docker", "-H", target, "load"],
            stdin=save.stdout,
            capture_output=True,
            text=True,
            timeout=IMAGE_LOAD_TIMEOUT_S,
            check=False,
        )
        assert save.stdout is not None
        save.stdout.close()
    assert (save.returncode, load.returncode) == (0, 0), load.stderr


@pytest.fixture
def engine_pid(dockerd: EngineService, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[int]:
    """The engine the test may stop and start: this module's own, which the test's runtimes (and the servers it
    starts) use (running again afterwards, for their clean-up)."""
    monkeypatch.setenv("DOCKER_HOST", dockerd.address)
    yield dockerd.pid()
    dockerd.start_if_stopped(tmp_path / "engine.log")


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + STARTED_WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {STARTED_WAIT_S} s"
        time.sleep(0.05)


@contextlib.contextmanager
def engine_stopped_when(engine: EngineService, path: Path, pid: int, log: Path) -> Iterator[threading.Event]:
    """Stop the engine as soon as ``path`` exists (in a thread); the engine is started again on the way out,
    whatever happened. The event is set once the engine has stopped."""
    stopped = threading.Event()
    failures: list[BaseException] = []

    def stop() -> None:
        try:
            _wait_for(path)
            engine.stop(pid)
            stopped.set()
        except BaseException as exc:  # reported by the test's own thread below
            failures.append(exc)

    worker = threading.Thread(target=stop, daemon=True)
    worker.start()
    try:
        yield stopped
        worker.join(STARTED_WAIT_S + ENGINE_STOP_S)
        assert not failures, failures
    finally:
        worker.join(STARTED_WAIT_S + ENGINE_STOP_S)
        engine.start(log)


def _leftovers(container_id: str) -> list[str]:
    """Host processes that still name the container (its shim, runsc's sandbox and gofer)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                command = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if container_id in command:
                    found.append(f"{proc.name}: {command[:200]}")
    return found


def _loop_devices_of(image: Path) -> list[str]:
    done = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.splitlines()


def _sandboxes(conversation: Conversation) -> list[tuple[str, bool]]:
    labels = {
        TEST_LABEL: SESSION,
        LABEL_CONVERSATION: conversation.id,
        LABEL_STATE_DIR: str(conversation.runtime.state_dir.resolve()),
    }
    backend = DockerBackend()
    try:
        return [(info.id, info.running) for info in backend.list_containers(labels)]
    finally:
        backend.close()


def test_an_engine_restart_mid_run_is_an_infrastructure_failure_and_the_conversation_works_after_it(
    runtime_factory: RuntimeFactory, docker_policy: Policy, dockerd: EngineService, engine_pid: int, tmp_path: Path
) -> None:
    conversation = runtime_factory(docker_policy).conversation("engine-restart")
    assert conversation.run_python("print('before')").stdout == "before\n"
    old = conversation.sandbox()
    folders = conversation.folders
    results = folders.results
    with engine_stopped_when(dockerd, results / "started.txt", engine_pid, tmp_path / "engine.log") as stopped:
        with pytest.raises(EngineLost, match="went away while the command ran") as lost:
            conversation.call("run_python", {"code": LONG_RUN})
        assert stopped.wait(ENGINE_STOP_S), "the call ended before the engine did"
        # an infrastructure failure, not a result the model would read as its script's error
        assert "how it ended is unknown" in str(lost.value)
        # while the engine is down: what the sandbox wrote stays readable, and a run says the engine is missing
        read = conversation.call("read_file", {"path": "started.txt"})
        assert not read.is_error
        assert "the run began" in read.text
        with pytest.raises(EngineUnavailable):
            conversation.call("run_python", {"code": "print('while down')"})
    after = conversation.run_python("print('after')")
    assert (after.status, after.stdout) == ("ok", "after\n"), after.message
    new = conversation.sandbox()
    assert new.container_id != old.container_id
    assert _sandboxes(conversation) == [(new.container_id, True)]  # the old container is gone, not just stopped
    assert _leftovers(old.container_id) == []
    if folders.quota_mode == "loop":
        assert len(_loop_devices_of(folders.volume)) == 1  # the same volume, mounted once
    assert (results / "started.txt").read_text() == "the run began"
    assert conversation.run_python("print(open('/mnt/results/started.txt').read())").stdout == "the run began\n"


def test_an_mcp_client_hears_the_engines_restart_as_a_tool_error_and_the_server_goes_on(
    runtime_factory: RuntimeFactory, dockerd: EngineService, engine_pid: int, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    params = stdio_params(state)

    async def scenario() -> tuple[str, str]:
        async with Client(params, read_timeout_seconds=300) as client:
            ready = await client.call_tool("run_python", {"code": "print('ready')"})
            assert not ready.is_error, text_of(ready)
            (folder,) = (state / "conversations").iterdir()
            started = folder / "results" / "started.txt"
            with engine_stopped_when(dockerd, started, engine_pid, tmp_path / "engine.log"):
                lost = await client.call_tool("run_python", {"code": LONG_RUN})
            assert lost.is_error
            after = await client.call_tool("run_python", {"code": "print('after')"})
            assert not after.is_error, text_of(after)
            return text_of(lost), text_of(after)

    lost, after = run_bounded(scenario, limit_s=300)
    assert "EngineLost" in lost, lost
    assert "went away while the command ran" in lost, lost
    assert "after" in after
    runtime = runtime_factory(state_dir=state)  # and the server's conversation is deleted afterwards
    (record,) = runtime.state.conversations()
    (sandbox,) = _sandboxes(runtime.conversation_by_key(record.id))
    assert sandbox[1]  # one sandbox, running: the one the server started after the engine came back
