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
  conversation's lock across the processes that share the state (the state engine's named lock: a file under
  ``STATE_DIR/locks`` with SQLite, an advisory lock with PostgreSQL), so a check never races another process's
  claim. It is one lock per conversation: one conversation's volume being
  made or mounted (seconds) holds up nobody else.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator

from sandbox_runtime.errors import SandboxError
from sandbox_runtime.sandbox.backend import ContainerInfo
from sandbox_runtime.state.leases import HoldRecord
from sandbox_runtime.state.locks import OuterLock

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
    """The lock of each conversation across the processes that share the state: ``locks(conversation_id)`` is a
    context manager holding it; :meth:`run_lock` is its run lock, apart from it. Any label value is a safe key (one
    that is not a conversation id is named by a hash)."""

    def __init__(self, outer: Callable[[str], OuterLock]) -> None:
        self._outer = outer  # the state engine's named locks (StateEngine.lock)
        self._locks: dict[str, HostLock] = {}
        self._guard = threading.Lock()

    def _lock(self, conversation_id: str, suffix: str = ".lock") -> HostLock:
        name = (conversation_id if _PLAIN_NAME.fullmatch(conversation_id) else "_" + _digest(conversation_id)) + suffix
        with self._guard:
            lock = self._locks.get(name)
            if lock is None:
                lock = self._locks[name] = HostLock(name, self._outer(name))
            return lock

    def __call__(self, conversation_id: str) -> contextlib.AbstractContextManager[None]:
        return self._lock(conversation_id)()

    def run_lock(self, conversation_id: str) -> HostLock:
        """The lock of the conversation's runs (``<conversation>.run.lock``), apart from its claims."""
        return self._lock(conversation_id, ".run.lock")

    def remove(self, conversation_id: str) -> None:
        """Forget the conversation's locks (it is being deleted; a lock file is removed): a process that holds one
        or waits for it takes it again afresh."""
        for lock in (self._lock(conversation_id), self.run_lock(conversation_id)):
            with lock():
                lock.outer.forget()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class HostLock:
    """One lock over the threads of this process (an RLock: re-entrant) and the processes that share the state
    (``outer``: a file's ``flock`` or a database's advisory lock, :mod:`~sandbox_runtime.state.locks`). Every wait
    is bounded."""

    def __init__(self, name: str, outer: OuterLock) -> None:
        self.name = name
        self.outer = outer
        self._local = threading.RLock()
        self._depth = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if not self.take(_HOST_LOCK_WAIT_S):
            raise SandboxError(
                f"the lock {self.name} stayed taken by another thread or process for {_HOST_LOCK_WAIT_S:g} s"
            )
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
            try:
                taken = self.outer.take(deadline)
            except BaseException:
                self._local.release()
                raise
            if not taken:
                self._local.release()
                return False
        self._depth += 1
        return True

    def give_back(self) -> None:
        """Release one :meth:`take` (the outer lock goes with the last)."""
        self._depth -= 1
        try:
            if self._depth == 0:
                self.outer.give_back()
        finally:
            self._local.release()


class RunLock:
    """One run of a conversation at a time: across the threads of this process (``local``, the conversation's own
    lock, which its other work and the reaper take too) and the processes that share the state (``shared``, a
    :class:`HostLock` of its own, so that a run never holds up a claim or a mount). ``acquire`` and ``release`` as
    a ``threading.RLock``'s."""

    def __init__(self, local: threading.RLock, shared: HostLock) -> None:
        self._local = local
        self._shared = shared

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take both, waiting at most ``timeout`` seconds in all (``-1``: until they are free)."""
        deadline = None if timeout < 0 else time.monotonic() + timeout
        if not self._local.acquire(blocking, timeout):
            return False
        while True:
            left = 0.0 if not blocking else _RUN_LOCK_POLL_S if deadline is None else deadline - time.monotonic()
            if self._shared.take(max(left, 0.0)):
                return True
            if not blocking or (deadline is not None and time.monotonic() >= deadline):
                self._local.release()
                return False

    def release(self) -> None:
        self._shared.give_back()
        self._local.release()
