"""Quota volumes are mounted only while in use.

When a conversation's sandbox is reaped, closed or swept as an orphan (and this process has not used its folders
within ``idle_timeout_s``), its volume is unmounted and its loop device detached, unless a sandbox still runs on
it, a short look reads it, another live process holds it, or it is busy (then it stays mounted and this is
logged). The next use mounts it again. Every check and unmount runs under the conversation's host-wide lock
(:class:`~sandbox_runtime.sandbox.holds.HostLocks`), the one the sandbox manager checks its claims under.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from sandbox_runtime.errors import QuotaError, SandboxError
from sandbox_runtime.sandbox.holds import own_hold
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION
from sandbox_runtime.sandbox.manager import SandboxManager
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.store.folders import ConversationStore
from sandbox_runtime.store.quota import attached_loop_images, release_loop_quota
from sandbox_runtime.tenancy import validate_conversation_key

__all__ = ["QuotaVolumes", "release_orphan_volume"]

logger = logging.getLogger(__name__)

_CLOSE_LOCK_WAIT_S = 5.0  # at close, calls have ended (or were given up on): a lock still taken is one of those


@dataclasses.dataclass(eq=False, kw_only=True)
class QuotaVolumes:
    """Releases the quota volumes of one state directory for one process (the manager's lease), under the
    manager's locks; a released conversation's sandbox is forgotten by the manager (the next use asks the
    engine)."""

    manager: SandboxManager
    store: ConversationStore
    state: StateDB
    # conversation id: how many short looks read its folders right now
    _looking: dict[str, int] = dataclasses.field(default_factory=dict, init=False)
    _looking_guard: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)

    @contextlib.contextmanager
    def looking(self, conversation_id: str) -> Iterator[None]:
        """While the block runs, a short look reads the conversation's folders: its volume stays mounted."""
        with self._looking_guard:
            self._looking[conversation_id] = self._looking.get(conversation_id, 0) + 1
        try:
            yield
        finally:
            with self._looking_guard:
                left = self._looking[conversation_id] - 1
                if left:
                    self._looking[conversation_id] = left
                else:
                    del self._looking[conversation_id]

    def release(self, conversation_id: str, *, used_before: float | None = None, sandbox_may_run: bool = False) -> bool:
        """Unmount the conversation's quota volume and drop this process's hold; the caller holds the
        conversation's lock. Nothing happens while :meth:`_in_use` (this process's hold is dropped when another
        live process holds it: the last holder releases it) or while it is busy (logged). True when released.
        ``sandbox_may_run`` (at close): a running sandbox does not keep the host's mount; it keeps its own, and
        the loop device stays attached for it."""
        record = self.state.conversation(conversation_id)
        if record is None:
            self.state.leases.drop_hold(self.manager.lease.id, conversation_id)
            return False
        folders = self.store.folders(conversation_id, quota_mode=record.quota_mode)  # type: ignore[arg-type]
        with self.manager.host_lock(conversation_id):
            if self._in_use(conversation_id, used_before, sandbox_counts=not sandbox_may_run):
                return False
            sandbox_runs = sandbox_may_run and bool(self.manager.mounting(conversation_id))
            try:
                released = self.store.release(folders, detach=not sandbox_runs)
            except QuotaError as exc:
                logger.warning("could not release the quota volume of %s: %s", conversation_id, exc)
                return False
            if released:
                self.state.leases.drop_hold(self.manager.lease.id, conversation_id)
                self.manager.forget(conversation_id)
            return released

    def release_if_free(self, conversation_id: str, *, used_before: float) -> bool:
        """:meth:`release`, unless the conversation is in use in this process right now (its lock is taken: the
        reaper sees to it later)."""
        lock = self.manager.lock(conversation_id)
        if not lock.acquire(blocking=False):
            return False
        try:
            return self.release(conversation_id, used_before=used_before)
        finally:
            lock.release()

    def _in_use(self, conversation_id: str, used_before: float | None, *, sandbox_counts: bool = True) -> bool:
        """Whether the volume must stay mounted: a look reads it, this process used it after ``used_before``, a
        sandbox has it mounted (unless not ``sandbox_counts``), or another live process holds it; under the
        conversation's host-wide lock."""
        with self._looking_guard:
            if self._looking.get(conversation_id):
                return True
        holds = self.state.leases.live_holds(conversation_id)
        mine = own_hold(holds, self.manager.lease.id)
        if used_before is not None and mine is not None and mine.used_at > used_before:
            return True  # used lately: stays mounted until it is idle
        if sandbox_counts and self.manager.mounting(conversation_id):
            return True  # a sandbox has it mounted (this process's hold, if any, stays with it)
        if any(h.lease_id != self.manager.lease.id for h in holds):
            self.state.leases.drop_hold(self.manager.lease.id, conversation_id)  # the last live holder releases it
            return True
        return False

    def release_unused(self, idle_before: float) -> list[str]:
        """Release the mounted loop volumes of this state directory's conversations that no sandbox uses, no
        other live process holds and this process has not used after ``idle_before`` (e.g. after a crash);
        returns the conversations released."""
        on_loop = [record for record in self.state.conversations() if record.quota_mode == "loop"]
        if not on_loop:
            return []  # nothing to ask the engine and the kernel about (a fresh state, or measured quotas)
        using = {c.labels.get(LABEL_CONVERSATION) for c in self.manager.mounting()}
        attached = attached_loop_images()
        released = []
        for record in on_loop:
            if record.id in using:
                continue
            folders = self.store.folders(record.id, quota_mode="loop")
            if not os.path.ismount(folders.results) and os.path.realpath(folders.volume) not in attached:
                continue
            if self.release_if_free(record.id, used_before=idle_before):
                released.append(record.id)
        return released

    def release_idle_holds(self, idle_before: float) -> None:
        """Release the volumes of conversations this process holds without a running sandbox and has not used
        after ``idle_before``."""
        holds = [h for h in self.state.leases.holds(lease_id=self.manager.lease.id) if h.used_at <= idle_before]
        if not holds:
            return
        using = {c.id for c in self.manager.mounting()}
        for hold in holds:
            if hold.container_id is not None and hold.container_id in using:
                continue  # its sandbox runs; reaped (and then released) when idle
            self.release_if_free(hold.conversation_id, used_before=idle_before)

    def release_held(self) -> list[str]:
        """At this process's close: unmount the volume of every conversation it holds, unless another live process
        holds it too (that one releases it), a look reads it, or a call still running here uses it (its lock is
        taken: logged). A conversation's sandbox keeps running on its own mount of the filesystem (its loop device
        stays attached until the sandbox ends); the next process to use the conversation mounts the same device
        again. Returns the conversations released."""
        released = []
        for hold in self.state.leases.holds(lease_id=self.manager.lease.id):
            conversation_id = hold.conversation_id
            lock = self.manager.lock(conversation_id)
            if not lock.acquire(timeout=_CLOSE_LOCK_WAIT_S):
                logger.warning("left the volume of %s mounted: a call still running uses it", conversation_id)
                continue
            try:
                if self.release(conversation_id, sandbox_may_run=True):
                    released.append(conversation_id)
            finally:
                lock.release()
        return released

    def release_unrecorded(self, conversation_id: str) -> None:
        """Release the loop volume of a conversation the state database does not know (its sandbox was just
        removed), unless it is in use (its lock is taken, or a look, a sandbox or another process uses it)."""
        lock = self.manager.lock(conversation_id)
        if not lock.acquire(blocking=False):
            return
        try:
            with self.manager.host_lock(conversation_id):
                if self.store.quota_mode != "loop" or self.state.knows_conversation(conversation_id):
                    return
                if self._in_use(conversation_id, None):
                    return
                try:
                    self.store.release(self.store.folders(conversation_id, quota_mode="loop"))
                except (QuotaError, ValueError) as exc:
                    logger.warning("could not release the volume of orphan %s: %s", conversation_id, exc)
        finally:
            lock.release()


def release_orphan_volume(state_dir: str, conversation_id: str | None) -> None:
    """Best effort, for a container swept because its state directory is gone: unmount its volume when it is
    still mounted there (only ever that image's loop device)."""
    if not conversation_id or not Path(state_dir).is_absolute():
        return
    try:
        validate_conversation_key(conversation_id)
        root = Path(state_dir)
        mountpoint = root / "conversations" / conversation_id / "results"
        if os.path.ismount(mountpoint):
            release_loop_quota(root / "volumes" / f"{conversation_id}.ext4", mountpoint)
    except (QuotaError, SandboxError) as exc:
        logger.warning("could not release the volume of orphan %s in %s: %s", conversation_id, state_dir, exc)
