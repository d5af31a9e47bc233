"""Named locks across the processes that share a state: what a conversation's claim lock and run lock are made of
outside this process (:class:`~sandbox_runtime.sandbox.holds.HostLock` adds the threads of this one).

Each engine gives its own (``StateEngine.lock``): with SQLite, whose processes share one host, a file under
``STATE_DIR/locks`` held by ``flock`` (:class:`FileLock`); with PostgreSQL, whose replicas may be on many hosts,
a session-level advisory lock on the server (:mod:`~sandbox_runtime.state.postgresql`). Either way a process that
dies lets go of its locks at once (its descriptors close; its session ends), and every wait is bounded.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

__all__ = ["FileLock", "OuterLock", "poll_until", "try_flock"]


class OuterLock(Protocol):
    """One named lock across processes; taken by one thread of a process at a time (its caller sees to that)."""

    def take(self, deadline: float) -> bool:
        """Take it, waiting until ``deadline`` (``time.monotonic()``) at most; False when it stayed taken."""
        ...

    def give_back(self) -> None: ...

    def forget(self) -> None:
        """The name is no longer used (its conversation is being deleted); called while it is held."""
        ...


def poll_until(deadline: float, attempt: Callable[[], bool]) -> bool:
    """Try ``attempt`` until it succeeds or ``deadline`` passes, pausing 1 ms at first and at most 50 ms between
    tries (another process holds the lock right now: a bounded wait, there is nothing to be woken by)."""
    pause = 0.001
    while True:
        if attempt():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


class FileLock:
    """``flock`` on a file. A lock file removed while it was waited for is taken again from the file now at its
    path, so that removing it (:meth:`forget`) never lets two holders in."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def take(self, deadline: float) -> bool:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                taken = poll_until(deadline, lambda: try_flock(fd))  # noqa: B023  (called before fd changes)
            except BaseException:
                os.close(fd)
                raise
            if not taken:
                os.close(fd)
                return False
            held = os.fstat(fd)
            try:
                now = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                self._fd = fd
                return True
            os.close(fd)  # the file was removed (its conversation deleted) while this waited: take the new one

    def give_back(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def forget(self) -> None:
        self.path.unlink(missing_ok=True)


def try_flock(fd: int) -> bool:
    """Take the ``flock`` on a descriptor if no other holds it (never waits); whether it was taken."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return False
    return True
