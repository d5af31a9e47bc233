"""Shared fixtures: real engines (Docker; Podman for the tests that name it), the executor image in each, and
runtimes cleaned up by label.

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

import functools
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import EngineUnavailable
from sandbox_runtime.models import QuotaMode
from sandbox_runtime.policy import Policy, StatePolicy, load_policy
from sandbox_runtime.sandbox.backend import SandboxBackend
from sandbox_runtime.sandbox.docker.backend import DockerBackend
from sandbox_runtime.sandbox.fake.backend import FakeBackend
from sandbox_runtime.sandbox.image import build_executor_image, executor_image_tag
from sandbox_runtime.sandbox.labels import LABEL_RUNTIME
from sandbox_runtime.sandbox.podman.backend import PodmanBackend
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.state.location import open_engine
from sandbox_runtime.store.safe_paths import ResultsRoot
from tests.fast_loop import mark_fast
from tests.parallel import one_at_a_time
from tests.postgres_cluster import PostgresCluster

# postgres_cluster (one per session) and postgres_url (a fresh database); the fast loop; the longest tests first
pytest_plugins = ["tests.postgres_cluster", "tests.fast_loop", "tests.parallel"]

TEST_LABEL = "io.sandbox-runtime.test"
SESSION = uuid.uuid4().hex[:12]
RuntimeFactory = Callable[..., Runtime]


# the engines the tests start sandboxes on: each one's backend fixture, and the variable its client reads
ENGINE_FIXTURES = {"docker": "docker_backend", "podman": "podman_backend"}
ENGINE_VARIABLES = {"docker": "DOCKER_HOST", "podman": "CONTAINER_HOST"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses an engine (through any fixture) with that engine's name, and one that uses the
    PostgreSQL server ``postgresql``; then the rest, with no process of its own either, ``fast``."""
    for item in items:
        for engine, fixture in ENGINE_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(getattr(pytest.mark, engine))
        if "postgres_cluster" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("postgresql"):
            item.add_marker(pytest.mark.postgresql)
    mark_fast(items)


NO_ENGINE = "unix:///nonexistent/sandbox-runtime-tests-no-engine.sock"


@pytest.fixture(autouse=True)
def _engine_only_for_engine_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked with an engine gets no such engine: a client it (or a process it starts) makes cannot
    connect."""
    for engine, variable in ENGINE_VARIABLES.items():
        if request.node.get_closest_marker(engine) is None:
            monkeypatch.setenv(variable, NO_ENGINE)


def _runsc_installed(backend: DockerBackend) -> bool:
    return "runsc" in backend.engine_info().runtimes


Engine = TypeVar("Engine", bound=DockerBackend)


def _engine(backend_class: type[Engine]) -> Iterator[Engine]:
    """A real engine for the session; one that is missing fails the run under CI and skips its tests elsewhere.
    Afterwards every container the session made on it is removed."""
    try:
        backend = backend_class()
        backend.engine_info()
    except EngineUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the {backend_class.name} engine is not reachable: {exc}")
        pytest.skip(f"no {backend_class.name} engine: {exc}")
    yield backend
    for info in backend.list_containers({TEST_LABEL: SESSION}):
        backend.remove(info.id)
    backend.close()


def _image_on(backend: DockerBackend, temp: pytest.TempPathFactory) -> str:
    """The executor image in this engine's store, built (offline when no registry answers) when it is missing, by one
    worker at a time."""
    tag = executor_image_tag()
    with one_at_a_time(temp, f"image-{backend.name}"):
        return tag if backend.image_exists(tag) else build_executor_image(backend).tag


@pytest.fixture(scope="session")
def docker_backend() -> Iterator[DockerBackend]:
    """The Docker engine."""
    yield from _engine(DockerBackend)


@pytest.fixture(scope="session")
def podman_backend() -> Iterator[PodmanBackend]:
    """The Podman service (``CONTAINER_HOST``, or its usual socket, where ``scripts/start-podman.sh`` starts it)."""
    yield from _engine(PodmanBackend)


@pytest.fixture(scope="session")
def executor_image(docker_backend: DockerBackend, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The executor image on Docker."""
    return _image_on(docker_backend, tmp_path_factory)


