"""Commands in the sandboxes of an engine that speaks Docker's API: one command read to its end
(:meth:`Execs.exec`), and the engine's side of the resident executors (:class:`Execs` is an
:class:`~sandbox_runtime.sandbox.executors.Engine`). No ``docker`` import here: every call to the engine goes
through :class:`ExecCalls` (the Docker backend), with the engine's errors already mapped to ours.

Exec output is read from the raw attach socket with ``select`` (:mod:`~sandbox_runtime.sandbox.exec_stream`) so
that a byte cap and a deadline hold even when the code prints forever or never exits; Docker's log driver is
never used (it is unbounded on disk). Runs go to each sandbox's resident executor
(:mod:`~sandbox_runtime.sandbox.executors`), one long exec with stdin attached.

How a command ended is read from the engine, never from what the command printed: when it ends the way the OCI
runtime ends things (no exit code, or one of 126 and above) the engine is asked whether the sandbox still
takes commands (gVisor can end its sandbox while Docker still calls it running). An engine that goes away
while a command runs (a daemon restart) raises :class:`~sandbox_runtime.errors.EngineLost`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import EngineLost, EngineUnavailable, SandboxError, SandboxGone
from sandbox_runtime.sandbox.backend import ExecRequest, ExecResult, RunRequest
from sandbox_runtime.sandbox.docker.facts import pid_in_container
from sandbox_runtime.sandbox.exec_stream import Caller, Frames, Watch, read_cgroup_file, read_frames
from sandbox_runtime.sandbox.run_protocol import end_all_command

__all__ = ["ExecCalls", "Execs"]

logger = logging.getLogger(__name__)

_EXIT_CODE_WAIT_S = 5.0
_RUNTIME_FAILURE_EXIT = 126  # 126 and above: the OCI runtime may have ended the exec (or the code chose it)
_PROBE_DEADLINE_S = 10.0  # a command that ended abruptly: how long the sandbox may take to run `true`
_END_ALL_DEADLINE_S = 1.5  # the cancel's own exec: its program gives up after 1 s of retries


class ExecCalls(Protocol):
    """What :class:`Execs` asks of the engine (the Docker backend): each call with the engine's errors mapped to
    ours (:class:`~sandbox_runtime.errors.EngineUnavailable` when it cannot be reached, or
    :class:`~sandbox_runtime.errors.EngineLost` where a command was running)."""

    def start_exec(
        self, action: str, container_id: str, command: tuple[str, ...], request: ExecRequest | RunRequest, stdin: bool
    ) -> tuple[Any, str]:
        """Start ``command`` as the request's user, in its environment and folder: its attach socket and exec id.
        SandboxGone when the container is gone, stopped or being removed (nothing ran)."""

    def container_state(self, container_id: str, action: str, *, during_command: bool = False) -> Mapping[str, Any]:
        """The container's ``State`` as the engine inspects it; SandboxGone when it does not exist."""

    def exec_state(self, exec_id: str) -> Mapping[str, Any] | None:
        """An exec's state as the engine inspects it (asked while its command ends); None when it does not exist."""

    def reading(self, action: str) -> AbstractContextManager[None]:
        """Around a read of a running command's stream: an engine that went away raises EngineLost."""


