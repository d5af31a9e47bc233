"""The Docker backend: the only module that imports ``docker``; every docker error is mapped here.

Exec output is read from the raw attach socket with ``select`` so that a byte cap and a deadline hold even
when the code prints forever or never exits; Docker's log driver is never used (it is unbounded on disk). Runs
go to each sandbox's resident executor (:mod:`~sandbox_runtime.sandbox.executors`), one long exec with stdin
attached.

How a command ended is read from the engine, never from what the command printed: when it ends the way the OCI
runtime ends things (no exit code, or one of 126 and above) the engine is asked whether the sandbox still
takes commands (gVisor can end its sandbox while Docker still calls it running). An engine that goes away
while a command runs (a daemon restart) raises :class:`~sandbox_runtime.errors.EngineLost`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import docker
import docker.errors
import requests.exceptions
from docker.types import LogConfig, Ulimit
from docker.utils import kwargs_from_env

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import EngineLost, EngineUnavailable, ImageError, SandboxError, SandboxGone
from sandbox_runtime.sandbox.backend import (
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
from sandbox_runtime.sandbox.docker.records import (
    container_info,
    engine_info,
    knock,
    pid_in_container,
)
from sandbox_runtime.sandbox.exec_stream import Caller, Frames, Watch, oom_kills, read_cgroup_file, read_frames
from sandbox_runtime.sandbox.executors import ResidentExecutors
from sandbox_runtime.sandbox.profile import end_all_command

__all__ = ["DockerBackend"]

logger = logging.getLogger(__name__)

_STDOUT, _STDERR = 1, 2
_EXIT_CODE_WAIT_S = 5.0
_RUNTIME_FAILURE_EXIT = 126  # 126 and above: the OCI runtime may have ended the exec (or the code chose it)
_PROBE_DEADLINE_S = 10.0  # a command that ended abruptly: how long the sandbox may take to run `true`
_DEFAULT_SOCKET = "/var/run/docker.sock"
_END_ALL_DEADLINE_S = 1.5  # the cancel's own exec: its program gives up after 1 s of retries


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
            self._client = docker.DockerClient(**options, timeout=int(timeout_s))
        self._api = self._client.api
        self._host_pids_visible = False
        self._first_pids: dict[str, int] = {}  # container id -> host pid of its first process
        self._executors = ResidentExecutors(_EngineSide(self))

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
        self._executors.discard(container_id)
        with self._engine("remove container"):
            try:
                self._api.remove_container(container_id, force=True, v=True)
            except docker.errors.APIError as exc:
                if _missing(exc) or "already in progress" in str(exc):
                    return
                raise

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
    ) -> RunnerOutput:
        return self._executors.run(container_id, request, control, calls)

    def prepare_run(self, container_id: str, request: RunRequest) -> None:
        self._executors.preload(container_id, request)

    def drop_idle_executors(self, idle_s: float) -> int:
        return self._executors.drop_idle(idle_s)

    def _open_exec(self, container_id: str, command: tuple[str, ...], request: RunRequest) -> tuple[object, str]:
        """Start a long command with stdin attached (the resident executor): its attach socket and exec id."""
        with self._engine("start the sandbox's executor"):
            try:
                exec_id = self._create_exec(
                    container_id, command, request.user, request.environment, request.working_dir, stdin=True
                )
                raw = self._api.exec_start(exec_id, detach=False, tty=False, socket=True)
            except (docker.errors.NotFound, docker.errors.APIError) as exc:
                if _gone(exc):
                    raise SandboxGone(f"sandbox {container_id[:12]} is gone: {exc.explanation or exc}") from exc
                raise
        return raw, exec_id

    # exec ---------------------------------------------------------------------------------------------
    def exec(self, container_id: str, request: ExecRequest, control: CallControl | None = None) -> ExecResult:
        started = time.monotonic()
        if control is not None and control.is_cancelled:
            return ExecResult.cancelled_before_start()  # nothing runs
        frames, exit_code, watch = self._run(container_id, request, control, started)
        # the command ended the way the OCI runtime ends things (the container's first process went, no exit code,
        # or a runtime's code): the engine, not the command's output, says whether the sandbox still works
        abrupt = frames.stop == "died" or (
            frames.stop == "eof" and (exit_code is None or exit_code >= _RUNTIME_FAILURE_EXIT)
        )
        died = abrupt and not self._still_serves(container_id, request.user, watch)
        said = bytes(frames.stdout + frames.stderr)
        if died and exit_code == _RUNTIME_FAILURE_EXIT and said.startswith(b"OCI runtime exec failed"):
            # the exec never started: the sandbox had ended since its last use (gVisor keeps it "running"); the
            # words alone prove nothing (a script may print them), the failed probe does
            raise SandboxGone(f"sandbox {container_id[:12]} has stopped: {said[:300].decode(errors='replace')}")
        return ExecResult(
            exit_code=exit_code,
            stdout=bytes(frames.stdout),
            stderr=bytes(frames.stderr),
            stdout_bytes_total=frames.totals[0],
            stderr_bytes_total=frames.totals[1],
            over_cap=frames.over_cap,
            deadline_hit=frames.stop == "deadline",
            container_died=died,
            memory_bytes_seen=watch.memory_bytes_seen,
            pids_seen=watch.pids_seen,
            cancelled=frames.cancelled,
            duration_s=time.monotonic() - started,
        )

    def _run(
        self, container_id: str, request: ExecRequest, control: CallControl | None, started: float
    ) -> tuple[Frames, int | None, Watch]:
        """Run one command: what its stream said, its exit code (None: unknown), and the watch kept meanwhile."""
        with self._engine("start a command in the sandbox"):
            try:
                exec_id = self._create_exec(
                    container_id, request.command, request.user, request.environment, request.working_dir
                )
                raw = self._api.exec_start(exec_id, detach=False, tty=False, socket=True)
            except (docker.errors.NotFound, docker.errors.APIError) as exc:
                if _gone(exc):
                    raise SandboxGone(f"sandbox {container_id[:12]} is gone: {exc.explanation or exc}") from exc
                raise
        sock = getattr(raw, "_sock", raw)
        watch = self._watch(container_id)
        caller = None
        if control is not None:
            caller = Caller(control, started, request.deadline_s, lambda: self._end_all(container_id, request.user))
        caps = (request.stdout_max_bytes, request.stderr_max_bytes)
        try:
            with _mapped("read a command's output", during_command=True, words=self.words):
                frames = read_frames(sock, started + request.deadline_s, caps, watch, caller)
        finally:
            for handle in (raw, sock):
                with contextlib.suppress(OSError):
                    handle.close()
        return frames, (self._exit_code(exec_id) if frames.stop == "eof" else None), watch

    def _still_serves(self, container_id: str, user: str, watch: Watch) -> bool:
        """Whether the sandbox still takes commands after one ended abruptly: the engine calls it running, its
        first process is the same, and it runs ``true``. An engine that cannot be reached went away under the
        command: :class:`EngineLost`."""
        with self._engine("inspect the sandbox after a command ended abruptly", during_command=True):
            try:
                state = self._api.inspect_container(container_id).get("State") or {}
            except docker.errors.APIError as exc:
                if _missing(exc):
                    return False
                raise
        if not state.get("Running") or not watch.alive():
            return False
        probe = ExecRequest(
            command=("true",), user=user, stdout_max_bytes=4096, stderr_max_bytes=4096, deadline_s=_PROBE_DEADLINE_S
        )
        try:
            frames, exit_code, _ = self._run(container_id, probe, None, time.monotonic())
        except SandboxGone:
            return False
        except EngineUnavailable as exc:
            raise EngineLost(f"{self.words.name} went away while a command ran: {exc}") from exc
        return frames.stop == "eof" and exit_code == 0

    def _end_all(self, container_id: str, user: str) -> None:
        """End every process of ``user``'s uid in the container: a second exec, as that uid, sends SIGKILL to
        all it may signal (``kill(-1)`` spares only the sender; the keeper and init run under other uids) until
        none is left. Portable across runc and runsc (gVisor), whose processes the host cannot signal. When it
        cannot run (the sandbox is gone, or its pids are exhausted) the caller's bounded read of the stream
        ends at its deadline and the sandbox is restarted by its owner."""
        request = ExecRequest(
            command=end_all_command(),
            user=user,
            stdout_max_bytes=4096,
            stderr_max_bytes=4096,
            deadline_s=_END_ALL_DEADLINE_S,
        )
        try:
            done = self.exec(container_id, request)
        except SandboxError as exc:
            logger.warning("could not end the processes of a cancelled command in %s: %s", container_id[:12], exc)
            return
        if done.exit_code != 0:
            logger.warning(
                "ending the processes of a cancelled command in %s: exit code %s, %s",
                container_id[:12],
                done.exit_code,
                (done.stdout + done.stderr)[-300:].decode(errors="replace").strip(),
            )

    def _watch(self, container_id: str) -> Watch:
        pid = self._first_pids.get(container_id, 0)
        if not pid_in_container(pid, container_id):  # unknown, or the container was restarted since
            with self._engine("inspect container"):
                try:
                    state = self._api.inspect_container(container_id).get("State") or {}
                except docker.errors.APIError as exc:
                    if _missing(exc):
                        raise SandboxGone(f"sandbox {container_id[:12]} is gone: {exc.explanation or exc}") from exc
                    raise
                pid = int(state.get("Pid") or 0)
            self._first_pids[container_id] = pid
            self._host_pids_visible = self._host_pids_visible or pid_in_container(pid, container_id)
        return Watch(
            pid,
            self._host_pids_visible,
            lambda: read_cgroup_file(container_id, "memory", "memory.usage_in_bytes", "memory.current"),
            lambda: read_cgroup_file(container_id, "pids", "pids.current", "pids.current"),
        )

    def _create_exec(
        self,
        container_id: str,
        command: tuple[str, ...],
        user: str,
        environment: dict[str, str],
        working_dir: str,
        *,
        stdin: bool = False,
    ) -> str:
        return str(
            self._api.exec_create(
                container_id,
                list(command),
                stdout=True,
                stderr=True,
                stdin=stdin,
                tty=False,
                privileged=False,
                user=user,
                environment=dict(environment),
                workdir=working_dir,
            )["Id"]
        )

    def _exit_code(self, exec_id: str) -> int | None:
        deadline = time.monotonic() + _EXIT_CODE_WAIT_S
        pause = 0.001
        while True:
            with self._engine("read a command's exit code", during_command=True):
                try:
                    state = self._api.exec_inspect(exec_id)
                except docker.errors.APIError as exc:
                    if _missing(exc):
                        return None  # the container was removed meanwhile, and its commands with it
                    raise
            if not state.get("Running"):
                code = state.get("ExitCode")
                return None if code is None else int(code)
            if time.monotonic() >= deadline:
                return None
            time.sleep(pause)  # the stream ended; the engine records the exit a moment later
            pause = min(pause * 2, 0.05)

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


class _EngineSide:
    """The engine's side of the resident executors (:class:`~sandbox_runtime.sandbox.executors.Engine`)."""

    muxed = True

    def __init__(self, backend: DockerBackend) -> None:
        self._backend = backend

    def open_exec(self, container_id: str, command: tuple[str, ...], request: RunRequest) -> tuple[object, str]:
        return self._backend._open_exec(container_id, command, request)

    def watch(self, container_id: str) -> Watch:
        return self._backend._watch(container_id)

    def end_all(self, container_id: str, user: str) -> None:
        self._backend._end_all(container_id, user)

    def exec_exit_code(self, exec_id: str) -> int | None:
        return self._backend._exit_code(exec_id)

    def still_serves(self, container_id: str, user: str, watch: Watch) -> bool:
        return self._backend._still_serves(container_id, user, watch)
