"""The one seam between the runtime and a container engine: an abstract backend taking and returning models.

:class:`SandboxBackend` is what a backend must do for the runtime: start a container from a spec, exec in it
with caps and a deadline, run a program under the in-sandbox runner (:class:`RunRequest`: confined, with a time
limit, output caps and the runner's verdict), stop (restart, remove) it, and inspect and list it by labels.
:class:`ImageBuilder` (building, importing and pulling the executor image) is apart: a backend that runs
sandboxes from an image made elsewhere needs none of it.

:class:`ContainerSpec` says everything a sandbox container is (built by :mod:`sandbox_runtime.sandbox.profile`,
the one place where hardening lives); a confining backend must apply every field or raise, never drop one
silently. A backend that does not confine (a test double: ``confines = False``) names, in ``not_enforced``,
every protection it leaves out; the self-check then reports them instead of probing.

``tests/test_backend_conformance.py`` holds the behaviour every backend must show, run against each one. How a
run ended is data (:mod:`~sandbox_runtime.sandbox.runs`): :meth:`SandboxBackend.run` returns the engine's word on
it, settled with the engine's own timings, so nothing above the seam asks the engine after a run.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox_runtime.control import CallControl
from sandbox_runtime.sandbox.runs import (
    CommandInput,
    CommandStreams,
    ExecResult,
    OutputSink,
    RunEnd,
    RunnerOutput,
    RunnerVerdict,
    RunResult,
    settle_end,
)

__all__ = [
    "BindMount",
    "CommandInput",
    "CommandStreams",
    "ContainerInfo",
    "ContainerSpec",
    "EngineInfo",
    "ExecRequest",
    "ExecResult",
    "HostFacts",
    "ImageBuilder",
    "OutputSink",
    "RunEnd",
    "RunRequest",
    "RunResult",
    "RunnerOutput",
    "RunnerVerdict",
    "SandboxBackend",
    "ScriptCalls",
]

HOST_CAP_MARGIN_BYTES = 64 * 1024  # the runner stops at cap + 1; the host's own cap is a backstop above it


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BindMount(_Model):
    """A host folder mounted into the container."""

    host_path: str
    container_path: str
    read_only: bool = False
    options: tuple[str, ...] = ("nosuid", "nodev")


class ContainerSpec(_Model):
    """A whole container: identity, filesystem, network, resources, labels."""

    image: str
    command: tuple[str, ...]
    user: str = Field(description="uid:gid of the container's own command (the keeper).")
    labels: dict[str, str]
    runtime: str = "runc"
    network_mode: Literal["none"] = "none"
    read_only_root: bool = True
    cap_drop: tuple[str, ...] = ("ALL",)
    security_opt: tuple[str, ...] = ("no-new-privileges",)
    init: bool = True
    tmpfs: dict[str, str] = Field(default_factory=dict, description="mount path -> mount options")
    mounts: tuple[BindMount, ...] = ()
    memory_bytes: int
    memory_swap_bytes: int
    nano_cpus: int
    pids_limit: int
    ulimits: dict[str, int] = Field(default_factory=dict, description="name -> soft and hard limit")
    environment: dict[str, str] = Field(default_factory=dict)
    working_dir: str = "/"


class ContainerInfo(_Model):
    """What the engine says of one container."""

    id: str
    labels: dict[str, str]
    running: bool
    status: str
    exit_code: int | None = None
    oom_killed: bool = Field(False, description="The engine recorded that the kernel's OOM killer ended it.")
    warnings: tuple[str, ...] = ()


class ExecRequest(_Model):
    """One command to run in a running container, with byte caps on what it prints and a deadline."""

    command: tuple[str, ...]
    user: str
    environment: dict[str, str] = Field(default_factory=dict)
    working_dir: str = "/"
    stdout_max_bytes: int = Field(gt=0)
    stderr_max_bytes: int = Field(gt=0)
    deadline_s: float = Field(gt=0, description="Longest wait for the command to finish, in seconds.")


class RunRequest(_Model):
    """One program to run under the in-sandbox runner: confined (no_new_privs, the runner's seccomp filter,
    RLIMIT_NPROC), stopped at its time limit (SIGTERM, SIGKILL after the grace) or at an output cap, and every
    process of it ended afterwards; how it ended is the runner's :class:`RunnerVerdict`."""

    program: tuple[str, ...] = Field(
        min_length=1, description="The interpreter, the script, its arguments; or a command and its arguments."
    )
    command: bool = Field(
        False,
        description="``program`` is a command: its first word is found on the sandbox's PATH and run in the "
        "interpreter's place (a shell's 127 when there is none, 126 when it cannot be run).",
    )
    command_environment: dict[str, str] = Field(
        default_factory=dict, description="A command's own variables, laid over ``environment`` for this run alone."
    )
    with_input: bool = Field(
        False, description="A command reads the caller's input (``run``'s ``stdin``) on its stdin; else nothing."
    )
    user: str
    environment: dict[str, str] = Field(default_factory=dict)
    working_dir: str = "/"
    timeout_s: float = Field(gt=0)
    grace_s: float = Field(ge=0)
    deadline_margin_s: float = Field(
        gt=0, description="How long past the time limit and grace the host waits for the runner's verdict."
    )
    executor_start_timeout_s: float = Field(gt=0, description="How long a new resident executor may take to be ready.")
    stdout_max_bytes: int = Field(gt=0, description="The runner's cap: it passes on at most cap + 1 bytes.")
    stderr_max_bytes: int = Field(gt=0)
    nproc_max: int = Field(ge=0, description="RLIMIT_NPROC of the run (0: none).")

    @model_validator(mode="after")
    def _a_script_or_a_command(self) -> RunRequest:
        if not self.command and (len(self.program) < 2 or self.command_environment or self.with_input):
            raise ValueError(
                "a script's program is the interpreter and the script; only a command has its own variables or input"
            )
        return self

    @property
    def deadline_s(self) -> float:
        """The host's own deadline, a backstop past the runner's time limit and grace."""
        return self.timeout_s + self.grace_s + self.deadline_margin_s

    @property
    def host_caps(self) -> tuple[int, int]:
        """The host's own caps on stdout and stderr, a backstop above the runner's."""
        return self.stdout_max_bytes + HOST_CAP_MARGIN_BYTES, self.stderr_max_bytes + HOST_CAP_MARGIN_BYTES