class Execs:
    """The commands of one engine's sandboxes, and the engine's side of their resident executors. Keeps, per
    container, the host pid of its first process (the watch's sign of life)."""

    muxed = True  # an exec's attach stream interleaves stdout and stderr in Docker's framing

    def __init__(self, calls: ExecCalls, engine_name: str) -> None:
        self._calls = calls
        self._engine_name = engine_name
        self._host_pids_visible = False
        self._first_pids: dict[str, int] = {}  # container id -> host pid of its first process

    def exec(self, container_id: str, request: ExecRequest, control: CallControl | None = None) -> ExecResult:
        """One command (:meth:`~sandbox_runtime.sandbox.backend.SandboxBackend.exec`)."""
        started = time.monotonic()
        if control is not None and control.is_cancelled:
            return ExecResult.cancelled_before_start()  # nothing runs
        frames, exit_code, watch = self._run(container_id, request, control, started)
        # the command ended the way the OCI runtime ends things (the container's first process went, no exit code,
        # or a runtime's code): the engine, not the command's output, says whether the sandbox still works
        abrupt = frames.stop == "died" or (
            frames.stop == "eof" and (exit_code is None or exit_code >= _RUNTIME_FAILURE_EXIT)
        )
        died = abrupt and not self.still_serves(container_id, request.user, watch)
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
        action = "start a command in the sandbox"
        raw, exec_id = self._calls.start_exec(action, container_id, request.command, request, stdin=False)
        sock = getattr(raw, "_sock", raw)
        caller = None
        if control is not None:
            caller = Caller(control, started, request.deadline_s, lambda: self.end_all(container_id, request.user))
        caps = (request.stdout_max_bytes, request.stderr_max_bytes)
        try:
            watch = self.watch(container_id)  # the container may be gone by now: the socket is closed either way
            with self._calls.reading("read a command's output"):
                frames = read_frames(sock, started + request.deadline_s, caps, watch, caller)
        finally:
            for handle in (raw, sock):
                with contextlib.suppress(OSError):
                    handle.close()
        return frames, (self.exec_exit_code(exec_id) if frames.stop == "eof" else None), watch

    # the resident executors' engine (:class:`~sandbox_runtime.sandbox.executors.Engine`) ----------------------
    def open_exec(self, container_id: str, command: tuple[str, ...], request: RunRequest) -> tuple[Any, str]:
        """Start a long command with stdin attached (the resident executor): its attach socket and exec id."""
        return self._calls.start_exec("start the sandbox's executor", container_id, command, request, stdin=True)

    def still_serves(self, container_id: str, user: str, watch: Watch) -> bool:
        """Whether the sandbox still takes commands after one ended abruptly: the engine calls it running, its
        first process is the same, and it runs ``true``. An engine that cannot be reached went away under the
        command: :class:`EngineLost`."""
        try:
            state = self._calls.container_state(
                container_id, "inspect the sandbox after a command ended abruptly", during_command=True
            )
        except SandboxGone:
            return False
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
            raise EngineLost(f"{self._engine_name} went away while a command ran: {exc}") from exc
        return frames.stop == "eof" and exit_code == 0

    def end_all(self, container_id: str, user: str) -> None:
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

    def watch(self, container_id: str) -> Watch:
        """A watch on the container for the time of one command: its first process, memory and pids."""
        pid = self._first_pids.get(container_id, 0)
        if not pid_in_container(pid, container_id):  # unknown, or the container was restarted since
            pid = int(self._calls.container_state(container_id, "inspect container").get("Pid") or 0)
            self._first_pids[container_id] = pid
            self._host_pids_visible = self._host_pids_visible or pid_in_container(pid, container_id)
        return Watch(
            pid,
            self._host_pids_visible,
            lambda: read_cgroup_file(container_id, "memory", "memory.usage_in_bytes", "memory.current"),
            lambda: read_cgroup_file(container_id, "pids", "pids.current", "pids.current"),
        )

    def exec_exit_code(self, exec_id: str) -> int | None:
        """The exit code of an exec whose stream ended (None: unknown, or its container was removed meanwhile)."""
        deadline = time.monotonic() + _EXIT_CODE_WAIT_S
        pause = 0.001
        while True:
            state = self._calls.exec_state(exec_id)
            if state is None:
                return None  # the container was removed meanwhile, and its commands with it
            if not state.get("Running"):
                code = state.get("ExitCode")
                return None if code is None else int(code)
            if time.monotonic() >= deadline:
                return None
            time.sleep(pause)  # the stream ended; the engine records the exit a moment later
            pause = min(pause * 2, 0.05)
