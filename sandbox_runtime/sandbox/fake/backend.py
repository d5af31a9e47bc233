"""A backend with no engine: containers are records in this process, commands run as host processes on the real
results folder. For hosts to test their integration (turns, spill, exports, their own tools) without Docker, and
for the conformance suite to hold the seam to one contract.

It confines nothing, and says so (``not_enforced``; the self-check reports the list instead of probing): code
runs as this process's user with its network, its whole filesystem and no memory, CPU or pids limit. What it
keeps is the contract the rest of the runtime relies on: labels, listing, inspect, re-attach by label within the
process, restart and remove ending a running command, ``SandboxGone`` for a removed container, the runner's
statuses (exit codes, time limit with grace, output caps and the verdict line), the host's caps and deadline,
cancel and progress. Runs go to the image's own resident executor, run as a host process
(:mod:`~sandbox_runtime.sandbox.fake.executors`), so a script's ``import sandbox_tools`` calls the host's tools
as it does in a sandbox; a plain exec (``exec``) keeps the runner's contract on the host
(:mod:`~sandbox_runtime.sandbox.fake.run`).

Paths: the results folder is the spec's one bind mount. Its in-sandbox path (``/mnt/results``) is rewritten to
the host folder in a command's arguments, its working directory and its environment (``SANDBOX_RESULTS``); code
that spells the in-sandbox path itself will not find it, so write code that uses relative paths or
``os.environ["SANDBOX_RESULTS"]``. The image's interpreter is this process's own (``sys.executable``). Like a
real bind mount, the mount holds the folder, not its path: a folder renamed after the container started (a warm
pool's slot handed to a conversation) is found at its new place.
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import subprocess
import threading
from dataclasses import dataclass, field

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import SandboxError, SandboxGone
from sandbox_runtime.sandbox.backend import (
    CommandStreams,
    ContainerInfo,
    ContainerSpec,
    EngineInfo,
    ExecRequest,
    ExecResult,
    HostFacts,
    RunnerOutput,
    RunRequest,
    SandboxBackend,
    ScriptCalls,
)
from sandbox_runtime.sandbox.executors import ResidentExecutors
from sandbox_runtime.sandbox.fake.executors import HostExecutorEngine, HostPlace
from sandbox_runtime.sandbox.fake.run import RunnerLimits, end_group, run_command
from sandbox_runtime.sandbox.run_protocol import PYTHON, RUNNER, end_all_command

__all__ = ["FakeBackend"]

_RUNNER_PREFIX = (PYTHON, "-I", "-S", RUNNER)
_RUNNER_ARGS = 5  # timeout, grace, stdout cap, stderr cap, nproc


@dataclass(eq=False)
class _Container:
    spec: ContainerSpec
    id: str
    results_fd: int | None  # the bind-mounted folder, held open as a mount holds it (None: let go, at its path)
    results_at: str
    running: bool = True
    runs: set[subprocess.Popen[bytes]] = field(default_factory=set)

    def results_path(self) -> str:
        """Where the bind-mounted folder is now (it may have been renamed since the start)."""
        if self.results_fd is not None:
            self.results_at = os.readlink(f"/proc/self/fd/{self.results_fd}")
        return self.results_at

    def place(self) -> HostPlace:
        """Where the results folder is on the host now, and the path it has in the sandbox."""
        return HostPlace(self.spec.mounts[0].container_path, self.results_path())

    def let_go(self) -> None:
        """Close the folder's descriptor (its file system can be unmounted); it is found at its path from now."""
        self.results_path()
        if self.results_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.results_fd)
            self.results_fd = None

    def info(self) -> ContainerInfo:
        return ContainerInfo(
            id=self.id,
            labels=dict(self.spec.labels),
            running=self.running,
            status="running" if self.running else "exited",
            exit_code=None if self.running else 137,
        )