class ScriptCalls(Protocol):
    """Who answers the tool calls a run makes (``sandbox_tools`` in the image): one JSON line per call, each
    answered, in order, with a JSON object the run reads back. The backend only carries the lines; the answer
    (and every check) is the caller's."""

    @property
    def line_max_bytes(self) -> int:
        """A longer call line is not kept: ``answer`` gets None for it (once its end has come)."""

    def answer(self, line: bytes | None) -> dict[str, Any]:
        """The reply to one call line (None: the line was longer than ``line_max_bytes``). Must not raise."""


class EngineInfo(_Model):
    """Facts about the engine and host that doctor shows."""

    product: str = Field("Docker", description="The engine's name, as its maker spells it (Docker, Podman).")
    engine_version: str
    api_version: str
    kernel_version: str
    operating_system: str
    cgroup_version: str
    cgroup_driver: str
    runtimes: tuple[str, ...]
    default_runtime: str
    runc_version: str | None
    runsc_version: str | None = None
    security_options: tuple[str, ...]
    warnings: tuple[str, ...] = ()


class HostFacts(_Model):
    """What the host side says of a container: the engine's recorded settings and the cgroup limits, as text
    (None when unknown). The self-check reads them where the inside cannot see them (gVisor)."""

    runtime: str | None = None
    security_opt: str | None = None
    memory_limit_bytes: str | None = None
    memory_swap_limit_bytes: str | None = None
    pids_limit: str | None = None


ProgressCallback = Callable[[str], None]


