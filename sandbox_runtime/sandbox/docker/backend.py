"""The Docker backend: the only module that imports ``docker``; every docker call is made, and every docker error
mapped, here. Commands in a sandbox (one exec read to its end, the resident executors' execs, how a command
ended) are :mod:`~sandbox_runtime.sandbox.docker.execs`, which reaches the engine through this class's
:class:`~sandbox_runtime.sandbox.docker.execs.ExecCalls`; the engine's JSON becomes our records in
:mod:`~sandbox_runtime.sandbox.docker.facts`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar

import docker
import docker.constants
import docker.errors
import requests.exceptions
from docker.types import LogConfig, Ulimit
from docker.utils import kwargs_from_env

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import EngineLost, EngineUnavailable, ImageError, SandboxError, SandboxGone
from sandbox_runtime.sandbox.backend import (
    CommandStreams,
    ContainerInfo,
    ContainerSpec,
    EngineInfo,
    ExecRequest,
    ExecResult,
    HostFacts,
    ImageBuilder,
    ProgressCallback,
    RunnerOutput,
    RunRequest,
    SandboxBackend,
    ScriptCalls,
)
from sandbox_runtime.sandbox.docker.execs import Execs
from sandbox_runtime.sandbox.docker.facts import container_info, engine_info, knock
from sandbox_runtime.sandbox.exec_stream import oom_kills, read_cgroup_file
from sandbox_runtime.sandbox.executors import ResidentExecutors

__all__ = ["DockerBackend"]

_DEFAULT_SOCKET = "/var/run/docker.sock"
# connections to the engine kept open for reuse (docker-py keeps 10, and a burst of new conversations then opens
# and drops one per call beyond them, with a warning each); more are still opened when needed
_KEPT_CONNECTIONS = 64
# a removal another process started is waited for this long at most, looking this often
_REMOVAL_WAIT_S = 10.0
_REMOVAL_LOOK_S = 0.05


def _missing(exc: docker.errors.APIError) -> bool:
    """Whether the engine answered that the container (or exec) does not exist: not found, or (Podman, while it
    removes a container: its record goes before its answers say so) "no such container" with a server error."""
    said = str(exc.explanation or exc)
    return isinstance(exc, docker.errors.NotFound) or "no such container" in said or "no such exec" in said


def _gone(exc: docker.errors.APIError) -> bool:
    """Whether the engine refused a command because the container is gone, stopped or being removed (nothing
    ran): missing, a conflict, or (from exec start) "is not running", e.g. "Removal In Progress"."""
    return _missing(exc) or exc.status_code == 409 or "is not running" in str(exc.explanation or exc)


@dataclasses.dataclass(frozen=True)
class EngineWords:
    """How errors name an engine that speaks Docker's API: the engine, and how a user starts or finds it."""

    name: str = "the Docker engine"
    start_hint: str = "is dockerd running? Start it (see README: scripts/setup.sh) or set DOCKER_HOST"


@contextlib.contextmanager
def _mapped(
    action: str, error: type[Exception] = SandboxError, *, during_command: bool = False, words: EngineWords
) -> Iterator[None]:
    """Turn docker and transport errors into our tree, most specific first. ``during_command``: the engine is
    asked about a command that was running, so an engine that cannot be reached went away under it."""
    try:
        yield
    except EngineUnavailable:
        raise
    except docker.errors.ImageNotFound as exc:
        raise ImageError(f"{action}: image not found: {exc.explanation or exc}") from exc
    except docker.errors.APIError as exc:
        raise error(f"{action}: {words.name} refused: {exc.explanation or exc}") from exc
    except (requests.exceptions.ConnectionError, ConnectionError, requests.exceptions.ReadTimeout) as exc:
        if during_command:
            raise EngineLost(
                f"{action}: {words.name} went away while the command ran ({exc}): how it ended is unknown "
                "(an engine restart ends every sandbox); files it wrote stay, and once the engine is back the "
                "conversation's next call starts a fresh sandbox"
            ) from exc
        if isinstance(exc, requests.exceptions.ReadTimeout):
            raise EngineUnavailable(f"{action}: {words.name} did not answer in time ({exc})") from exc
        raise EngineUnavailable(f"{action}: cannot reach {words.name} ({exc}); {words.start_hint}") from exc
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(f"{action}: cannot reach {words.name} ({exc}); {words.start_hint}") from exc