class FakeBackend(SandboxBackend):
    """Containers as records, commands as host processes: see the module's docstring for what it leaves out."""

    name = "fake"
    confines = False
    not_enforced = (
        "network: the code has this host's network",
        "identity: the code runs as this process's user, with its capabilities",
        "filesystem: the code sees and may change this host's files; only the results folder is as in a sandbox",
        "resources: no memory, CPU or pids limit (no memory_limit status), no disk quota beyond the store's own",
        "processes: a process that leaves its run's session is not ended",
    )
    removal_settle_s = 0.1  # its records change at once
    sandbox_end_settle_s = 0.1

    def __init__(self) -> None:
        self._containers: dict[str, _Container] = {}
        self._guard = threading.Lock()
        self._host_executors = HostExecutorEngine(self._running_place)
        self._executors = ResidentExecutors(self._host_executors)

    def engine_info(self) -> EngineInfo:
        return EngineInfo(
            engine_version="fake",
            api_version="-",
            kernel_version=platform.release(),
            operating_system=f"{platform.system()} (no engine: {type(self).__name__})",
            cgroup_version="-",
            cgroup_driver="-",
            runtimes=("fake",),
            default_runtime="fake",
            runc_version=None,
            security_options=(),
        )

    def image_exists(self, reference: str) -> bool:
        return True  # there is no image: commands run with this process's interpreter

    # containers -------------------------------------------------------------------------------------------
    def create_and_start(self, spec: ContainerSpec) -> ContainerInfo:
        if len(spec.mounts) != 1:
            raise SandboxError(f"the fake backend needs exactly one bind mount (the results folder), not {spec.mounts}")
        try:
            folder = os.open(spec.mounts[0].host_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise SandboxError(f"cannot bind {spec.mounts[0].host_path}: {exc}") from exc
        container = _Container(
            spec=spec, id=secrets.token_hex(32), results_fd=folder, results_at=spec.mounts[0].host_path
        )
        with self._guard:
            self._containers[container.id] = container
        return container.info()

    def list_containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        with self._guard:
            found = list(self._containers.values())
        return [c.info() for c in found if labels.items() <= c.spec.labels.items()]

    def inspect(self, container_id: str) -> ContainerInfo | None:
        with self._guard:
            container = self._containers.get(container_id)
        return None if container is None else container.info()

    def remove(self, container_id: str) -> None:
        self._executors.discard(container_id)
        with self._guard:
            container = self._containers.pop(container_id, None)
        if container is not None:
            container.running = False
            self._end_runs(container)
            self._host_executors.end_container(container_id)
            container.let_go()

    def restart(self, container_id: str) -> None:
        container = self._container(container_id)
        self._executors.forget(container_id)
        self._end_runs(container)
        self._host_executors.end_container(container_id)
        container.running = True

    def _container(self, container_id: str) -> _Container:
        with self._guard:
            container = self._containers.get(container_id)
        if container is None:
            raise SandboxGone(f"sandbox {container_id[:12]} is gone")
        return container

    def _running_place(self, container_id: str) -> HostPlace:
        container = self._container(container_id)
        if not container.running:
            raise SandboxGone(f"sandbox {container_id[:12]} has stopped")
        return container.place()

    def _end_runs(self, container: _Container) -> None:
        with self._guard:
            runs = list(container.runs)
        for process in runs:
            end_group(process)

    # commands ---------------------------------------------------------------------------------------------
    def exec(self, container_id: str, request: ExecRequest, control: CallControl | None = None) -> ExecResult:
        container = self._container(container_id)
        if not container.running:
            raise SandboxGone(f"sandbox {container_id[:12]} has stopped")
        if control is not None and control.is_cancelled:
            return ExecResult.cancelled_before_start()
        if tuple(request.command) == end_all_command():
            self._end_runs(container)
            return ExecResult(
                exit_code=0, stdout=b"", stderr=b"", stdout_bytes_total=0, stderr_bytes_total=0, duration_s=0.0
            )
        command, runner = _split_runner(tuple(request.command))
        place = container.place()

        def track(process: subprocess.Popen[bytes], running: bool) -> None:
            with self._guard:
                if running:
                    container.runs.add(process)
                else:
                    container.runs.discard(process)

        return run_command(
            place.argv(command),
            cwd=place.path(request.working_dir),
            environment=place.environment(request.environment),
            caps=(request.stdout_max_bytes, request.stderr_max_bytes),
            deadline_s=request.deadline_s,
            runner=runner,
            control=control,
            track=track,
        )

    def run_program(
        self,
        container_id: str,
        request: RunRequest,
        control: CallControl | None = None,
        calls: ScriptCalls | None = None,
        streams: CommandStreams | None = None,
    ) -> RunnerOutput:
        return self._executors.run(container_id, self._on_host(container_id, request), control, calls, streams)

    def prepare_run(self, container_id: str, request: RunRequest) -> None:
        self._executors.preload(container_id, self._on_host(container_id, request))

    def drop_idle_executors(self, idle_s: float) -> int:
        return self._executors.drop_idle(idle_s)

    def executor_restarts(self) -> int:
        return self._executors.restarts

    def _on_host(self, container_id: str, request: RunRequest) -> RunRequest:
        """A run request with its in-sandbox paths (the script, arguments, working folder, environment) as they
        are on the host."""
        place = self._running_place(container_id)
        return request.model_copy(
            update={
                "program": tuple(place.argv(request.program)),
                "working_dir": place.path(request.working_dir),
                "command_environment": {key: place.path(value) for key, value in request.command_environment.items()},
                "environment": place.environment(request.environment),
            }
        )

    def oom_kill_count(self, container_id: str) -> int | None:
        return None  # no memory limit, no counter

    def host_facts(self, container_id: str) -> HostFacts:
        return HostFacts(runtime="fake")

    def let_go_of_folders(self) -> None:
        """The containers stay (another runtime of this process may re-attach them), found at their folders' paths
        from now on, and their idle executors end (each holds no folder of its own; a run starts in its folder):
        nothing here keeps a folder's file system busy once its runs are over."""
        self._executors.close()
        self._host_executors.reap()
        with self._guard:
            containers = list(self._containers.values())
        for container in containers:
            container.let_go()

    def close(self) -> None:
        self.let_go_of_folders()


def _split_runner(command: tuple[str, ...]) -> tuple[tuple[str, ...], RunnerLimits | None]:
    """The program and the runner's limits when ``command`` is the runner's command line, else the command."""
    if command[: len(_RUNNER_PREFIX)] != _RUNNER_PREFIX:
        return command, None
    values = command[len(_RUNNER_PREFIX) : len(_RUNNER_PREFIX) + _RUNNER_ARGS]
    program = command[len(_RUNNER_PREFIX) + _RUNNER_ARGS :]
    if len(values) < _RUNNER_ARGS or not program:
        raise SandboxError(f"not a runner command line: {command!r}")
    limits = RunnerLimits(float(values[0]), float(values[1]), int(values[2]), int(values[3]))
    return program, limits
