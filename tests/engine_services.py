"""The engine services this project starts (``scripts/start-engine.sh``: dockerd; ``scripts/start-podman.sh``: the
Podman service), for the tests that stop one and start it again: which process is ours (by its pid file and its
command line), stopping it as a service manager does, and starting it the way scripts/setup.sh does.

A test touches only a service this project started: outside CI it skips when the service is someone else's, under
CI it fails (:meth:`EngineService.our_pid_or_skip`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["DOCKERD", "PODMAN_SERVICE", "EngineService"]

PROJECT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120
OUR_DOCKERD_CONFIG = "/etc/sandbox-runtime/dockerd.json"


@dataclass(frozen=True)
class EngineService:
    """One engine service that a script of this project starts, and how to tell its process from any other."""

    name: str
    pid_file: Path
    start_script: str  # in scripts/
    stop_wait_s: float  # how long the service may take to end after SIGTERM
    started_by_us: Callable[[list[bytes]], bool]  # the process's command line (NUL-split) is the one we start
    not_ours: str  # why a test refuses to touch the service, when it is not ours

    def our_pid(self) -> int | None:
        """The pid of the service our script started, else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if self.started_by_us(argv) else None

    def our_pid_or_skip(self) -> int:
        """The pid of the service our script started; when it is not ours, the test fails under CI and skips
        elsewhere."""
        pid = self.our_pid()
        if pid is None:
            if os.environ.get("CI"):
                pytest.fail(f"CI is set but {self.not_ours}")
            pytest.skip(self.not_ours)
        return pid

    def stop(self, pid: int) -> None:
        """Stop the service as a service manager does (SIGTERM), and wait until its process has ended."""
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_wait_s
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < deadline, f"{self.name} {pid} did not end within {self.stop_wait_s} s of SIGTERM"
            time.sleep(0.05)

    def start(self, log: Path) -> None:
        """Start the service again with its script (which waits until it answers); the script's output is appended
        to ``log`` (a file, never a pipe: the service it starts in the background must not hold our end open)."""
        with log.open("ab") as out:
            done = subprocess.run(
                ["bash", str(PROJECT / "scripts" / self.start_script)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=START_TIMEOUT_S,
                check=False,
            )
        assert done.returncode == 0, log.read_text()[-2000:]

    def restart(self, pid: int, log: Path) -> None:
        """Stop the service (:meth:`stop`) and start it again (:meth:`start`)."""
        self.stop(pid)
        self.start(log)


def _our_dockerd(argv: list[bytes]) -> bool:
    return Path(argv[0].decode()).name == "dockerd" and OUR_DOCKERD_CONFIG.encode() in argv


def _our_podman_service(argv: list[bytes]) -> bool:
    return argv[1:3] == [b"system", b"service"]


DOCKERD = EngineService(
    name="dockerd",
    pid_file=Path("/var/run/docker.pid"),
    start_script="start-engine.sh",
    stop_wait_s=60.0,
    started_by_us=_our_dockerd,
    not_ours=f"the Docker engine was not started by scripts/start-engine.sh (no dockerd with {OUR_DOCKERD_CONFIG})",
)

PODMAN_SERVICE = EngineService(
    name="the Podman service",
    pid_file=Path("/run/podman/sandbox-runtime-podman.pid"),
    start_script="start-podman.sh",
    stop_wait_s=30.0,
    started_by_us=_our_podman_service,
    not_ours="the Podman service was not started by scripts/start-podman.sh",
)