class SandboxBackend(abc.ABC):
    """A container engine. Infrastructure failures raise :class:`~sandbox_runtime.errors.SandboxRuntimeError`."""

    name: ClassVar[str]
    """The backend's name, as the policy's ``sandbox.backend`` says it."""
    confines: ClassVar[bool] = True
    """Whether every protection of a :class:`ContainerSpec` is applied (or the start refused)."""
    not_enforced: ClassVar[tuple[str, ...]] = ()
    """With ``confines = False``: each protection left out, in words (the self-check reports them)."""
    removal_settle_s: ClassVar[float] = 1.0
    """A run that a signal ended: how long the engine is asked whether the sandbox was being removed."""
    sandbox_end_settle_s: ClassVar[float] = 3.0
    """A run whose sandbox ended: how long the engine is given to record the end (and an OOM kill)."""
    stops_before_removal: ClassVar[bool] = False
    """Whether the engine shows a removal only after it has stopped the container (a stopped sandbox may still
    be on its way out)."""

    @property
    def engine_address(self) -> str | None:
        """Where the engine is reached, the same for every backend object of this engine (a self-check that passed
        on it is kept for the process); None: an engine of this object alone."""
        return None

    @abc.abstractmethod
    def engine_info(self) -> EngineInfo:
        """Versions and capabilities of the engine; raises EngineUnavailable when it cannot be reached."""

    @abc.abstractmethod
    def image_exists(self, reference: str) -> bool:
        """Whether an image with this name:tag is present locally."""

    @abc.abstractmethod
    def create_and_start(self, spec: ContainerSpec) -> ContainerInfo:
        """Create and start a container; its warnings (e.g. an unsupported limit) are returned."""

    @abc.abstractmethod
    def list_containers(self, labels: dict[str, str]) -> list[ContainerInfo]:
        """Every container (running or not) that carries all these labels."""

    @abc.abstractmethod
    def inspect(self, container_id: str) -> ContainerInfo | None:
        """One container, or None when it no longer exists."""

    @abc.abstractmethod
    def remove(self, container_id: str) -> None:
        """Kill and remove a container; no error when it is already gone."""

    @abc.abstractmethod
    def restart(self, container_id: str) -> None:
        """Kill every process of the container and start it again (its mounts stay)."""

    @abc.abstractmethod
    def exec(self, container_id: str, request: ExecRequest, control: CallControl | None = None) -> ExecResult:
        """Run a command; stop reading at a cap or the deadline and return what was captured.

        A container removed or stopped before the command started raises
        :class:`~sandbox_runtime.errors.SandboxGone` (nothing ran); an engine that went away while it ran
        raises :class:`~sandbox_runtime.errors.EngineLost`.

        With ``control``: once ``control.cancelled`` is set, every process of the request's uid in the container
        (the command and everything it started, daemons included) is ended within 2 seconds, the stream is read
        to its end (bounded) and the result says ``cancelled``; set before the call, the command never starts.
        ``control.progress`` hears about once a second (never more often than every 0.5 s): the seconds
        elapsed, ``request.deadline_s`` as the total, and a line naming the bytes of output so far.
        """

    def run(
        self,
        container_id: str,
        request: RunRequest,
        control: CallControl | None = None,
        calls: ScriptCalls | None = None,
        streams: CommandStreams | None = None,
    ) -> RunResult:
        """Run a program (:meth:`run_program`) and say how it ended, as data: what the script did, the runner's
        verdict, and the engine's word on the end (:class:`RunEnd`: OOM kills during the run, the sandbox removed
        or ended by the OOM killer), settled with this engine's timings. Errors as for :meth:`exec`."""
        oom_before = self.oom_kill_count(container_id)
        output = self.run_program(container_id, request, control, calls, streams)
        return RunResult(output.result, output.verdict, self.end_of(container_id, output, oom_before))

    def end_of(self, container_id: str, output: RunnerOutput, oom_before: int | None) -> RunEnd:
        """The engine's word on how a run ended (``oom_before``: the OOM kill count before it), settled with this
        engine's timings (:func:`~sandbox_runtime.sandbox.runs.settle_end`)."""
        return settle_end(
            self,
            container_id,
            output,
            oom_before,
            removal_settle_s=self.removal_settle_s,
            sandbox_end_settle_s=self.sandbox_end_settle_s,
            stops_before_removal=self.stops_before_removal,
        )

    @abc.abstractmethod
    def run_program(
        self,
        container_id: str,
        request: RunRequest,
        control: CallControl | None = None,
        calls: ScriptCalls | None = None,
        streams: CommandStreams | None = None,
    ) -> RunnerOutput:
        """Run a program under the in-sandbox runner (see :class:`RunRequest`), with the host's own caps and
        deadline as backstops; the errors and ``control`` are as for :meth:`exec`. Whatever channel reaches the
        runner, every status and every protection is the same.

        ``calls`` answers the tool calls the run makes (a backend whose runs cannot make any ignores it; without
        it, every call is told that none can be made). While a call is being answered, the run's time limit
        stands still. ``streams``: a command's input and where its output goes (:class:`CommandStreams`)."""

    def prepare_run(self, container_id: str, request: RunRequest) -> None:
        """Make the channel that runs requests like this one ready ahead of the first (a resident executor,
        loaded and waiting), so that the first run is as fast as any; errors as for :meth:`run`. A backend that
        keeps no such channel has nothing to prepare."""
        del container_id, request

    def drop_idle_executors(self, idle_s: float) -> int:
        """End the resident executors of sandboxes unused for ``idle_s`` seconds (their memory is given back; the
        next run starts one again); how many. A backend that keeps none has nothing to drop."""
        del idle_s
        return 0

    def executor_restarts(self) -> int:
        """How many resident executors a run ended or got around since the backend was made (each run after
        such a one starts a fresh executor); 0 for a backend without resident executors."""
        return 0

    def let_go_of_folders(self) -> None:
        """At the runtime's close, before it unmounts the results folders it mounted: a backend whose sandboxes
        hold the host's own view of their folders (no mount of their own) lets go of it, so the unmount is not
        refused; its sandboxes find their folders at their paths from then on. A backend whose sandboxes mount
        the folder for themselves (every engine) has nothing to let go of."""
        return

    @abc.abstractmethod
    def oom_kill_count(self, container_id: str) -> int | None:
        """How many processes the kernel's OOM killer ended in this container; None when unknown."""

    @abc.abstractmethod
    def host_facts(self, container_id: str) -> HostFacts:
        """What the host side says of a container (see :class:`HostFacts`)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection to the engine."""


class ImageBuilder(abc.ABC):
    """Making the executor image in an engine's image store (see :mod:`~sandbox_runtime.sandbox.image`)."""

    @abc.abstractmethod
    def image_exists(self, reference: str) -> bool:
        """Whether an image with this name:tag is present locally."""

    @abc.abstractmethod
    def build_image(
        self,
        context_dir: str,
        tag: str,
        build_args: dict[str, str],
        labels: dict[str, str],
        progress: ProgressCallback,
    ) -> None:
        """Build an image from a folder with a Dockerfile, with no network during the build."""

    @abc.abstractmethod
    def import_rootfs(self, tar_path: str, reference: str, progress: ProgressCallback) -> None:
        """Import a root filesystem tarball as an image."""

    @abc.abstractmethod
    def pull_image(self, reference: str, progress: ProgressCallback) -> None:
        """Pull an image from a registry."""