def _client(options: Mapping[str, Any], timeout_s: float) -> docker.DockerClient:
    """A client speaking the API version the engine's ``/_ping`` answer names, as the docker CLI negotiates it
    (docker-py's own ``version="auto"`` asks ``/version``, which Podman answers in a third of a second because it
    looks up its components' packages every time: most of what a runtime on Podman took to start). An answer that
    names no version leaves the choice to docker-py."""
    probe = docker.APIClient(**options, version=docker.constants.MINIMUM_DOCKER_API_VERSION, timeout=int(timeout_s))
    try:
        answer = probe.get(f"{probe.base_url}/_ping", timeout=timeout_s)
    finally:
        probe.close()
    version = answer.headers.get("Api-Version") if answer.ok else None
    return docker.DockerClient(
        **options, version=version or "auto", timeout=int(timeout_s), max_pool_size=_KEPT_CONNECTIONS
    )


class DockerBackend(SandboxBackend, ImageBuilder):
    """Talks to a Docker engine through docker-py (``DOCKER_HOST`` and friends are honoured); builds the
    executor image there too."""

    name = "docker"
    # docker marks a removal before it kills, but shows it only once the kill is recorded; gVisor's sandbox that
    # ended at its memory or pids limit is recorded (with the OOM kill) a moment after the run's stream ended
    removal_settle_s = 1.0
    sandbox_end_settle_s = 3.0

    words: ClassVar[EngineWords] = EngineWords()

    def __init__(self, environment: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> None:
        options = self.client_options(dict(os.environ if environment is None else environment))
        self._base_url = str(options["base_url"])
        self._knock_timeout_s = timeout_s
        with _mapped("connect", EngineUnavailable, words=self.words):
            knock(self._base_url, timeout_s)
            self._client = _client(options, timeout_s)
        self._api = self._client.api
        self._execs = Execs(self, self.words.name)
        self._executors = ResidentExecutors(self._execs)

    @property
    def engine_address(self) -> str:
        return self._base_url

    @classmethod
    def client_options(cls, environment: Mapping[str, str]) -> dict[str, Any]:
        """docker-py's client options from the environment (``DOCKER_HOST``, ``DOCKER_TLS_VERIFY``, ...)."""
        options: dict[str, Any] = dict(kwargs_from_env(environment=dict(environment)))
        options.setdefault("base_url", f"unix://{_DEFAULT_SOCKET}")
        return options

    @contextlib.contextmanager
    def _engine(
        self, action: str, error: type[Exception] = SandboxError, *, during_command: bool = False
    ) -> Iterator[None]:
        """A use of the engine, errors mapped (:func:`_mapped`); a local engine's socket is knocked on first, so
        an engine that went away is found without docker-py (which leaks the socket of a connection that fails)."""
        with _mapped(action, error, during_command=during_command, words=self.words):
            knock(self._base_url, self._knock_timeout_s)
            yield

    # engine -------------------------------------------------------------------------------------------
    def engine_info(self) -> EngineInfo:
        with self._engine("read engine info", EngineUnavailable):
            info = self._api.info()
            version = self._api.version()
        return engine_info(info, version)

    # images -------------------------------------------------------------------------------------------
    def image_exists(self, reference: str) -> bool:
        with self._engine("inspect image", ImageError):
            try:
                self._api.inspect_image(reference)  # type: ignore[no-untyped-call]
            except docker.errors.ImageNotFound:
                return False
        return True

    def build_image(
        self,
        context_dir: str,
        tag: str,
        build_args: dict[str, str],
        labels: dict[str, str],
        progress: ProgressCallback,
    ) -> None:
        with self._engine(f"build image {tag}", ImageError):
            stream = self._api.build(
                path=context_dir,
                tag=tag,
                buildargs=build_args,
                labels=labels,
                network_mode="none",
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
            )
            for chunk in stream:
                if "error" in chunk:
                    detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
                    raise ImageError(f"build image {tag} failed: {str(detail).strip()}")
                line = str(chunk.get("stream", "")).strip()
                if line:
                    progress(line)

    def import_rootfs(self, tar_path: str, reference: str, progress: ProgressCallback) -> None:
        repository, _, tag = reference.rpartition(":")
        progress(f"importing {Path(tar_path).stat().st_size:,} bytes as {reference}")
        with self._engine(f"import {reference}", ImageError):
            self._api.import_image_from_file(tar_path, repository=repository, tag=tag)

    def pull_image(self, reference: str, progress: ProgressCallback) -> None:
        repository, _, tag = reference.rpartition(":")
        with self._engine(f"pull {reference}", ImageError):
            for chunk in self._api.pull(repository, tag=tag, stream=True, decode=True):
                if "error" in chunk:
                    raise ImageError(f"pull {reference} failed: {chunk['error']}")
                status = str(chunk.get("status", ""))
                if status and "Downloading" not in status and "Extracting" not in status:
                    progress(status)

    # containers -----------------------------------------------------------------------------------------
    def create_and_start(self, spec: ContainerSpec) -> ContainerInfo:
        host_config = self._api.create_host_config(
            binds={m.host_path: {"bind": m.container_path, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts},
            tmpfs=dict(spec.tmpfs),
            read_only=spec.read_only_root,
            cap_drop=list(spec.cap_drop),
            security_opt=list(spec.security_opt),
            network_mode=spec.network_mode,
            mem_limit=spec.memory_bytes,
            memswap_limit=spec.memory_swap_bytes,
            nano_cpus=spec.nano_cpus,
            pids_limit=spec.pids_limit,
            ulimits=[Ulimit(name=name, soft=value, hard=value) for name, value in spec.ulimits.items()],
            init=spec.init,
            runtime=spec.runtime,
            privileged=False,
            log_config=LogConfig(type="none"),
            ipc_mode="private",
        )
        with self._engine("create sandbox container"):
            created = self._api.create_container(
                image=spec.image,
                command=list(spec.command),
                user=spec.user,
                labels=dict(spec.labels),
                environment=dict(spec.environment),
                working_dir=spec.working_dir,
                host_config=host_config,
                network_disabled=False,
                hostname="sandbox",
                stdin_open=False,
                tty=False,
            )
        return self._started(str(created["Id"]), tuple(str(w) for w in created.get("Warnings") or ()))

    def _started(self, container_id: str, warnings: tuple[str, ...]) -> ContainerInfo:
        """Start a created container (removed again when it does not start): what the engine says of it."""
        try:
            with self._engine("start sandbox container"):
                self._api.start(container_id)
        except SandboxError:
            self.remove(container_id)
            raise
        info = self.inspect(container_id)
        if info is None:
            raise SandboxError(f"sandbox container {container_id[:12]} vanished right after it started")
        return info.model_copy(update={"warnings": warnings})

    def list_containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        filters = {"label": [f"{key}={value}" for key, value in labels.items()]}
        with self._engine("list containers"):
            rows = self._api.containers(all=True, filters=filters)
        return [container_info(row) for row in rows]

    def inspect(self, container_id: str) -> ContainerInfo | None:
        with self._engine("inspect container"):
            try:
                attrs = self._api.inspect_container(container_id)
            except docker.errors.APIError as exc:
                if _missing(exc):
                    return None
                raise
        return container_info(attrs)

    def remove(self, container_id: str) -> None:
        """Remove the container; one another process is removing already is waited for (bounded) until the
        engine no longer shows it, so that it is gone when this returns, whoever removed it."""
        self._executors.discard(container_id)
        with self._engine("remove container"):
            try:
                self._api.remove_container(container_id, force=True, v=True)
                return
            except docker.errors.APIError as exc:
                if _missing(exc):
                    return
                if "already in progress" not in str(exc):
                    raise
        deadline = time.monotonic() + _REMOVAL_WAIT_S
        while self.inspect(container_id) is not None and time.monotonic() < deadline:
            time.sleep(_REMOVAL_LOOK_S)  # the other process's removal has ended once the engine no longer shows it

    def restart(self, container_id: str) -> None:
        self._executors.forget(container_id)
        with self._engine("restart container"):
            self._api.restart(container_id, timeout=0)

    # runs ---------------------------------------------------------------------------------------------
    def run_program(
        self,
        container_id: str,
        request: RunRequest,
        control: CallControl | None = None,
        calls: ScriptCalls | None = None,
        streams: CommandStreams | None = None,
    ) -> RunnerOutput:
        return self._executors.run(container_id, request, control, calls, streams)

    def prepare_run(self, container_id: str, request: RunRequest) -> None:
        self._executors.preload(container_id, request)

    def drop_idle_executors(self, idle_s: float) -> int:
        return self._executors.drop_idle(idle_s)

    def executor_restarts(self) -> int:
        return self._executors.restarts

    # exec ---------------------------------------------------------------------------------------------
    def exec(self, container_id: str, request: ExecRequest, control: CallControl | None = None) -> ExecResult:
        return self._execs.exec(container_id, request, control)

    # the engine's calls for the execs (:class:`~sandbox_runtime.sandbox.docker.execs.ExecCalls`) ------------------
    def start_exec(
        self, action: str, container_id: str, command: tuple[str, ...], request: ExecRequest | RunRequest, stdin: bool
    ) -> tuple[Any, str]:
        with self._engine(action):
            try:
                exec_id = str(
                    self._api.exec_create(
                        container_id,
                        list(command),
                        stdout=True,
                        stderr=True,
                        stdin=stdin,
                        tty=False,
                        privileged=False,
                        user=request.user,
                        environment=dict(request.environment),
                        workdir=request.working_dir,
                    )["Id"]
                )
                raw = self._api.exec_start(exec_id, detach=False, tty=False, socket=True)
            except docker.errors.APIError as exc:
                if _gone(exc):
                    raise SandboxGone(f"sandbox {container_id[:12]} is gone: {exc.explanation or exc}") from exc
                raise
        return raw, exec_id

    def container_state(self, container_id: str, action: str, *, during_command: bool = False) -> Mapping[str, Any]:
        with self._engine(action, during_command=during_command):
            try:
                return dict(self._api.inspect_container(container_id).get("State") or {})
            except docker.errors.APIError as exc:
                if _missing(exc):
                    raise SandboxGone(f"sandbox {container_id[:12]} is gone: {exc.explanation or exc}") from exc
                raise

    def exec_state(self, exec_id: str) -> Mapping[str, Any] | None:
        with self._engine("read a command's exit code", during_command=True):
            try:
                return dict(self._api.exec_inspect(exec_id))
            except docker.errors.APIError as exc:
                if _missing(exc):
                    return None  # the container was removed meanwhile, and its commands with it
                raise

    def reading(self, action: str) -> AbstractContextManager[None]:
        return _mapped(action, during_command=True, words=self.words)

    # cgroup counters ---------------------------------------------------------------------------------------
    def oom_kill_count(self, container_id: str) -> int | None:
        return oom_kills(container_id)

    def host_facts(self, container_id: str) -> HostFacts:
        with self._engine("inspect container"):
            host_config = self._api.inspect_container(container_id).get("HostConfig") or {}
        return HostFacts(
            runtime=host_config.get("Runtime"),
            security_opt=",".join(host_config.get("SecurityOpt") or []),
            memory_limit_bytes=read_cgroup_file(container_id, "memory", "memory.limit_in_bytes", "memory.max"),
            memory_swap_limit_bytes=read_cgroup_file(
                container_id, "memory", "memory.memsw.limit_in_bytes", "memory.swap.max"
            ),
            pids_limit=read_cgroup_file(container_id, "pids", "pids.max", "pids.max"),
        )

    def close(self) -> None:
        self._executors.close()
        self._client.close()