@pytest.fixture(scope="session")
def podman_image(podman_backend: PodmanBackend, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The executor image on Podman."""
    return _image_on(podman_backend, tmp_path_factory)


@pytest.fixture
def engine_policy() -> str:
    """The built-in policy a test's runtimes (and the ``serve`` it starts) use when it names none: Docker's default.
    A test that must pass on every backend is parametrised with :data:`EVERY_BACKEND_POLICIES` instead."""
    return "default"


@pytest.fixture
def docker_runtime_factory(
    request: pytest.FixtureRequest,
    docker_backend: DockerBackend,
    engine_policy: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RuntimeFactory]:
    """Make runtimes on a real engine on fresh state directories: Docker, or the engine the policy names
    (``podman``); every conversation they made is deleted afterwards. (An ``engine_policy`` of a store,
    ``default@postgresql``, names the policy before the ``@``: :func:`served` points its runtimes at the store.)"""
    engine_policy = engine_policy.partition("@")[0]
    made: list[Runtime] = []
    engines: dict[str, tuple[DockerBackend, str]] = {}

    def engine_of(policy: Policy | str) -> tuple[DockerBackend, str]:
        """The engine a policy names, and the executor image there (fixtures asked for once, before teardown)."""
        engine = (load_policy(policy) if isinstance(policy, str) else policy).sandbox.backend
        if engine not in engines:
            image_fixture = "executor_image" if engine == "docker" else f"{engine}_image"
            engines[engine] = request.getfixturevalue(ENGINE_FIXTURES[engine]), request.getfixturevalue(image_fixture)
        return engines[engine]

    engines["docker"] = docker_backend, request.getfixturevalue("executor_image")
    engine_of(engine_policy)  # the teardown's runtimes (``served_state``) are made on it

    def make(policy: Policy | str | None = None, state_dir: Path | None = None, **kwargs: Any) -> Runtime:
        policy = engine_policy if policy is None else policy
        options: dict[str, Any] = {
            "image": engine_of(policy)[1],
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
    for backend, _image in engines.values():
        for info in backend.list_containers({TEST_LABEL: SESSION, LABEL_RUNTIME: "1"}):
            backend.remove(info.id)


def self_checked(runtime: Runtime) -> Runtime:
    """The runtime once its fail-closed self-check passed (the canary runs once per process per sandbox
    configuration, as for every runtime); runsc that this host refuses skips the test, or fails it when CI is set."""
    report = runtime.manager.self_check()
    if not report.ok and runtime.policy.sandbox.runtime == "runsc" and not os.environ.get("CI"):
        pytest.skip(f"runsc is registered, but the runtime refuses it on this host: {report.summary()}")
    assert report.ok, report.summary()
    return runtime


def _delete_everything(runtime: Runtime) -> None:
    """Delete every conversation of the runtime (sandboxes, mounts, files), then close it."""
    for record in runtime.state.conversations():
        runtime.conversation_by_key(record.id).delete()
    # folders of conversations the state no longer knows (a test may forget one on purpose)
    for folder in sorted((runtime.state_dir / "conversations").glob("*")):
        mode: QuotaMode = "loop" if os.path.ismount(folder / "results") else "measured"
        runtime.store.delete(runtime.store.folders(folder.name, quota_mode=mode))
    runtime.close()


@pytest.fixture
def fake_backend() -> FakeBackend:
    """The fake backend of a test: every runtime ``fake_runtime_factory`` makes uses it."""
    return FakeBackend()


@pytest.fixture
def fake_runtime_factory(
    fake_backend: FakeBackend, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeFactory]:
    """Make runtimes on the fake backend (no engine; one backend for the test, so a second runtime re-attaches
    what the first started); every conversation they made is deleted afterwards."""
    made: list[Runtime] = []

    def make(policy: Policy | str = "default", state_dir: Path | None = None, **kwargs: Any) -> Runtime:
        options: dict[str, Any] = {"reap_interval_s": None, "retention_interval_s": None, **kwargs}
        runtime = Runtime(
            state_dir or tmp_path_factory.mktemp("state"), policy, backend=fake_backend, image="fake", **options
        )
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        _delete_everything(runtime)
    for info in fake_backend.list_containers({}):
        fake_backend.remove(info.id)


# the state stores a test marked with them runs on: SQLite in the state directory, and a PostgreSQL database
STATE_STORES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)]


@pytest.fixture(params=STATE_STORES)
def state_url(request: pytest.FixtureRequest) -> str | None:
    """Where a test's state lives: None (SQLite in its state directory) or a fresh PostgreSQL database's URL. Name it
    before the runtime factories in a test's arguments: the database is dropped when it is torn down, and the
    factories' runtimes delete their conversations in it when they are."""
    return None if request.param == "sqlite" else str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def state_db(state_url: str | None, tmp_path: Path) -> Iterator[StateDB]:
    """The state records of a fresh state, on each store."""
    state = StateDB(open_engine(tmp_path, state_url, StatePolicy()))
    yield state
    state.close()


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
    """The default policy under runc, under runsc where installed (required when CI is set), or on Podman."""
    if runtime in ("runc", "podman"):
        return load_policy("default" if runtime == "runc" else "podman")
    if not _runsc_installed(docker_backend):
        if os.environ.get("CI"):
            pytest.fail("CI is set but runsc (gVisor) is not registered with the engine")
        pytest.skip("runsc (gVisor) is not registered with the Docker engine")
    return load_policy("gvisor")


@pytest.fixture(scope="session", params=["runc", "runsc", pytest.param("podman", marks=pytest.mark.podman)])
def containment_policy(request: pytest.FixtureRequest, docker_backend: DockerBackend) -> Policy:
    """The default policy under runc, under runsc where installed (required when CI is set), and on Podman."""
    return policy_under(request.param, docker_backend)


@pytest.fixture(scope="session", params=["runc", "runsc"])
def docker_policy(request: pytest.FixtureRequest, docker_backend: DockerBackend) -> Policy:
    """The default policy on Docker under runc, and under runsc where installed (required when CI is set)."""
    return policy_under(request.param, docker_backend)


class Subject(NamedTuple):
    """A backend under test: how to make runtimes on it (under its policy unless one is given), the backend
    itself, and its policy."""

    make: RuntimeFactory
    backend: SandboxBackend
    policy: Policy

    def enforces(self, protection: str) -> None:
        """Skip the test when the backend declares that it leaves this protection out (its ``not_enforced``
        entry starts with the protection's name); a backend that confines applies every one."""
        left_out = [said for said in self.backend.not_enforced if said.startswith(f"{protection}:")]
        if left_out:
            pytest.skip(f"the {self.backend.name} backend declares it: {left_out[0]}")


# the backends the conformance, containment and code-mode suites run on (a new backend joins by adding its
# parameter here); and the same with the state on PostgreSQL (``@postgresql``: the fake and Docker under runc), for
# the suites whose stories involve the state (a module takes them by overriding ``subject`` with
# ``make_subject``, as tests/test_backend_conformance.py does)
SUBJECTS = [
    "fake",
    pytest.param("docker-runc", marks=pytest.mark.docker),
    pytest.param("docker-runsc", marks=pytest.mark.docker),
    pytest.param("podman-runc", marks=[pytest.mark.docker, pytest.mark.podman]),
]
SUBJECTS_ON_EVERY_STORE = [
    *SUBJECTS,
    pytest.param("fake@postgresql", marks=pytest.mark.postgresql),
    pytest.param("docker-runc@postgresql", marks=[pytest.mark.docker, pytest.mark.postgresql]),
]


@pytest.fixture(params=SUBJECTS)
def subject(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Subject:
    """Each backend in turn (the fake, Docker under runc and runsc, Podman)."""
    return make_subject(request, tmp_path_factory)


def make_subject(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Subject:
    """The subject ``request.param`` names: a backend, and the store its state is on (``@postgresql``: a database of
    each state directory's own; else SQLite)."""
    backend_name, _, store = request.param.partition("@")
    backend: SandboxBackend
    if backend_name == "fake":
        make: RuntimeFactory = request.getfixturevalue("fake_runtime_factory")
        policy, backend = load_policy("default"), request.getfixturevalue("fake_backend")
    else:
        make = request.getfixturevalue("docker_runtime_factory")
        engine, _, runtime = backend_name.partition("-")
        policy = policy_under(runtime if engine == "docker" else engine, request.getfixturevalue("docker_backend"))
        backend = request.getfixturevalue(ENGINE_FIXTURES[engine])  # the engine the subject's runtimes use
    if store:
        make = on_postgresql(make, request.getfixturevalue("postgres_cluster"), tmp_path_factory)

    def make_under_policy(changed: Policy | None = None, **options: Any) -> Runtime:
        return make(policy if changed is None else changed, **options)

    return Subject(make_under_policy, backend, policy)


def on_postgresql(make: RuntimeFactory, cluster: PostgresCluster, temp: pytest.TempPathFactory) -> RuntimeFactory:
    """``make`` with each state directory's state in a PostgreSQL database of its own (two runtimes on one
    state directory share it, as replicas do)."""
    databases: dict[Path, str] = {}

    def make_on_postgresql(policy: Policy | str = "default", state_dir: Path | None = None, **options: Any) -> Runtime:
        state_dir = Path(state_dir or temp.mktemp("state"))
        if state_dir not in databases:
            databases[state_dir] = cluster.socket_url(database_name(cluster.create_database()))
        return make(policy, state_dir=state_dir, state_url=databases[state_dir], **options)

    return make_on_postgresql


def database_name(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


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


# --------------------------------------------------------------------- serve with no engine: the fake backend
FAKE_POLICY = '[sandbox]\nbackend = "fake"\n'

# ``engine_policy`` parameters that hold one test to the fake backend (no engine: the test is not marked and runs
# anywhere) and to each real engine; such a test serves through :func:`served`
EVERY_BACKEND_POLICIES = [
    pytest.param("fake", id="fake"),
    pytest.param("fake@postgresql", id="fake@postgresql", marks=pytest.mark.postgresql),
    pytest.param("default", id="docker", marks=pytest.mark.docker),
    pytest.param("default@postgresql", id="docker@postgresql", marks=[pytest.mark.docker, pytest.mark.postgresql]),
    pytest.param("podman", id="podman", marks=[pytest.mark.docker, pytest.mark.podman]),
]


@pytest.fixture
def fake_policy_file(tmp_path: Path) -> Path:
    """A policy file that names the fake backend: a ``serve`` (or runtime) given it needs no engine."""
    policy = tmp_path / "fake.toml"
    policy.write_text(FAKE_POLICY)
    return policy


@pytest.fixture
def fake_served_state(fake_runtime_factory: RuntimeFactory, tmp_path: Path) -> Iterator[Path]:
    """:func:`served_state` for a ``serve`` on the fake backend: afterwards a runtime on the fake deletes every
    conversation the server made (its folders and mounts)."""
    state = tmp_path / "state"
    yield state
    fake_runtime_factory(state_dir=state)


class Served(NamedTuple):
    """A ``serve`` on the backend a test's ``engine_policy`` names: its state directory (every conversation in it is
    deleted afterwards), the policy to give ``serve --policy``, and runtimes on that backend to look at its work."""

    state: Path
    policy: str
    runtimes: RuntimeFactory


@pytest.fixture
def served(request: pytest.FixtureRequest, engine_policy: str, tmp_path: Path) -> Iterator[Served]:
    """Serve on the fake (``engine_policy`` ``"fake"``: no engine fixture is asked for) or on the real engine the
    built-in policy names; parametrise ``engine_policy`` with :data:`EVERY_BACKEND_POLICIES`."""
    named, _, store = engine_policy.partition("@")
    if named == "fake":
        runtimes: RuntimeFactory = request.getfixturevalue("fake_runtime_factory")
        policy = str(request.getfixturevalue("fake_policy_file"))
    elif request.node.get_closest_marker("docker") is None:  # its engine fixtures are asked for here: not seen
        pytest.fail(f"serving on {engine_policy!r} needs the test parametrised with EVERY_BACKEND_POLICIES")
    else:
        runtimes, policy = request.getfixturevalue("docker_runtime_factory"), named
    if store:  # the state in a database of its own, named by the policy (its socket is trusted: no password)
        cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
        url = cluster.socket_url(database_name(cluster.create_database()))
        policy = str(policy_with_state(tmp_path, policy, url))
        runtimes = functools.partial(runtimes, state_url=url)
    state = tmp_path / "state"
    yield Served(state, policy, runtimes)
    runtimes(state_dir=state)


def policy_with_state(folder: Path, policy: str, url: str) -> Path:
    """A policy file: ``policy`` (``default``, or a file with no ``[state]``) with its state at ``url``."""
    base = "" if policy == "default" else Path(policy).read_text()
    path = folder / f"{Path(policy).stem}-at-postgresql.toml"
    path.write_text(f'{base}\n[state]\nurl = "{url}"\n')
    load_policy(path)  # the file is a valid policy
    return path


@pytest.fixture
def host_listener() -> Iterator[socket.socket]:
    """A TCP listener on the host's 127.0.0.1 that no sandbox may reach (its ``accept`` must find no one)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    yield listener
    listener.close()
