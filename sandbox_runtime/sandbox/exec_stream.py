"""Reading a container's exec stream and watching the container meanwhile; no engine client needed here.

Docker multiplexes an exec's stdout and stderr on one socket as frames (an 8-byte header: stream number, three
zero bytes, payload length). The reader stops at EOF, a byte cap, a deadline, or when the container's first
process is gone; the watch samples the container's cgroup (memory, pids) while it lives. A :class:`Caller` (the
call's :class:`~sandbox_runtime.control.CallControl`) is served from the same loop: a cancel ends every process
of the command and the stream is then read to its end (bounded), and progress is reported about once a second.
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NamedTuple

from sandbox_runtime.control import CallControl

__all__ = ["Caller", "Demux", "Frames", "Watch", "oom_kills", "read_cgroup_file", "read_frames"]

_HEADER = struct.Struct(">BxxxL")
_STDOUT, _STDERR = 1, 2
_WATCH_INTERVAL_S = 0.2
# progress goes out every 0.7 s at the earliest; the loop wakes at least every _WATCH_INTERVAL_S, so the gap
# between two reports stays under a second (and never below half of one)
_PROGRESS_INTERVAL_S = 0.7
_CANCEL_DRAIN_S = 1.0  # after the processes were ended, how long the rest of the stream may take to arrive
_CGROUP_ROOT = Path("/sys/fs/cgroup")


# where the engine's cgroups live: Docker's or Podman's, cgroupfs or systemd, v1 or v2 (the first layout that
# answered is tried first)
_CGROUP_LAYOUTS = [
    "{root}/{controller}/docker/{id}/{v1}",
    "{root}/docker/{id}/{v2}",
    "{root}/{controller}/system.slice/docker-{id}.scope/{v1}",
    "{root}/system.slice/docker-{id}.scope/{v2}",
    "{root}/{controller}/libpod_parent/libpod-{id}/{v1}",
    "{root}/libpod_parent/libpod-{id}/{v2}",
    "{root}/{controller}/machine.slice/libpod-{id}.scope/{v1}",
    "{root}/machine.slice/libpod-{id}.scope/{v2}",
]


def read_cgroup_file(container_id: str, controller: str, v1_name: str, v2_name: str) -> str | None:
    """Read a cgroup file of a Docker or Podman container under the cgroupfs or systemd layouts, v1 or v2."""
    for layout in list(_CGROUP_LAYOUTS):
        path = layout.format(root=_CGROUP_ROOT, controller=controller, id=container_id, v1=v1_name, v2=v2_name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            text = os.read(fd, 65536).decode(errors="replace").strip()
        except OSError:
            continue
        finally:
            os.close(fd)
        if layout is not _CGROUP_LAYOUTS[0]:
            with contextlib.suppress(ValueError):
                _CGROUP_LAYOUTS.remove(layout)
                _CGROUP_LAYOUTS.insert(0, layout)
        return text
    return None


def oom_kills(container_id: str) -> int | None:
    """How many processes the kernel's OOM killer ended in the container's cgroup (None: no counter here)."""
    text = read_cgroup_file(container_id, "memory", "memory.oom_control", "memory.events")
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return None


class Watch:
    """Watches a container during an exec: is its first process alive, how much memory and how many pids.

    gVisor can end a whole sandbox (memory or pids exhausted) while Docker still calls it running and the
    exec stream stays open; the first process's disappearance from the host's /proc shows it. The cgroup goes
    with the sandbox, so memory and pids are sampled while it lives. Where the engine's processes are not
    visible (Docker Desktop's VM, rootless engines) ``alive`` always answers True.
    """

    def __init__(
        self, pid: int, visible: bool, memory: Callable[[], str | None], pids: Callable[[], str | None]
    ) -> None:
        self._proc = Path(f"/proc/{pid}")
        self._visible = visible
        try:
            self._started = self._proc.stat().st_ctime
        except OSError:
            self._started = -1.0  # already gone
        self._memory, self._pids = memory, pids
        self._last = 0.0
        self.memory_bytes_seen: int | None = None
        self.pids_seen: int | None = None

    def alive(self) -> bool:
        if not self._visible:
            return True
        try:
            return self._proc.stat().st_ctime == self._started
        except OSError:
            return False

    def due(self) -> bool:
        return time.monotonic() - self._last >= _WATCH_INTERVAL_S

    def sample(self) -> bool:
        """Record memory and pids; False when the container's first process is gone."""
        self._last = time.monotonic()
        for reader, name in ((self._memory, "memory_bytes_seen"), (self._pids, "pids_seen")):
            text = reader()
            if text and text.isdigit():
                setattr(self, name, max(int(text), getattr(self, name) or 0))
        return self.alive()


class Caller:
    """The caller of an exec, as the read loop serves it: its cancel, and its progress (throttled).

    ``end_all`` ends every process of the command (it returns once they are gone, or gives up on its own
    deadline); the stream then reaches its end by itself.
    """

    def __init__(self, control: CallControl, started: float, total_s: float, end_all: Callable[[], None]) -> None:
        self._control = control
        self._started = started
        self._total_s = total_s
        self._end_all = end_all
        self._last_report = started

    def cancelled(self) -> bool:
        return self._control.is_cancelled

    def end_all(self) -> None:
        self._end_all()

    def pace(self, output_bytes: int) -> None:
        """Report progress when it is due: seconds elapsed, of the total, and the bytes printed so far."""
        if self._control.progress is None:
            return
        now = time.monotonic()
        if now - self._last_report < _PROGRESS_INTERVAL_S:
            return
        self._last_report = now
        elapsed = now - self._started
        self._control.report(
            elapsed, self._total_s, f"{elapsed:.1f} s elapsed, {output_bytes:,} bytes of output so far"
        )


class Demux:
    """Docker's attach stream cut into (stream number, payload) frames, fed a chunk at a time."""

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        self._pending += chunk
        frames: list[tuple[int, bytes]] = []
        while len(self._pending) >= _HEADER.size:
            kind, size = _HEADER.unpack_from(self._pending)
            if len(self._pending) < _HEADER.size + size:
                break
            frames.append((kind, bytes(self._pending[_HEADER.size : _HEADER.size + size])))
            del self._pending[: _HEADER.size + size]
        return frames


class Frames(NamedTuple):
    stdout: bytearray
    stderr: bytearray
    totals: tuple[int, int]
    over_cap: Literal["stdout", "stderr"] | None
    stop: Literal["eof", "cap", "deadline", "died"]
    cancelled: bool = False


def read_frames(
    sock: Any, deadline: float, caps: tuple[int, int], watch: Watch, caller: Caller | None = None
) -> Frames:
    """Demultiplex Docker's attach stream until EOF, a cap, the deadline, or the container's death.

    When the caller cancels, its processes are ended and the rest of the stream is read for at most
    ``_CANCEL_DRAIN_S`` more (then ``stop`` is ``deadline``: something kept the stream open).
    """
    buffers = {_STDOUT: bytearray(), _STDERR: bytearray()}
    limits = {_STDOUT: caps[0], _STDERR: caps[1]}
    totals = {_STDOUT: 0, _STDERR: 0}
    demux = Demux()
    fd = sock.fileno()
    cancelled = False

    def frames(over_cap: Literal["stdout", "stderr"] | None, stop: Literal["eof", "cap", "deadline", "died"]) -> Frames:
        totals_seen = (totals[_STDOUT], totals[_STDERR])
        return Frames(buffers[_STDOUT], buffers[_STDERR], totals_seen, over_cap, stop, cancelled)

    while True:
        if caller is not None and not cancelled:
            if caller.cancelled():
                cancelled = True
                caller.end_all()
                deadline = min(deadline, time.monotonic() + _CANCEL_DRAIN_S)
            else:
                caller.pace(totals[_STDOUT] + totals[_STDERR])
        left = deadline - time.monotonic()
        if left <= 0:
            return frames(None, "deadline")
        if watch.due() and not watch.sample():
            return frames(None, "died")
        ready, _, _ = select.select([fd], [], [], min(left, _WATCH_INTERVAL_S))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return frames(None, "eof")
        for kind, payload in demux.feed(chunk):
            if kind not in buffers:
                continue
            totals[kind] += len(payload)
            room = limits[kind] - len(buffers[kind])
            buffers[kind] += payload[: max(room, 0)]
            if totals[kind] > limits[kind]:
                return frames("stdout" if kind == _STDOUT else "stderr", "cap")
