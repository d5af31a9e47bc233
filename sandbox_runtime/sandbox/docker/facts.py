"""Engine facts: what the Docker engine's JSON says, as our models, and the facts read beside it; no engine client
here (only :mod:`~sandbox_runtime.sandbox.docker.backend` talks to the engine)."""

from __future__ import annotations

import functools
import socket
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandbox_runtime.sandbox.backend import ContainerInfo, EngineInfo

__all__ = ["container_info", "engine_info", "knock", "pid_in_container", "runtime_version"]


def knock(base_url: str, timeout_s: float) -> None:
    """Connect to a local engine's socket once, and close it: docker-py leaks the socket of a connection that
    fails (an unraisable ResourceWarning at garbage collection), so an engine that is not there is found here.
    Raises ConnectionError."""
    scheme, _, path = base_url.partition("://")
    if scheme not in ("unix", "http+unix"):
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
        except OSError as exc:
            raise ConnectionError(f"{path}: {exc.strerror or exc}") from exc


def container_info(attrs: Mapping[str, Any], warnings: tuple[str, ...] = ()) -> ContainerInfo:
    """A container as the inspect endpoint (``State`` a mapping) or the list endpoint (a plain string) gives it."""
    state = attrs.get("State") or {}
    config = attrs.get("Config") or {}
    if isinstance(state, str):
        running = state == "running"
        status, exit_code, oom_killed = state, None, False
        labels = attrs.get("Labels") or {}
    else:
        running = bool(state.get("Running"))
        status = str(state.get("Status", "unknown"))
        exit_code = state.get("ExitCode")
        oom_killed = bool(state.get("OOMKilled"))
        labels = config.get("Labels") or {}
    return ContainerInfo(
        id=str(attrs["Id"]),
        labels=dict(labels),
        running=running,
        status=status,
        exit_code=exit_code,
        oom_killed=oom_killed,
        warnings=warnings,
    )


def engine_info(info: Mapping[str, Any], version: Mapping[str, Any]) -> EngineInfo:
    """The engine's facts from its ``/info`` and ``/version`` answers."""
    runtimes = info.get("Runtimes") or {}
    return EngineInfo(
        engine_version=str(version.get("Version", "?")),
        api_version=str(version.get("ApiVersion", "?")),
        kernel_version=str(info.get("KernelVersion", "?")),
        operating_system=str(info.get("OperatingSystem", "?")),
        cgroup_version=str(info.get("CgroupVersion", "1")),
        cgroup_driver=str(info.get("CgroupDriver", "?")),
        runtimes=tuple(sorted(runtimes.keys())),
        default_runtime=str(info.get("DefaultRuntime", "runc")),
        runc_version=(info.get("RuncCommit") or {}).get("ID") or None,
        runsc_version=runtime_version(runtimes.get("runsc") or {}),
        security_options=tuple(str(item) for item in info.get("SecurityOptions") or ()),
        warnings=tuple(str(item) for item in info.get("Warnings") or ()),
    )


def pid_in_container(pid: int, container_id: str) -> bool:
    """Whether host pid ``pid`` is a live process of this container (its cgroup names the container)."""
    try:
        return pid > 0 and container_id in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False


def runtime_version(runtime: Mapping[str, Any]) -> str | None:
    """``runsc --version``'s first line, when the runtime's binary is on this host (asked once per process for
    each version of the binary: a binary replaced in place has another inode, size or modification time)."""
    path = runtime.get("path")
    try:
        found = Path(path).stat() if path else None
    except OSError:
        return None
    if found is None or not stat.S_ISREG(found.st_mode):
        return None
    return _version_of(str(path), (found.st_ino, found.st_size, found.st_mtime_ns))


@functools.lru_cache(maxsize=16)
def _version_of(path: str, _identity: tuple[int, int, int]) -> str | None:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.splitlines()[0] if done.returncode == 0 and done.stdout else None
