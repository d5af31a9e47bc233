"""The warm pool: sandboxes started ahead of need, each handed whole to one new conversation.

A pooled sandbox is started like any other (the same profile, after the same self-check) on a results folder of
its own, a *slot* that the folders' owner makes with its quota volume; its resident executor is loaded before it
counts as ready. It carries its slot (``LABEL_POOL_SLOT``) instead of a conversation, and this process's lease.

A new conversation *takes* one (:meth:`WarmPool.take`): the folders' owner moves the slot's folder to the
conversation's place (a rename on the host: the container's bind mount follows the folder, not its path) and the
manager records the sandbox as the conversation's (:meth:`SandboxManager.adopt`). It is never given back: it
ends like any conversation's sandbox (close, reap, delete), and is replaced instead of restarted (a restart would
bind the slot's old path again). No pooled sandbox ever serves a second conversation.

The pool follows demand (:meth:`WarmPool.target`): it keeps ready as many sandboxes as new conversations asked for
one within ``pool.demand_window_s`` (hit or miss), never fewer than ``pool.ready_count`` (its floor) nor more than
``pool.max_ready_count`` (its ceiling), and no more than its floor while the host's available memory is under
``pool.host_memory_available_min_bytes``. So a burst of new conversations raises it to the burst's size for the next
one, and a quiet spell lowers it back as the asks age out of the window.

The pool's job (:meth:`WarmPool.tend`) removes what waits past the target, replaces sandboxes that waited longer
than ``pool.max_wait_s`` or stopped, and starts what is missing, ``pool.starts_at_once_max`` side by side (each
start that ends wakes the job for the next); after a failed start it tries again only after ``pool.retry_after_s``.
While new conversations ask, it waits: it refills to its floor once none asked for ``_REFILL_QUIET_S`` and grows
past it once none asked for ``_GROW_QUIET_S`` and the sandboxes of those that found none ready have started (never
holding off longer than ``_HOLD_MAX_S``, for a steady stream): a burst's own first results go first, the pool's
starts would slow them. It is woken after every take. :meth:`WarmPool.close` (with the runtime) removes every
sandbox still waiting, with its slot. Pooled sandboxes of a process that ended are removed by any runtime's start-up
sweep and ``gc``, whatever their policy (:meth:`SandboxManager.sweep_orphans`); a live process's pool is its own, so
a runtime started under another policy never takes a sandbox made under the old one.
"""

from __future__ import annotations

import collections
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, Protocol

from sandbox_runtime.errors import SandboxRuntimeError
from sandbox_runtime.policy import PoolPolicy
from sandbox_runtime.sandbox.backend import RunRequest
from sandbox_runtime.sandbox.labels import LABEL_CREATED_AT, LABEL_POOL_SLOT
from sandbox_runtime.sandbox.manager import SandboxManager
from sandbox_runtime.sandbox.manager_models import ResultsFolder

__all__ = ["Pooled", "SlotFolders", "WarmPool", "host_memory_available_bytes"]

logger = logging.getLogger(__name__)

_TEND_INTERVAL_MAX_S = 60.0  # the job also looks unasked this often (stale or stopped sandboxes, a retry)
# close waits this long for a start in flight (a self-check, a sandbox start and its executor: seconds; a loaded
# host: tens); what is left after it is removed by the owner's close all the same (its slots, by lease)
_CLOSE_WAIT_S = 120.0
# while new conversations ask, their first results are under way (taken sandboxes' first runs, cold starts), and
# the pool's own starts would compete with them for the CPU and the engine: it refills to its floor once none
# asked for this long (a burst's asks come within milliseconds, a steady stream's further apart) ...
_REFILL_QUIET_S = 0.25
# ... and grows past its floor once none asked for this long, and no cold start of a conversation is under way
# (looking again this often) ...
_GROW_QUIET_S = 1.0
_COLD_LOOK_S = 0.25
# ... or once it held off this long (new conversations that keep coming, never a second apart)
_HOLD_MAX_S = 10.0
# the engine is asked whether the waiting sandboxes still run at most this often
_STOPPED_LOOK_S = 5.0
_MEMINFO = "/proc/meminfo"


