"""The warm pool: sandboxes started ahead of need, each handed whole to one new conversation.

A pooled sandbox is started like any other (the same profile, after the same self-check) on a results folder of
its own, a *slot* that the folders' owner makes with its quota volume; its resident executor is loaded before it
counts as ready. It carries its slot (``LABEL_POOL_SLOT``) instead of a conversation, and this process's lease.

A new conversation *takes* one (:meth:`WarmPool.take`): the folders' owner moves the slot's folder to the
conversation's place (a rename on the host: the container's bind mount follows the folder, not its path) and the
manager records the sandbox as the conversation's (:meth:`SandboxManager.adopt`). It is never given back: it
ends like any conversation's sandbox (close, reap, delete), and is replaced instead of restarted (a restart would
bind the slot's old path again). No pooled sandbox ever serves a second conversation.

The pool's job (:meth:`WarmPool.tend`) keeps ``pool.ready_count`` sandboxes ready: it is woken after every take,
replaces one that waited longer than ``pool.max_wait_s`` or stopped, and after a failed start tries again only
after ``pool.retry_after_s``. :meth:`WarmPool.close` (with the runtime) removes every sandbox still waiting, with its
slot. Pooled sandboxes of a process that ended are removed by any runtime's start-up sweep and ``gc``, whatever
their policy (:meth:`SandboxManager.sweep_orphans`); a live process's pool is its own, so a runtime started under
another policy never takes a sandbox made under the old one.
"""

from __future__ import annotations

import collections
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

from sandbox_runtime.errors import SandboxRuntimeError
from sandbox_runtime.policy import PoolPolicy
from sandbox_runtime.sandbox.backend import RunRequest
from sandbox_runtime.sandbox.labels import LABEL_CREATED_AT, LABEL_POOL_SLOT
from sandbox_runtime.sandbox.manager import SandboxManager
from sandbox_runtime.sandbox.manager_models import ResultsFolder

__all__ = ["Pooled", "SlotFolders", "WarmPool"]

logger = logging.getLogger(__name__)

_TEND_INTERVAL_MAX_S = 60.0  # the job also looks unasked this often (stale or stopped sandboxes, a retry)
# close waits this long for a start in flight (a self-check, a sandbox start and its executor: seconds; a loaded
# host: tens); what is left after it is removed by the owner's close all the same (its slots, by lease)
_CLOSE_WAIT_S = 120.0


class Pooled(NamedTuple):
    """A ready sandbox in the pool: its slot, its container, when it was made (wall clock) and became ready
    (monotonic)."""

    slot: str
    container_id: str
    created_at: float
    ready_at: float


class SlotFolders(Protocol):
    """The owner of the slots' folders (made with their quota volume; removed with everything in them)."""

    def make(self, slot: str) -> ResultsFolder: ...

    def drop(self, slot: str) -> None: ...


