"""Who claims a sandbox: the hold rules the manager applies, the lock that makes a claim and a check of the
claims one step, the per-conversation locks of one process, and the run lock (:class:`RunLock`: one run of a
conversation at a time, across the processes that share its state directory).

Each manager registers a lease in the state database and *holds* the conversations it uses (and the sandbox it
started or re-attached for one). A container is claimed by a live process's hold that names it, or (between its
start and the claim) by the lease of the process that started it (its ``LABEL_LEASE``). The rules:

* a container another live process claims is never removed here, whatever its policy, age or idleness: that
  process decides (it reaps its own idle sandboxes). "Made under another policy" is a removal reason only for a
  container no live process holds. When two live processes hold one sandbox, one that stopped using it lets go
  of its claim, and the last one reaps it.
* taking a hold and mounting, and checking the holds before a removal or an unmount, are each done under the
  conversation's lock across the processes of the host (``STATE_DIR/locks/<conversation>.lock``, ``flock``), so
  a check never races another process's claim. It is one lock per conversation: one conversation's volume being
  made or mounted (seconds) holds up nobody else.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from sandbox_runtime.errors import SandboxError
from sandbox_runtime.sandbox.backend import ContainerInfo
from sandbox_runtime.state.leases import HoldRecord

__all__ = ["LABEL_LEASE", "ConversationLocks", "HostLock", "HostLocks", "RunLock", "held_elsewhere", "own_hold"]

LABEL_LEASE = "io.sandbox-runtime.lease"  # the lease of the process that started the container
_HOST_LOCK_WAIT_S = 300.0  # held for a check or a mount (mkfs and mount: 60 s each at most); longer: a stuck holder
_RUN_LOCK_POLL_S = 1.0  # a run lock waited for without a limit: taken in steps of this
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


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


class ConversationLocks:
    """One re-entrant lock per conversation in this process: whoever holds it may use or change the
    conversation's sandbox and folders; the reaper skips a conversation whose lock is taken (it is in use)."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()

    def __call__(self, conversation_id: str) -> threading.RLock:
        with self._guard:
            return self._locks.setdefault(conversation_id, threading.RLock())


class HostLocks:
    """The host-wide lock of each conversation of a state directory: ``locks(conversation_id)`` is a context
    manager holding it. Any label value is a safe key (one that is not a conversation id names its file by a
    hash)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._locks: dict[str, HostLock] = {}
        self._guard = threading.Lock()

    def _lock(self, conversation_id: str, suffix: str = ".lock") -> HostLock:
        name = conversation_id if _PLAIN_NAME.fullmatch(conversation_id) else "_" + _digest(conversation_id)
        with self._guard:
            lock = self._locks.get(name + suffix)
            if lock is None:
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                lock = self._locks[name + suffix] = HostLock(self.directory / f"{name}{suffix}")
            return lock

    def __call__(self, conversation_id: str) -> contextlib.AbstractContextManager[None]:
        return self._lock(conversation_id)()

    def run_file(self, conversation_id: str) -> HostLock:
        """The lock file of the conversation's runs (``<conversation>.run.lock``), apart from its claims."""
        return self._lock(conversation_id, ".run.lock")

    def remove(self, conversation_id: str) -> None:
        """Remove the conversation's lock files (it is being deleted); a process that holds one or waits for it
        takes it again from a new file."""
        for lock in (self._lock(conversation_id), self.run_file(conversation_id)):
            with lock():
                lock.path.unlink(missing_ok=True)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class HostLock:
    """One lock over the threads of this process (an RLock: re-entrant) and the processes of this host (``flock``
    on a file). Every wait is bounded. A lock file removed while it was waited for is taken again from the file
    now at its path, so that removing it never lets two holders in."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if not self.take(_HOST_LOCK_WAIT_S):
            raise SandboxError(f"{self.path} stayed locked by another thread or process for {_HOST_LOCK_WAIT_S:g} s")
        try:
            yield
        finally:
            self.give_back()

    def take(self, timeout_s: float) -> bool:
        """Take the lock (again, in the thread that holds it), waiting at most ``timeout_s`` seconds; False when
        another thread or process held it all that time."""
        deadline = time.monotonic() + timeout_s
        if not self._local.acquire(timeout=max(timeout_s, 0.0)):
            return False
        if self._depth == 0:
            fd = self._lock_file(deadline)
            if fd is None:
                self._local.release()
                return False
            self._fd = fd
        self._depth += 1
        return True

    def give_back(self) -> None:
        """Release one :meth:`take` (the file's lock goes with the last)."""
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
        self._local.release()

    def _lock_file(self, deadline: float) -> int | None:
        while True:
            fd = self._wait_for(deadline)
            if fd is None:
                return None
            held = os.fstat(fd)
            try:
                now = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                return fd
            os.close(fd)  # the file was removed (its conversation deleted) while this waited: take the new one

    def _wait_for(self, deadline: float) -> int | None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(pause)  # another process holds it right now: a bounded wait
            pause = min(pause * 2, 0.05)


class RunLock:
    """One run of a conversation at a time: across the threads of this process (``local``, the conversation's own
    lock, which its other work and the reaper take too) and the processes that share the state directory
    (``file``, a :class:`HostLock` of its own, so that a run never holds up a claim or a mount). ``acquire`` and
    ``release`` as a ``threading.RLock``'s."""

    def __init__(self, local: threading.RLock, file: HostLock) -> None:
        self._local = local
        self._file = file

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take both, waiting at most ``timeout`` seconds in all (``-1``: until they are free)."""
        deadline = None if timeout < 0 else time.monotonic() + timeout
        if not self._local.acquire(blocking, timeout):
            return False
        while True:
            left = 0.0 if not blocking else _RUN_LOCK_POLL_S if deadline is None else deadline - time.monotonic()
            if self._file.take(max(left, 0.0)):
                return True
            if not blocking or (deadline is not None and time.monotonic() >= deadline):
                self._local.release()
                return False

    def release(self) -> None:
        self._file.give_back()
        self._local.release()
