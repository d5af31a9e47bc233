"""The fake backend's side of the resident executors: the image's own executor (``executor.py``) run as a host
process, one per container, its stdin and stdout one end of a socket pair, so runs, ``sandbox_tools`` calls,
progress, cancel and the executor's whole protocol are the real ones with no engine.

Each executor is started in a session of its own and told so (``--session``): its sweeps end the processes of its
session only, never every process of the host's user, and every run it forks stays in that session. Ending a
container's executors (a restart, a removal, a cancel the executor did not answer) ends their sessions from
here. A process a run moves to another session is not ended (the fake backend says so in ``not_enforced``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from sandbox_runtime.errors import SandboxError
from sandbox_runtime.sandbox.backend import RunRequest
from sandbox_runtime.sandbox.exec_stream import Watch
from sandbox_runtime.sandbox.run_protocol import IMAGE_FILES, PYTHON

__all__ = ["HostExecutorEngine", "HostPlace", "executor_path"]

logger = logging.getLogger(__name__)

_EXIT_WAIT_S = 5.0
_DIAGNOSTICS_MAX_BYTES = 8192
_END_WAIT_S = 2.0  # how long ending a session's processes may take before it gives up (and says so)


def executor_path() -> str:
    """``executor.py`` as the package carries it (the same file the image is built with)."""
    return str(Path(__file__).resolve().parent.parent.parent / "_data" / "images" / "executor" / "executor.py")


@dataclass(frozen=True)
class HostPlace:
    """Where a container's results folder is on this host: the path it has in a sandbox (``mount``) and the host
    folder that stands for it now."""

    mount: str
    folder: str

    def path(self, value: str) -> str:
        """An in-sandbox path (or any word of a command) as it is on the host: the results folder's rewritten."""
        inside = self.mount.rstrip("/")
        if value == inside or value.startswith(inside + "/"):
            return self.folder + value[len(inside) :]
        return value

    def argv(self, command: Sequence[str]) -> list[str]:
        """A command of the image as this host runs it: the image's interpreter is this process's own, the
        image's executor the package's copy, and paths in the results folder are the host folder's."""
        image_files = str(Path(executor_path()).parent)
        return [
            sys.executable
            if part == PYTHON
            else image_files + part[len(IMAGE_FILES) :]
            if part.startswith(IMAGE_FILES + "/")
            else self.path(part)
            for part in command
        ]

    def environment(self, environment: Mapping[str, str]) -> dict[str, str]:
        """A command's environment on the host: its paths rewritten; ``SANDBOX_RESULTS_MOUNT`` names the
        sandbox's path of the folder (``sandbox_tools`` opens the files a tool result names through it), and
        the processes a run starts find ``sandbox_tools`` as they do in the image (``PYTHONPATH``: the folder
        of the image's files)."""
        return {
            **{key: self.path(value) for key, value in environment.items()},
            "SANDBOX_RESULTS_MOUNT": self.mount,
            "PYTHONPATH": str(Path(executor_path()).parent),
        }


class _Held(NamedTuple):
    """An executor this engine started: its container, its process, and the host's end of its channel (closed by
    the channel's close: the executor then sees its stdin end and exits)."""

    container_id: str
    process: subprocess.Popen[bytes]
    channel: socket.socket


class HostExecutorEngine:
    """:class:`~sandbox_runtime.sandbox.executors.Engine` for containers that are records: executors are host
    processes. ``place(container_id)`` says where a container's folder is (SandboxGone: no such running
    container)."""

    muxed = False  # the socket carries the executor's stdout alone; its own stderr goes to the log

    def __init__(self, place: Callable[[str], HostPlace]) -> None:
        self._place = place
        self._processes: dict[str, _Held] = {}  # by exec id
        self._guard = threading.Lock()

    def open_exec(self, container_id: str, command: tuple[str, ...], request: RunRequest) -> tuple[object, str]:
        place = self._place(container_id)
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                [*place.argv(command), "--session"],
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=subprocess.PIPE,  # a pipe, as in an exec (a run's stderr replaces it; a file would not do)
                cwd="/",  # each run starts in its own folder; an idle executor holds none (it can be unmounted)
                env=place.environment(request.environment),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            ours.close()
            raise SandboxError(f"cannot start the executor of {container_id[:12]} on this host: {exc}") from exc
        finally:
            theirs.close()
        exec_id = secrets.token_hex(16)
        threading.Thread(target=_log_diagnostics, args=(container_id, process), daemon=True).start()
        with self._guard:
            self._processes = {key: held for key, held in self._processes.items() if held.process.poll() is None}
            self._processes[exec_id] = _Held(container_id, process, ours)
        return ours, exec_id

    def watch(self, container_id: str) -> Watch:
        del container_id  # a record has no first process, memory or pids to watch
        return Watch(0, False, lambda: None, lambda: None)

    def end_all(self, container_id: str, user: str) -> None:
        del user  # every process of the container's executors' sessions
        self.end_container(container_id)

    def exec_exit_code(self, exec_id: str) -> int | None:
        with self._guard:
            held = self._processes.get(exec_id)
        if held is None:
            return None
        try:
            code = held.process.wait(timeout=_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            return None
        return 128 - code if code < 0 else code

    def still_serves(self, container_id: str, user: str, watch: Watch) -> bool:
        del user, watch
        try:
            self._place(container_id)
        except SandboxError:
            return False
        return True

    def reap(self) -> None:
        """Wait (bounded) for the executors whose channels were closed: each exits once its stdin ends. One whose
        channel is open (serving a run or opening, for another runtime on this backend, say) is left to it."""
        with self._guard:
            closed = [held.process for held in self._processes.values() if held.channel.fileno() == -1]
        deadline = time.monotonic() + _EXIT_WAIT_S
        for process in closed:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
        with self._guard:
            self._processes = {key: held for key, held in self._processes.items() if held.process.poll() is None}

    def end_container(self, container_id: str) -> None:
        """End every process of the sessions of this container's executors (the executors with them), bounded."""
        with self._guard:
            processes = [held.process for held in self._processes.values() if held.container_id == container_id]
        sessions = {process.pid for process in processes}
        deadline = time.monotonic() + _END_WAIT_S
        while sessions:
            left = [pid for pid in _pids() if _session_of(pid) in sessions]
            if not left:
                break
            if time.monotonic() >= deadline:
                logger.warning("processes of %s outlived the end of its executors: %s", container_id[:12], left)
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            for process in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=0.01)
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=_EXIT_WAIT_S)


def _log_diagnostics(container_id: str, process: subprocess.Popen[bytes]) -> None:
    """What an executor writes on its own stderr (it never should: a crash), drained and logged."""
    if process.stderr is None:
        return
    with process.stderr:
        said = process.stderr.read(_DIAGNOSTICS_MAX_BYTES)
        while process.stderr.read(65536):
            pass
    if said:
        logger.warning("the executor of %s said: %s", container_id[:12], said.decode(errors="replace").strip())


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _session_of(pid: int) -> int | None:
    """The session of a live process (None: gone, or a zombie, which holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in (b"Z", b"X") else int(fields[3])
