"""Engine services of a test's own, for the tests that stop one and start it again: a private ``dockerd``
(``scripts/start-engine.sh``) and a private Podman service (``scripts/start-podman.sh``), each started by its
script with the variables that name its own folders, so stopping it disturbs no other test (the suite's parallel
workers keep using the machine's engines meanwhile).

A service instance is its pid file, its socket and the variables its script is started with
(:class:`EngineService`); it is stopped as a service manager stops it (SIGTERM to the pid its pid file names, once
the process there is the one we started) and started again the same way its script starts it.
:func:`private_dockerd` and :func:`private_podman_service` start one and, whatever happened, remove all of it
afterwards: the containers the session made there (by its label), the service (by its pid), and for a dockerd
what it mounted and its folders.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_runtime.sandbox.docker.backend import DockerBackend
from sandbox_runtime.sandbox.podman.backend import PodmanBackend

__all__ = ["DOCKERD_STOP_WAIT_S", "EngineService", "private_dockerd", "private_podman_service"]

PROJECT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120
DOCKERD_STOP_WAIT_S = 60.0  # dockerd stops every container first (up to its shutdown timeout)
PODMAN_STOP_WAIT_S = 30.0
OUR_DOCKERD_CONFIG = "/etc/sandbox-runtime/dockerd.json"
SOCKET_PATH_MAX = 107  # bytes in a unix socket's path (sun_path less its NUL)


@dataclass(frozen=True)
class EngineService:
    """One instance of an engine service a script of this project starts: where its pid file and socket are, the
    variables its script is given to start this instance, and how to tell its process from any other."""

    name: str
    start_script: str  # in scripts/
    pid_file: Path
    socket: Path
    start_env: Mapping[str, str]  # the script's variables that name this instance's folders
    stop_wait_s: float  # how long the service may take to end after SIGTERM
    started_by_us: Callable[[list[bytes]], bool]  # the process's command line (NUL-split) is this instance's

    @property
    def address(self) -> str:
        """The socket as a client names it (``DOCKER_HOST`` / ``CONTAINER_HOST``)."""
        return f"unix://{self.socket}"

    def our_pid(self) -> int | None:
        """The pid of this instance's process, else None (not running, or the pid file names another process)."""
        try:
            pid = int(self.pid_file.read_text().strip())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if self.started_by_us(argv) else None

    def pid(self) -> int:
        """The pid of this instance's process, which runs."""
        pid = self.our_pid()
        assert pid is not None, f"{self.name} ({self.pid_file}) does not run"
        return pid

    def stop(self, pid: int) -> None:
        """Stop the service as a service manager does (SIGTERM), and wait until its process has ended."""
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_wait_s
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < deadline, f"{self.name} {pid} did not end within {self.stop_wait_s} s of SIGTERM"
            time.sleep(0.05)

    def start(self, log: Path) -> None:
        """Start the service with its script (which waits until it answers); the script's output is appended to
        ``log`` (a file, never a pipe: the service it starts in the background must not hold our end open)."""
        with log.open("ab") as out:
            done = subprocess.run(
                ["bash", str(PROJECT / "scripts" / self.start_script)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.start_env},
                timeout=START_TIMEOUT_S,
                check=False,
            )
        assert done.returncode == 0, log.read_text()[-2000:]

    def restart(self, pid: int, log: Path) -> None:
        """Stop the service (:meth:`stop`) and start it again (:meth:`start`)."""
        self.stop(pid)
        self.start(log)

    def start_if_stopped(self, log: Path) -> None:
        """Start the service again if it does not run (a test that failed between a stop and its start: the
        runtimes' clean-up after it needs the engine)."""
        if self.our_pid() is None:
            self.start(log)


def _our_dockerd(pid_file: Path) -> Callable[[list[bytes]], bool]:
    def started_by_us(argv: list[bytes]) -> bool:
        return (
            Path(argv[0].decode()).name == "dockerd"
            and OUR_DOCKERD_CONFIG.encode() in argv
            and str(pid_file).encode() in argv
        )

    return started_by_us


def _our_podman_service(socket: Path) -> Callable[[list[bytes]], bool]:
    def started_by_us(argv: list[bytes]) -> bool:
        return argv[1:3] == [b"system", b"service"] and f"unix://{socket}".encode() in argv

    return started_by_us


def _needs(program: str, *, root: bool) -> None:
    """A private engine needs ``program`` (and root, for dockerd): without it the test skips, or fails under CI."""
    missing = shutil.which(program) is None
    if missing or (root and os.geteuid() != 0):
        why = f"{program} is not installed" if missing else f"a private {program} needs root"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {why}")
        pytest.skip(why)


