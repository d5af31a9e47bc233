"""Shared fixtures: a real Docker engine, the executor image, and runtimes cleaned up by label.

Every container a test makes carries ``io.sandbox-runtime.test=<this session>``; the session removes them all
at the end, even when a test failed. Without an engine the Docker tests are skipped, except when ``CI`` is set:
then they fail, so CI can never pass without running them.

Tests that never start a container use ``fake_runtime_factory`` (the shipped
:class:`~sandbox_runtime.sandbox.fake.backend.FakeBackend`: no engine at all). Every test that needs the engine
is marked ``docker`` here, and every other test runs with the engine out of reach (``DOCKER_HOST`` names a socket
that does not exist, for the test and the processes it starts): one that still reached for the engine would fail,
so ``pytest -m "not docker"`` is the part that runs on a machine with no engine.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import EngineUnavailable
from sandbox_runtime.policy import Policy, load_policy
from sandbox_runtime.sandbox.docker.backend import DockerBackend
from sandbox_runtime.sandbox.fake.backend import FakeBackend
from sandbox_runtime.sandbox.image import build_executor_image, executor_image_tag
from sandbox_runtime.sandbox.profile import LABEL_RUNTIME
from sandbox_runtime.store.quota import QuotaMode
from sandbox_runtime.store.safe_paths import ResultsRoot

TEST_LABEL = "io.sandbox-runtime.test"
SESSION = uuid.uuid4().hex[:12]
RuntimeFactory = Callable[..., Runtime]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the Docker engine (through any fixture) ``docker``."""
    for item in items:
        if "docker_backend" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.docker)


NO_ENGINE = "unix:///nonexistent/sandbox-runtime-tests-no-engine.sock"


@pytest.fixture(autouse=True)
def _engine_only_for_docker_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked docker gets no engine: a Docker client it (or a process it starts) makes cannot connect."""
    if request.node.get_closest_marker("docker") is None:
        monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)


def _runsc_installed(backend: DockerBackend) -> bool:
    return "runsc" in backend.engine_info().runtimes


@pytest.fixture(scope="session")
def docker_backend() -> Iterator[DockerBackend]:
    """The real engine; a missing engine fails the run under CI and skips Docker tests elsewhere."""
    try:
        backend = DockerBackend()
        backend.engine_info()
    except EngineUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the Docker engine is not reachable: {exc}")
        pytest.skip(f"no Docker engine: {exc}")
    yield backend
    for info in backend.list_containers({TEST_LABEL: SESSION}):
        backend.remove(info.id)
    backend.close()


@pytest.fixture(scope="session")
def executor_image(docker_backend: DockerBackend) -> str:
    """The executor image, built (offline when no registry answers) when it is missing."""
    return (
        build_executor_image(docker_backend).tag
        if not docker_backend.image_exists(executor_image_tag())
        else executor_image_tag()
    )


@pytest.fixture
def docker_runtime_factory(
    docker_backend: DockerBackend, executor_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeFactory]:
    """Make runtimes on the Docker engine on fresh state directories; every conversation they made is deleted
    afterwards."""
    made: list[Runtime] = []

    def make(policy: Policy | str = "default", state_dir: Path | None = None, **kwargs: Any) -> Runtime:
        options: dict[str, Any] = {
            "image": executor_image,
            "reap_interval_s": None,
            "retention_interval_s": None,
            **kwargs,
        }
        runtime = Runtime(
            state_dir or tmp_path_factory.mktemp("state"),
            policy,
            extra_labels={TEST_LABEL: SESSION},
            **options,
        )
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        _delete_everything(runtime)
    for info in docker_backend.list_containers({TEST_LABEL: SESSION, LABEL_RUNTIME: "1"}):
        docker_backend.remove(info.id)


def _delete_everything(runtime: Runtime) -> None:
    """Delete every conversation of the runtime (sandboxes, mounts, files), then close it."""
    for record in runtime.state.conversations():
        runtime.conversation(record.id).delete()
    # folders of conversations the state no longer knows (a test may forget one on purpose)
    for folder in sorted((runtime.state_dir / "conversations").glob("*")):
        mode: QuotaMode = "loop" if os.path.ismount(folder / "results") else "measured"
        runtime.store.delete(runtime.store.folders(folder.name, quota_mode=mode))
    runtime.close()


@pytest.fixture
def fake_runtime_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeFactory]:
    """Make runtimes on the fake backend (no engine; one backend for the test, so a second runtime re-attaches
    what the first started); every conversation they made is deleted afterwards."""
    backend = FakeBackend()
    made: list[Runtime] = []

    def make(policy: Policy | str = "default", state_dir: Path | None = None, **kwargs: Any) -> Runtime:
        options: dict[str, Any] = {"reap_interval_s": None, "retention_interval_s": None, **kwargs}
        runtime = Runtime(
            state_dir or tmp_path_factory.mktemp("state"), policy, backend=backend, image="fake", **options
        )
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        _delete_everything(runtime)
    for info in backend.list_containers({}):
        backend.remove(info.id)


@pytest.fixture
def runtime_factory(docker_runtime_factory: RuntimeFactory) -> RuntimeFactory:
    """The runtimes a test gets: on Docker (a module whose tests start no sandbox overrides this with
    ``fake_runtime_factory``)."""
    return docker_runtime_factory


@pytest.fixture
def runtime(runtime_factory: RuntimeFactory) -> Runtime:
    """A runtime under the default policy."""
    return runtime_factory()


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """An empty results folder on the host (no Docker needed)."""
    folder = tmp_path / "results"
    folder.mkdir()
    return folder


@pytest.fixture
def root(results: Path) -> ResultsRoot:
    """The results folder as the host code sees it: hostile below its top."""
    return ResultsRoot(results)


def policy_under(runtime: str, docker_backend: DockerBackend) -> Policy:
    """The default policy under runc, or under runsc where installed (required when CI is set)."""
    if runtime == "runc":
        return load_policy("default")
    if not _runsc_installed(docker_backend):
        if os.environ.get("CI"):
            pytest.fail("CI is set but runsc (gVisor) is not registered with the engine")
        pytest.skip("runsc (gVisor) is not registered with the Docker engine")
    return load_policy("gvisor")


@pytest.fixture(scope="session", params=["runc", "runsc"])
def containment_policy(request: pytest.FixtureRequest, docker_backend: DockerBackend) -> Policy:
    """The default policy under runc, and under runsc where installed (required when CI is set)."""
    return policy_under(request.param, docker_backend)


@pytest.fixture
def served_state(runtime_factory: RuntimeFactory, tmp_path: Path) -> Iterator[Path]:
    """A state directory for a ``sandbox-runtime serve`` subprocess; afterwards (passed or not) a runtime on it
    deletes every conversation the server made: sandboxes, mounts and files."""
    state = tmp_path / "state"
    yield state
    runtime_factory(state_dir=state)


def mounts_under(path: Path) -> list[str]:
    """What is mounted at or below ``path`` on this host (from /proc/self/mounts)."""
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines() if str(path) in line]