def host_memory_available_bytes() -> int | None:
    """The memory this host has available for new processes (``MemAvailable``); None where it cannot be read (no
    ``/proc``: then the pool's memory bound does not apply)."""
    try:
        with open(_MEMINFO, encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel says kB, meaning KiB
    except (OSError, ValueError, IndexError):
        return None
    return None


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
        refill: bool = True,
        clock: Callable[[], float] = time.monotonic,
        memory_available: Callable[[], int | None] = host_memory_available_bytes,
        cold_starts: Callable[[], int] = lambda: 0,
    ) -> None:
        self._policy = policy
        self._manager = manager
        self._slots = slots
        self._request = request  # the executor is loaded for requests like this one (every run_python's)
        self._refill = refill  # False: for one new conversation only (none kept after its take)
        self._clock = clock
        self._memory_available = memory_available
        self._cold_starts = cold_starts  # conversations' sandboxes the owner is starting now (they go first)
        self._ready: collections.deque[Pooled] = collections.deque()
        # when new conversations asked for a sandbox (monotonic): the target never exceeds the ceiling, so the
        # asks past it need not be kept
        self._asks: collections.deque[float] = collections.deque(maxlen=max(1, policy.max_ready_count))
        self._taken = 0
        self._held_since: float | None = None  # since when starts wait for the asks to settle
        self._looked_at: float | None = None  # when the engine was last asked whether the waiting ones run
        self._wake_timer: threading.Timer | None = None
        self._changed = threading.Condition()
        self._failed_at: float | None = None
        self._starting = 0  # starts in flight (close waits for them: what they made goes too)
        self._closed = False
        self._starter = ThreadPoolExecutor(max_workers=policy.starts_at_once_max, thread_name_prefix="pool-start")
        self.wake: Callable[[], None] = lambda: None  # set by whoever runs tend() as a job

    @property
    def interval_s(self) -> float:
        """How often the job looks at the pool unasked (often enough to follow the demand window too)."""
        policy = self._policy
        return min(_TEND_INTERVAL_MAX_S, policy.retry_after_s, policy.max_wait_s / 4, policy.demand_window_s / 4)

    def target(self) -> int:
        """How many sandboxes the pool keeps ready now: as many as new conversations asked for one within
        ``demand_window_s``, at least ``ready_count``, at most ``max_ready_count``; only ``ready_count`` while the
        host's available memory is under ``host_memory_available_min_bytes``; none once a pool for one new
        conversation handed its sandbox out."""
        policy = self._policy
        if not self._refill and self._taken:
            return 0
        since = self._clock() - policy.demand_window_s
        with self._changed:
            asked = sum(1 for at in self._asks if at >= since)
        wanted = min(policy.max_ready_count, max(policy.ready_count, asked))
        if wanted > policy.ready_count and self._memory_short():
            return policy.ready_count
        return wanted

    def _memory_short(self) -> bool:
        floor = self._policy.host_memory_available_min_bytes
        available = self._memory_available() if floor else None
        return available is not None and available < floor

    def ready(self) -> int:
        """How many sandboxes wait now."""
        with self._changed:
            return len(self._ready)

    def starting(self) -> int:
        """How many sandboxes are being started for the pool now."""
        with self._changed:
            return self._starting

    def wait_until_ready(self, count: int | None = None, *, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until ``count`` sandboxes (default: the pool's target now) wait; whether they
        do."""
        wanted = self.target() if count is None else count
        with self._changed:
            return self._changed.wait_for(lambda: len(self._ready) >= wanted, timeout=timeout_s)

    def wait_for_starts(self, *, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until no start is in flight; whether none is."""
        with self._changed:
            return self._changed.wait_for(lambda: self._starting == 0, timeout=timeout_s)

    def take(self) -> Pooled | None:
        """The ready sandbox that waited longest (never one past ``max_wait_s``), now the caller's alone; None when
        none waits. Either way the ask counts towards the pool's target, and the job starts another in its place."""
        now = self._clock()
        with self._changed:
            self._asks.append(now)
            taken = next((p for p in self._ready if now - p.ready_at <= self._policy.max_wait_s), None)
            if taken is not None:
                self._ready.remove(taken)  # stale ones stay for the job to replace
                self._taken += 1
            self._changed.notify_all()
        self.wake()
        return taken

    def discard(self, pooled: Pooled) -> None:
        """Remove a sandbox taken from the pool that could not be handed on (the job starts another)."""
        self._remove(pooled, "it could not be handed to a conversation")

    # the job ---------------------------------------------------------------------------------------------
    def tend(self) -> None:
        """One round of the pool's job: remove sandboxes that waited too long or stopped, and those past the target;
        then start what is missing, at most ``starts_at_once_max`` side by side (not within ``retry_after_s`` of a
        failed start; only once the asks settled). Returns at once: each start that ends wakes the job again, and
        so does a timer while starts wait for the asks to settle."""
        self._retire_unfit()
        target = self.target()
        self._shrink_to(target)
        with self._changed:
            if self._closed:
                return
            now = self._clock()
            if self._failed_at is not None and now - self._failed_at < self._policy.retry_after_s:
                return
            have = len(self._ready) + self._starting
            missing = target - have
            if missing > 0:
                missing, look_again_s = self._startable(now, missing, self._policy.ready_count - have)
                if look_again_s > 0:
                    self._wake_in(look_again_s)
            batch = min(missing, self._policy.starts_at_once_max - self._starting)
            if batch <= 0:
                return
            self._starting += batch
        for _ in range(batch):
            self._starter.submit(self._start_in_flight)

    def _startable(self, now: float, missing: int, below_floor: int) -> tuple[int, float]:
        """How many of the ``missing`` sandboxes may start now (``below_floor`` of them refill the floor), and in how
        many seconds to look again (0: no need); see ``_REFILL_QUIET_S``. Under the pool's lock."""
        last_ask = self._asks[-1] if self._asks else -math.inf
        cold = self._cold_starts() > 0
        if now - last_ask >= _GROW_QUIET_S and not cold:
            self._held_since = None
            return missing, 0.0
        if self._held_since is None:
            self._held_since = now
        until = self._held_since + _HOLD_MAX_S
        if now >= until:
            return missing, 0.0
        if now - last_ask >= _REFILL_QUIET_S:
            look_again = max(last_ask + _GROW_QUIET_S - now, _COLD_LOOK_S if cold else 0.0)
            return max(0, min(missing, below_floor)), min(look_again, until - now)
        return 0, min(last_ask + _REFILL_QUIET_S, until) - now

    def _wake_in(self, delay_s: float) -> None:
        """Wake the job in ``delay_s`` (one timer at a time: the asks only move the moment later, and a round that
        comes too early sets another). Under the pool's lock."""
        if self._wake_timer is not None and self._wake_timer.is_alive():
            return
        self._wake_timer = threading.Timer(delay_s, self.wake)
        self._wake_timer.daemon = True
        self._wake_timer.start()

    def _start_in_flight(self) -> None:
        started = False
        try:
            started = self._start_and_keep()
        except Exception:  # a thread of the pool's own: what no one else would hear of is logged
            logger.exception("the warm pool's start failed unexpectedly")
            self._failed_at = self._clock()
        finally:
            with self._changed:
                self._starting -= 1
                self._changed.notify_all()
        if started:
            self.wake()  # the job starts the next ones, up to the target

    def _shrink_to(self, target: int) -> None:
        """Remove the sandboxes that wait past ``target``, those that waited longest first."""
        with self._changed:
            excess = [self._ready.popleft() for _ in range(max(0, len(self._ready) - target))]
        for pooled in excess:
            self._remove(pooled, f"the pool keeps {target} ready now")

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
        """Remove the sandboxes that waited past ``max_wait_s``, and those the engine shows stopped (asked at most
        every ``_STOPPED_LOOK_S``: a round comes after every take and every start)."""
        now = self._clock()
        with self._changed:
            stale = [p for p in self._ready if now - p.ready_at > self._policy.max_wait_s]
            waiting = [p for p in self._ready if p not in stale]
            if waiting and (self._looked_at is None or now - self._looked_at >= _STOPPED_LOOK_S):
                self._looked_at = now
            else:
                waiting = []
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
        if self._wake_timer is not None:
            self._wake_timer.cancel()
        if not self.wait_for_starts(timeout_s=_CLOSE_WAIT_S):
            logger.warning("a pooled sandbox was still starting %g s after the pool closed", _CLOSE_WAIT_S)
        self._starter.shutdown(wait=False)