@contextlib.contextmanager
def _short_folder(preferred: Path, longest_below: int) -> Iterator[Path]:
    """``preferred`` when a unix socket ``longest_below`` bytes below it fits; else a short folder of its own in the
    system's temporary folder, removed afterwards."""
    if len(os.fsencode(preferred)) + longest_below <= SOCKET_PATH_MAX:
        yield preferred
        return
    folder = Path(tempfile.mkdtemp(prefix="sr-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _stopped(service: EngineService) -> None:
    """Stop the instance if it runs (by the pid its pid file names, once that is its process)."""
    pid = service.our_pid()
    if pid is not None:
        service.stop(pid)


def _processes_naming(folder: Path) -> list[int]:
    """Processes whose command line names a path in ``folder`` (a folder only our instance uses: its containerd,
    its shims, gVisor's sandbox and gofer processes)."""
    below = os.fsencode(folder) + b"/"
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if below in proc.joinpath("cmdline").read_bytes():
                    found.append(int(proc.name))
    return found


def _force_delete_containers(exec_root: Path) -> None:
    """Containers a dockerd that did not stop cleanly left running, deleted by force by their OCI runtime (their
    processes killed, their cgroups removed: a container's own processes do not name our folder). Each is in the
    runtime state folder under the engine's exec root, ``runtime-runc/<containerd namespace>/``: runc's as
    ``<id>/state.json``, gVisor's (runsc, started by the same shim) as ``<id>_sandbox:<id>.state``."""
    for root in sorted(exec_root.glob("runtime-*/*")):
        found = [("runc", state.parent.name) for state in root.glob("*/state.json")]
        found += [("runsc", state.name.partition("_sandbox:")[0]) for state in root.glob("*_sandbox:*.state")]
        for runtime, container in found:
            subprocess.run(
                [runtime, "--root", str(root), "delete", "--force", container],
                capture_output=True,
                timeout=60,
                check=False,
            )


def _end_processes_naming(path: Path, wait_s: float = 10.0) -> None:
    """SIGTERM, then (after ``wait_s``) SIGKILL, each process that names ``path``, by its pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _processes_naming(path)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
            time.sleep(0.05)
        if not pids:
            return


def _unmount_below(folder: Path) -> None:
    """Unmount what is mounted at or below ``folder``, deepest first (a daemon killed mid-way may leave mounts)."""
    below = os.fsencode(folder)
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_bytes().splitlines()]
    for mountpoint in sorted((m for m in mounts if m == below or m.startswith(below + b"/")), reverse=True):
        subprocess.run(["umount", "-l", mountpoint], capture_output=True, timeout=30, check=False)


def _remove_labelled(backend_class: type[DockerBackend], address: str, labels: dict[str, str]) -> None:
    """Remove the containers carrying ``labels`` on the engine at ``address``, if it answers."""
    variable = "CONTAINER_HOST" if backend_class is PodmanBackend else "DOCKER_HOST"
    with contextlib.suppress(Exception):  # an engine a failed test left stopped: its process is ended below
        backend = backend_class({variable: address}, timeout_s=30)
        try:
            for info in backend.list_containers(labels):
                backend.remove(info.id)
        finally:
            backend.close()


@contextlib.contextmanager
def private_dockerd(data_dir: Path, labels: dict[str, str]) -> Iterator[EngineService]:
    """A dockerd of its own, started by scripts/start-engine.sh (our config file, no bridge, no iptables): its
    data root and log in ``data_dir``, its socket, pid file and exec root (its own containerd's sockets) in a
    short folder of its own under the system's temporary folder. Afterwards, whatever happened: the containers with
    ``labels`` on it are removed, it is stopped (by its pid); containers a dockerd that did not stop cleanly left
    are deleted by force by their runtime, and what still names its folder (its containerd, shims) is ended by pid;
    what is mounted below its folders is unmounted, and its run folder and data root are removed (its logs stay in
    ``data_dir``)."""
    _needs("dockerd", root=True)
    run_dir = Path(tempfile.mkdtemp(prefix="sr-dockerd-"))
    service = EngineService(
        name="the private dockerd",
        start_script="start-engine.sh",
        pid_file=run_dir / "docker.pid",
        socket=run_dir / "docker.sock",
        start_env={"SANDBOX_RUNTIME_DOCKERD_RUN_DIR": str(run_dir), "SANDBOX_RUNTIME_DOCKERD_DATA_DIR": str(data_dir)},
        stop_wait_s=DOCKERD_STOP_WAIT_S,
        started_by_us=_our_dockerd(run_dir / "docker.pid"),
    )
    try:
        service.start(data_dir / "start-engine.log")
        yield service
    finally:
        try:
            _remove_labelled(DockerBackend, service.address, labels)
            _stopped(service)
        finally:
            _force_delete_containers(run_dir / "exec")
            _end_processes_naming(run_dir)
            for folder in (run_dir, data_dir):
                _unmount_below(folder)
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(data_dir / "data", ignore_errors=True)


@contextlib.contextmanager
def private_podman_service(folder: Path, labels: dict[str, str]) -> Iterator[EngineService]:
    """A ``podman system service`` of its own on Podman's usual storage, started by scripts/start-podman.sh (our
    containers.conf settings, in ``folder``): its socket, pid file and log in ``folder`` (or in a short folder of its
    own when a socket there would be too long). Afterwards, whatever happened: the containers with ``labels`` are
    removed (through it) and it is stopped (by its pid)."""
    _needs("podman", root=False)
    with _short_folder(folder, len(b"/podman.sock")) as run_dir:
        socket = run_dir / "podman.sock"
        service = EngineService(
            name="the private Podman service",
            start_script="start-podman.sh",
            pid_file=run_dir / "sandbox-runtime-podman.pid",
            socket=socket,
            start_env={"SANDBOX_RUNTIME_PODMAN_RUN_DIR": str(run_dir)},
            stop_wait_s=PODMAN_STOP_WAIT_S,
            started_by_us=_our_podman_service(socket),
        )
        try:
            service.start(folder / "start-podman.log")
            yield service
        finally:
            try:
                _remove_labelled(PodmanBackend, service.address, labels)
            finally:
                _stopped(service)