class WarmPool:
    """The pooled sandboxes of one manager (one process's lease)."""

    def __init__(
        self,
        manager: SandboxManager,
        policy: PoolPolicy,
        slots: SlotFolders,
        request: RunRequest,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._manager = manager
        self._slots = slots
        self._request = request  # the executor is loaded for requests like this one (every run_python's)
        self._clock = clock
        self._ready: collections.deque[Pooled] = collections.deque()
        self._changed = threading.Condition()
        self._failed_at: float | None = None
        self._starting = 0  # starts in flight in the job (close waits for them: what they made goes too)
        self._closed = False
        self.wake: Callable[[], None] = lambda: None  # set by whoever runs tend() as a job

    @property
    def size(self) -> int:
        """How many sandboxes the pool keeps ready."""
        return self._policy.ready_count

    @property
    def interval_s(self) -> float:
        """How often the job looks at the pool unasked."""
        return min(_TEND_INTERVAL_MAX_S, self._policy.retry_after_s, self._policy.max_wait_s / 4)

    def ready(self) -> int:
        """How many sandboxes wait now."""
        with self._changed:
            return len(self._ready)

    def starting(self) -> int:
        """How many sandboxes are being started for the pool now."""
        with self._changed:
            return self._starting

    def wait_until_ready(self, count: int | None = None, *, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until ``count`` sandboxes (default: the pool's size) wait; whether they do."""
        wanted = self.size if count is None else count
        with self._changed:
            return self._changed.wait_for(lambda: len(self._ready) >= wanted, timeout=timeout_s)

    def take(self) -> Pooled | None:
        """The ready sandbox that waited longest (never one past ``max_wait_s``), now the caller's alone; None when
        none waits. The job starts another in its place."""
        now = self._clock()
        with self._changed:
            taken = next((p for p in self._ready if now - p.ready_at <= self._policy.max_wait_s), None)
            if taken is not None:
                self._ready.remove(taken)  # stale ones stay for the job to replace
            self._changed.notify_all()
        self.wake()
        return taken

    def discard(self, pooled: Pooled) -> None:
        """Remove a sandbox taken from the pool that could not be handed on (the job starts another)."""
        self._remove(pooled, "it could not be handed to a conversation")

    # the job ---------------------------------------------------------------------------------------------
    def tend(self) -> None:
        """One round of the pool's job: remove sandboxes that waited too long or stopped, then start new ones until
        ``size`` wait (not within ``retry_after_s`` of a failed start)."""
        self._retire_unfit()
        while True:
            with self._changed:
                if self._closed or len(self._ready) >= self.size:
                    return
                if self._failed_at is not None and self._clock() - self._failed_at < self._policy.retry_after_s:
                    return
                self._starting += 1
            try:
                if not self._start_and_keep():
                    return
            finally:
                with self._changed:
                    self._starting -= 1
                    self._changed.notify_all()

    def _start_and_keep(self) -> bool:
        """Start one sandbox and keep it ready (removed at once when the pool closed meanwhile); False when the
        start failed."""
        try:
            pooled = self._start_one()
        except (SandboxRuntimeError, OSError) as exc:
            self._failed_at = self._clock()
            logger.warning(
                "the warm pool could not start a sandbox (trying again in %g s): %s", self._policy.retry_after_s, exc
            )
            return False
        self._failed_at = None
        with self._changed:
            keep = not self._closed
            if keep:
                self._ready.append(pooled)
                self._changed.notify_all()
        if not keep:
            self._remove(pooled, "the pool closed while it started")
        return True

    def _start_one(self) -> Pooled:
        slot = secrets.token_hex(8)
        folder = self._slots.make(slot)
        try:
            info = self._manager.start(folder, {**self._manager.base_labels, LABEL_POOL_SLOT: slot})
        except BaseException:
            self._slots.drop(slot)
            raise
        pooled = Pooled(slot, info.id, float(info.labels[LABEL_CREATED_AT]), 0.0)
        try:
            self._manager.backend.prepare_run(info.id, self._request)
        except BaseException:
            self._remove(pooled, "its executor did not start")
            raise
        logger.info("pooled sandbox %s is ready (slot %s)", info.id[:12], slot)
        return pooled._replace(ready_at=self._clock())

    def _retire_unfit(self) -> None:
        now = self._clock()
        with self._changed:
            stale = [p for p in self._ready if now - p.ready_at > self._policy.max_wait_s]
            waiting = [p for p in self._ready if p not in stale]
        stopped = []
        for pooled in waiting:
            info = self._manager.backend.inspect(pooled.container_id)
            if info is None or not info.running:
                stopped.append(pooled)
        for pooled, reason in [(p, "waited longer than max_wait_s") for p in stale] + [(p, "stopped") for p in stopped]:
            with self._changed:
                if pooled not in self._ready:
                    continue  # taken meanwhile
                self._ready.remove(pooled)
            self._remove(pooled, reason)

    def _remove(self, pooled: Pooled, reason: str) -> None:
        """Remove a pooled sandbox no conversation took, and its slot."""
        try:
            self._manager.backend.remove(pooled.container_id)
        finally:
            self._slots.drop(pooled.slot)
        logger.info("removed pooled sandbox %s: %s", pooled.container_id[:12], reason)

    def close(self) -> None:
        """Remove every sandbox still waiting, with its slot, and wait (up to ``_CLOSE_WAIT_S``) for a start in
        flight, which removes what it made once it sees the pool closed; the pool starts none after this."""
        with self._changed:
            self._closed = True
            waiting = list(self._ready)
            self._ready.clear()
            self._changed.notify_all()
        for pooled in waiting:
            try:
                self._remove(pooled, "the pool closed")
            except (SandboxRuntimeError, OSError) as exc:
                logger.warning("could not remove pooled sandbox %s: %s", pooled.container_id[:12], exc)
        with self._changed:
            if not self._changed.wait_for(lambda: self._starting == 0, timeout=_CLOSE_WAIT_S):
                logger.warning("a pooled sandbox was still starting %g s after the pool closed", _CLOSE_WAIT_S)
