"""Who claims a sandbox: the hold rules the manager applies, and the lock that makes a claim and a check of the
claims one step.

Each manager registers a lease in the state database and *holds* the conversations it uses (and the sandbox it
started or re-attached for one). A container is claimed by a live process's hold that names it, or (between its
start and the claim) by the lease of the process that started it (its ``LABEL_LEASE``). The rules:

* a container another live process claims is never removed here, whatever its policy, age or idleness: that
  process decides (it reaps its own idle sandboxes). "Made under another policy" is a removal reason only for a
  container no live process holds. When two live processes hold one sandbox, one that stopped using it lets go
  of its claim, and the last one reaps it.
* taking a hold and mounting, and checking the holds before a removal or an unmount, are each done under one
  lock per state directory (``STATE_DIR/mounts.lock``, ``flock``), so a check never races another process's
  claim.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from sandbox_runtime.errors import SandboxError
from sandbox_runtime.leases import HoldRecord
from sandbox_runtime.sandbox.backend import ContainerInfo

__all__ = ["LABEL_LEASE", "HostLock", "held_elsewhere", "own_hold"]

LABEL_LEASE = "io.sandbox-runtime.lease"  # the lease of the process that started the container
_HOST_LOCK_WAIT_S = 300.0  # held for a check or a mount (mkfs and mount: 60 s each at most); longer: a stuck holder


def own_hold(holds: list[HoldRecord], lease_id: str) -> HoldRecord | None:
    """The hold of ``lease_id`` among ``holds``."""
    return next((h for h in holds if h.lease_id == lease_id), None)


def held_elsewhere(info: ContainerInfo, holds: list[HoldRecord], lease_id: str) -> HoldRecord | None:
    """The hold by which a live process other than ``lease_id`` claims this container (``holds``: its
    conversation's live holds): one naming it, or that of the process that started it and has not named it yet
    (between the start and the claim)."""
    maker = info.labels.get(LABEL_LEASE)
    for hold in holds:
        if hold.lease_id == lease_id:
            continue
        if hold.container_id == info.id or (hold.container_id is None and hold.lease_id == maker):
            return hold
    return None


class HostLock:
    """One lock per state directory, over the threads of this process (an RLock: re-entrant) and the processes
    of this host (``flock`` on a file beside the state database). Every wait is bounded."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if not self._local.acquire(timeout=_HOST_LOCK_WAIT_S):
            raise SandboxError(f"{self.path} stayed locked by another thread for {_HOST_LOCK_WAIT_S:g} s")
        try:
            if self._depth == 0:
                self._fd = self._lock_file()
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    os.close(self._fd)  # closing the descriptor releases the flock
                    self._fd = None
        finally:
            self._local.release()

    def _lock_file(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + _HOST_LOCK_WAIT_S
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() >= deadline:
                    os.close(fd)
                    if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise SandboxError(
                            f"{self.path} stayed locked by another process for {_HOST_LOCK_WAIT_S:g} s"
                        ) from exc
                    raise
            time.sleep(pause)  # another process mounts or checks right now (milliseconds): a bounded wait
            pause = min(pause * 2, 0.05)
