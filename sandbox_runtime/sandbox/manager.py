"""Sandbox lifecycle: one container per conversation, found again by label, reaped when idle or old.

* ``get_or_create`` returns the conversation's running container or starts one; after a runtime restart it
  re-attaches by label instead of starting a second one.
* ``reap`` removes sandboxes idle longer than ``idle_timeout_s`` or older than ``max_lifetime_s`` (their results
  folders stay); ``sweep_orphans`` removes containers with our labels that nothing owns any more.
* Before the first sandbox of a process starts, the self-check runs; when it fails, no sandbox ever starts.

Several processes may share a state directory (``serve``, a host application, a cron'd ``gc``), each under its
own policy. Each manager registers a lease in the state database and *holds* the conversations it uses (and the
sandbox it started or re-attached for one). The rule:

* a container another live process holds is never removed here, whatever its policy, age or idleness: that
  process decides (it reaps its own idle sandboxes). "Made under another policy" is a removal reason only for a
  container no live process holds. When two live processes hold one sandbox, one that stopped using it lets go
  of its claim, and the last one reaps it.
* a conversation's quota volume is mounted only while it is in use: when its sandbox is reaped, closed or swept
  as an orphan (and this process has not used its folders within ``idle_timeout_s``), the volume is unmounted and
  its loop device detached, unless a sandbox still runs on it, another live process holds it, or it is busy
  (then it stays mounted and this is logged). The next use mounts it again.

Taking a hold and mounting, and checking the holds before a removal or an unmount, are each done under one lock
per state directory (``STATE_DIR/mounts.lock``, ``flock``), so a check never races another process's claim.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.errors import ImageError, QuotaError, SandboxError, SelfCheckFailed
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import ContainerInfo, ContainerSpec, SandboxBackend
from sandbox_runtime.sandbox.profile import (
    LABEL_CONVERSATION,
    LABEL_CREATED_AT,
    LABEL_POLICY,
    LABEL_RUNTIME,
    LABEL_STATE_DIR,
    container_spec,
)
from sandbox_runtime.sandbox.selfcheck import SelfCheckReport, run_self_check
from sandbox_runtime.state import HoldRecord, LeaseRecord, StateDB
from sandbox_runtime.store.folders import ConversationFolders, ConversationStore, validate_conversation_id
from sandbox_runtime.store.quota import attached_loop_images, release_loop_quota

__all__ = ["Removal", "Sandbox", "SandboxManager"]

logger = logging.getLogger(__name__)

CANARY_CONVERSATION = "_canary"  # a label value no conversation id can take (ids start with a letter or digit)
_CANARY_QUOTA_BYTES = 16 * 1024 * 1024
_CANARY_MAX_AGE_S = 300  # a canary lives for seconds; an older one was left by a killed process
_HOST_LOCK_WAIT_S = 300.0  # held for a check or a mount (mkfs and mount: 60 s each at most); longer: a stuck holder
_USING_STATES = frozenset({"running", "paused", "restarting", "removing"})  # a container that may have the folder
LABEL_LEASE = "io.sandbox-runtime.lease"  # the lease of the process that started the container


class Sandbox(BaseModel):
    """A conversation's running container and its folders."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    container_id: str
    folders: ConversationFolders
    created_at: float


class Removal(BaseModel):
    """A container that ``reap`` or ``sweep_orphans`` removed, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    container_id: str
    conversation_id: str | None
    reason: str


class _HostLock:
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


class SandboxManager:
    """Owns the sandboxes of one state directory (together with the other live processes that share it)."""

    def __init__(
        self,
        backend: SandboxBackend,
        policy: Policy,
        store: ConversationStore,
        state: StateDB,
        image: str,
        *,
        extra_labels: dict[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.store = store
        self.state = state
        self.image = image
        self.clock = clock
        self.state_dir_label = str(Path(store.state_dir).resolve())
        self.base_labels = {LABEL_RUNTIME: "1", LABEL_STATE_DIR: self.state_dir_label, **(extra_labels or {})}
        self._digest = policy.digest()
        self._locks: dict[str, threading.RLock] = {}
        self._locks_guard = threading.Lock()
        self._host_lock = _HostLock(Path(store.state_dir) / "mounts.lock")
        self._looking: dict[str, int] = {}  # conversations whose folders a short look (borrowed) reads right now
        self._self_check: SelfCheckReport | None = None
        self._known: dict[str, Sandbox] = {}
        self.lease: LeaseRecord = state.open_lease(self._digest)

    def end_lease(self) -> None:
        """Drop this process's lease and holds (at close): its sandboxes and mounts stay for the next start."""
        self.state.close_lease(self.lease.id)
        self._known.clear()

    # locking ------------------------------------------------------------------------------------------
    def lock(self, conversation_id: str) -> threading.RLock:
        """The lock that serialises everything done in one conversation's sandbox."""
        with self._locks_guard:
            return self._locks.setdefault(conversation_id, threading.RLock())

    # self-check ---------------------------------------------------------------------------------------
    def self_check(self, *, force: bool = False) -> SelfCheckReport:
        """Run (once per process, or again with force) the canary check; the report is kept."""
        with self._locks_guard:
            cached = self._self_check
        if cached is not None and not force:
            return cached
        if not self.backend.image_exists(self.image):
            raise ImageError(f"the executor image {self.image} is not built: run `sandbox-runtime image build`")
        with self.lock(CANARY_CONVERSATION):
            folders = self.store.canary_folders(quota_bytes=_CANARY_QUOTA_BYTES)
            self.store.prepare(folders)
            try:
                report = run_self_check(
                    self.backend,
                    self.policy,
                    lambda labels: self._spec(folders, labels),
                    quota_mode=folders.quota_mode,
                    labels={
                        **self.base_labels,
                        LABEL_CONVERSATION: CANARY_CONVERSATION,
                        LABEL_CREATED_AT: str(int(self.clock())),
                    },
                )
            finally:
                self.store.delete(folders)
        with self._locks_guard:
            self._self_check = report
        return report

    def _require_self_check(self) -> None:
        report = self.self_check()
        if not report.ok:
            raise SelfCheckFailed(report.summary())

    # lifecycle ------------------------------------------------------------------------------------------
    def _spec(self, folders: ConversationFolders, labels: dict[str, str]) -> ContainerSpec:
        return container_spec(self.policy, self.image, str(folders.results), labels)

    def _labels(self, conversation_id: str) -> dict[str, str]:
        return {**self.base_labels, LABEL_CONVERSATION: conversation_id}

    def folders(self, conversation_id: str, *, use: bool = True) -> ConversationFolders:
        """The conversation's folders (made and mounted when needed), recorded in the state database, and held
        by this process (``use=False``: for a short look, which does not count as a use).

        One at a time, across the processes of the state directory (a short critical section, apart from the
        conversation's lock so that a running script does not hold up its conversation's other tools): calls
        that arrive together must not mount twice, and no other process unmounts what this one just claimed."""
        with self._host_lock():
            record = self.state.conversation(conversation_id)
            mode = self.store.quota_mode if record is None else record.quota_mode
            folders = self.store.folders(conversation_id, quota_mode=mode)  # type: ignore[arg-type]
            self.state.hold(self.lease.id, conversation_id, self._digest, self.clock(), use=use)
            self.store.prepare(folders)
            self.state.ensure_conversation(conversation_id, folders.quota_mode, folders.quota_bytes)
            return folders

    @contextlib.contextmanager
    def borrowed(self, conversation_id: str) -> Iterator[ConversationFolders]:
        """The conversation's folders for a short look (its disk use, retention): mounted for the look when they
        were not, and released again afterwards when nothing uses them (no sandbox, no use by this or another
        process)."""
        with self._locks_guard:
            self._looking[conversation_id] = self._looking.get(conversation_id, 0) + 1
        try:
            try:
                yield self.folders(conversation_id, use=False)
            finally:
                with self._locks_guard:
                    left = self._looking[conversation_id] - 1
                    if left:
                        self._looking[conversation_id] = left
                    else:
                        del self._looking[conversation_id]
        finally:
            lock = self.lock(conversation_id)
            if lock.acquire(blocking=False):  # else in use in this process right now: the reaper sees to it later
                try:
                    idle_before = self.clock() - self.policy.sandbox.idle_timeout_s
                    self._release_volume(conversation_id, used_before=idle_before)
                finally:
                    lock.release()

    def get_or_create(self, conversation_id: str) -> Sandbox:
        """The conversation's running sandbox, re-attached by label when one exists, else a new one."""
        with self.lock(conversation_id):
            now = self.clock()
            known = self._known.get(conversation_id)
            if known is not None and now - known.created_at <= self.policy.sandbox.max_lifetime_s:
                return known  # started or adopted by this process; forget() drops it when the engine disagrees
            folders = self.folders(conversation_id)
            existing = self._adoptable(conversation_id, now)
            if existing is not None:
                created = float(existing.labels.get(LABEL_CREATED_AT, now))
                self.state.record_sandbox(existing.id, conversation_id, created)
                self.state.touch_sandbox(existing.id, now)
                return self._remember(
                    Sandbox(
                        conversation_id=conversation_id, container_id=existing.id, folders=folders, created_at=created
                    )
                )
            self._require_self_check()
            labels = {
                **self._labels(conversation_id),
                LABEL_CREATED_AT: str(int(now)),
                LABEL_POLICY: self._digest,
                LABEL_LEASE: self.lease.id,  # held from its first moment, before the hold names it
            }
            info = self.backend.create_and_start(self._spec(folders, labels))
            self.state.hold(self.lease.id, conversation_id, self._digest, now, container_id=info.id)
            if info.warnings:
                self._remove(info, "the engine could not apply the profile")
                raise SelfCheckFailed(f"the engine could not apply the profile: {'; '.join(info.warnings)}")
            if not info.running:
                self._remove(info, f"stopped right after it started ({info.status})")
                raise SandboxError(
                    f"the sandbox for {conversation_id!r} stopped right after it started "
                    f"({info.status}, exit code {info.exit_code})"
                )
            self.state.record_sandbox(info.id, conversation_id, now)
            logger.info("started sandbox %s for conversation %s", info.id[:12], conversation_id)
            return self._remember(
                Sandbox(conversation_id=conversation_id, container_id=info.id, folders=folders, created_at=now)
            )

    def _adoptable(self, conversation_id: str, now: float) -> ContainerInfo | None:
        """The newest usable container of this conversation, claimed by this process; every other one is removed,
        except those another live process holds (that process decides about them)."""
        doomed: list[tuple[ContainerInfo, str]] = []
        keep: ContainerInfo | None = None
        foreign: tuple[ContainerInfo, HoldRecord, str] | None = None
        with self._host_lock():  # claim and removal checks are one step: no process removes what is claimed here
            found = sorted(
                self.backend.list_containers(self._labels(conversation_id)),
                key=lambda c: float(c.labels.get(LABEL_CREATED_AT, 0)),
                reverse=True,
            )
            holds = self.state.live_holds(conversation_id)
            for info in found:
                reason = self._unusable_reason(info, now)
                if reason is None and keep is None:
                    keep = info
                    self.state.hold(self.lease.id, conversation_id, self._digest, now, container_id=info.id)
                    continue
                holder = self._held_elsewhere(info, holds)
                if holder is not None:
                    if info.running and foreign is None:
                        foreign = (info, holder, reason or "a second sandbox of the conversation")
                    continue
                reason = reason or "duplicate sandbox for one conversation"
                self.state.mark_removed(info.id, reason)
                doomed.append((info, reason))
        for info, reason in doomed:
            self._finish_removal(info, reason)
        if keep is None and foreign is not None:
            info, holder, reason = foreign
            raise SandboxError(
                f"conversation {conversation_id!r} is in use by another runtime (pid {holder.pid} on {holder.host}, "
                f"policy {holder.policy_digest}), whose sandbox {info.id[:12]} this one (policy {self._digest}) "
                f"cannot use: {reason}. Use the conversation from one of them at a time, or under the same policy."
            )
        return keep

    def _unusable_reason(self, info: ContainerInfo, now: float) -> str | None:
        if not info.running:
            return f"not running ({info.status})"
        if info.labels.get(LABEL_POLICY) != self._digest:
            return "made under another policy"
        created = float(info.labels.get(LABEL_CREATED_AT, 0))
        if now - created > self.policy.sandbox.max_lifetime_s:
            return f"older than max_lifetime_s={self.policy.sandbox.max_lifetime_s}"
        record = self.state.sandbox(info.id)
        if record is not None and record.removed_at is not None:
            return f"removed before ({record.removed_reason}) but still there"
        return None

    def _held_elsewhere(self, info: ContainerInfo, holds: list[HoldRecord]) -> HoldRecord | None:
        """The hold by which another live process claims this container (``holds``: its conversation's live
        holds): one naming it, or that of the process that started it and has not named it yet (between the
        start and the claim)."""
        maker = info.labels.get(LABEL_LEASE)
        for hold in holds:
            if hold.lease_id == self.lease.id:
                continue
            if hold.container_id == info.id or (hold.container_id is None and hold.lease_id == maker):
                return hold
        return None

    def _remember(self, sandbox: Sandbox) -> Sandbox:
        self._known[sandbox.conversation_id] = sandbox
        return sandbox

    def forget(self, conversation_id: str) -> None:
        """Drop what this process knows of the conversation's sandbox; the next use asks the engine."""
        self._known.pop(conversation_id, None)

    def _remove(self, info: ContainerInfo, reason: str) -> Removal:
        self.state.mark_removed(info.id, reason)
        return self._finish_removal(info, reason)

    def _finish_removal(self, info: ContainerInfo, reason: str) -> Removal:
        """Remove a container already marked removed in the state database (so nobody re-attaches it)."""
        conversation = info.labels.get(LABEL_CONVERSATION)
        known = self._known.get(conversation or "")
        if known is not None and known.container_id == info.id:
            self.forget(known.conversation_id)
        self.backend.remove(info.id)
        logger.info("removed sandbox %s: %s", info.id[:12], reason)
        return Removal(container_id=info.id, conversation_id=conversation, reason=reason)

    def touch(self, sandbox: Sandbox) -> None:
        now = self.clock()
        self.state.touch_sandbox(sandbox.container_id, now)
        self.state.touch_hold(self.lease.id, sandbox.conversation_id, now)

    def discard(self, sandbox: Sandbox, reason: str) -> None:
        """Remove a sandbox that can no longer be trusted to work; the next use starts a fresh one."""
        self.forget(sandbox.conversation_id)
        self.state.mark_removed(sandbox.container_id, reason)
        self.backend.remove(sandbox.container_id)
        logger.warning("removed sandbox %s: %s", sandbox.container_id[:12], reason)

    def restart(self, sandbox: Sandbox) -> None:
        """End every process of the sandbox at once (its results folder stays)."""
        self.backend.restart(sandbox.container_id)

    def close(self, conversation_id: str) -> bool:
        """End the conversation's sandbox and release its quota volume (unless another live process holds it);
        its folders stay. True when a sandbox was running."""
        with self.lock(conversation_id):
            removed = [
                self._remove(info, "closed") for info in self.backend.list_containers(self._labels(conversation_id))
            ]
            if not self._release_volume(conversation_id):
                self.state.touch_hold(self.lease.id, conversation_id, 0.0)  # done with it: the next gc releases it
        return bool(removed)

    # quota volumes ------------------------------------------------------------------------------------
    def _using_containers(self, conversation_id: str) -> list[ContainerInfo]:
        """Containers of this state directory (whatever their other labels) that may have the folder mounted."""
        labels = {LABEL_RUNTIME: "1", LABEL_STATE_DIR: self.state_dir_label, LABEL_CONVERSATION: conversation_id}
        return [c for c in self.backend.list_containers(labels) if c.status in _USING_STATES]

    def _release_volume(self, conversation_id: str, *, used_before: float | None = None) -> bool:
        """Unmount the conversation's quota volume and drop this process's hold; the caller holds the
        conversation's lock. Nothing happens while a sandbox runs on it, a look reads it, another live process
        holds it (this process's hold is dropped: the last holder releases it), this process used it after
        ``used_before``, or it is busy (logged). True when released."""
        record = self.state.conversation(conversation_id)
        if record is None:
            self.state.drop_hold(self.lease.id, conversation_id)
            return False
        folders = self.store.folders(conversation_id, quota_mode=record.quota_mode)  # type: ignore[arg-type]
        with self._host_lock():
            if self._volume_in_use(conversation_id, used_before):
                return False
            try:
                released = self.store.release(folders)
            except QuotaError as exc:
                logger.warning("could not release the quota volume of %s: %s", conversation_id, exc)
                return False
            if released:
                self.state.drop_hold(self.lease.id, conversation_id)
                self.forget(conversation_id)
            return released

    def _volume_in_use(self, conversation_id: str, used_before: float | None) -> bool:
        """Whether the volume must stay mounted; under the state directory's lock."""
        with self._locks_guard:
            if self._looking.get(conversation_id):
                return True
        holds = self.state.live_holds(conversation_id)
        mine = next((h for h in holds if h.lease_id == self.lease.id), None)
        if used_before is not None and mine is not None and mine.used_at > used_before:
            return True  # used lately: stays mounted until it is idle
        if self._using_containers(conversation_id):
            return True  # a sandbox has it mounted (this process's hold, if any, stays with it)
        if any(h.lease_id != self.lease.id for h in holds):
            self.state.drop_hold(self.lease.id, conversation_id)  # the last live holder releases it
            return True
        return False

    def release_unused_volumes(self) -> list[str]:
        """Release the mounted quota volumes of this state directory's conversations that no sandbox uses, no
        other live process holds and this process has not used within ``idle_timeout_s`` (e.g. after a crash);
        returns the conversations released."""
        now = self.clock()
        using = {
            c.labels.get(LABEL_CONVERSATION)
            for c in self.backend.list_containers({LABEL_RUNTIME: "1", LABEL_STATE_DIR: self.state_dir_label})
            if c.status in _USING_STATES
        }
        attached = attached_loop_images()
        released = []
        for record in self.state.conversations():
            if record.quota_mode != "loop" or record.id in using:
                continue
            folders = self.store.folders(record.id, quota_mode="loop")
            if not os.path.ismount(folders.results) and os.path.realpath(folders.volume) not in attached:
                continue
            lock = self.lock(record.id)
            if not lock.acquire(blocking=False):
                continue  # in use right now
            try:
                if self._release_volume(record.id, used_before=now - self.policy.sandbox.idle_timeout_s):
                    released.append(record.id)
            finally:
                lock.release()
        return released

    def _release_orphan_volume(self, state_dir: str, conversation_id: str | None) -> None:
        """Best effort, for a container swept because its state directory is gone: unmount its volume when it
        is still mounted there (only ever that image's loop device)."""
        if not conversation_id or not Path(state_dir).is_absolute():
            return
        try:
            validate_conversation_id(conversation_id)
            root = Path(state_dir)
            mountpoint = root / "conversations" / conversation_id / "results"
            if os.path.ismount(mountpoint):
                release_loop_quota(root / "volumes" / f"{conversation_id}.ext4", mountpoint)
        except (QuotaError, SandboxError) as exc:
            logger.warning("could not release the volume of orphan %s in %s: %s", conversation_id, state_dir, exc)

    # reaping ------------------------------------------------------------------------------------------
    def reap(self) -> list[Removal]:
        """Remove this state directory's sandboxes that are idle, too old, or stopped, except those another live
        process holds; release the quota volumes this process no longer uses."""
        now = self.clock()
        removals: list[Removal] = []
        for info in self.backend.list_containers(self.base_labels):
            conversation = info.labels.get(LABEL_CONVERSATION, "")
            if conversation == CANARY_CONVERSATION:
                continue  # a self-check in progress; sweep_orphans removes canaries left by killed processes
            lock = self.lock(conversation)
            if not lock.acquire(blocking=False):
                continue  # in use right now: not idle
            try:
                with self._host_lock():
                    reason = self._reap_reason(info, now)
                    if reason is not None:
                        self.state.mark_removed(info.id, reason)
                if reason is not None:
                    removals.append(self._finish_removal(info, reason))
                    self._release_volume(conversation, used_before=now - self.policy.sandbox.idle_timeout_s)
            finally:
                lock.release()
        self._release_idle_holds(now)
        return removals

    def _reap_reason(self, info: ContainerInfo, now: float) -> str | None:
        """Why the container goes (None: it stays); under the state directory's lock."""
        conversation = info.labels.get(LABEL_CONVERSATION, "")
        holds = self.state.live_holds(conversation) if conversation else []
        idle_timeout = self.policy.sandbox.idle_timeout_s
        if self._held_elsewhere(info, holds) is not None:
            mine = next((h for h in holds if h.lease_id == self.lease.id), None)
            if mine is not None and now - mine.used_at > idle_timeout:
                self.state.drop_hold(self.lease.id, conversation)  # shared, and unused here: the last one reaps
                self.forget(conversation)
            return None  # another live process uses it: its decision
        reason = self._unusable_reason(info, now)
        if reason is not None:
            return reason
        record = self.state.sandbox(info.id)
        last_used = record.last_used_at if record else float(info.labels.get(LABEL_CREATED_AT, 0))
        if now - last_used > idle_timeout:
            return f"idle longer than idle_timeout_s={idle_timeout}"
        return None

    def _release_idle_holds(self, now: float) -> None:
        """Release the volumes of conversations this process holds without a running sandbox and has not used
        within ``idle_timeout_s``."""
        idle_before = now - self.policy.sandbox.idle_timeout_s
        holds = [h for h in self.state.holds(lease_id=self.lease.id) if h.used_at <= idle_before]
        if not holds:
            return
        using = {
            c.id
            for c in self.backend.list_containers({LABEL_RUNTIME: "1", LABEL_STATE_DIR: self.state_dir_label})
            if c.status in _USING_STATES
        }
        for hold in holds:
            if hold.container_id is not None and hold.container_id in using:
                continue  # its sandbox runs; reaped (and then released) when idle
            lock = self.lock(hold.conversation_id)
            if not lock.acquire(blocking=False):
                continue
            try:
                self._release_volume(hold.conversation_id, used_before=idle_before)
            finally:
                lock.release()

    def sweep_orphans(self) -> list[Removal]:
        """Remove containers with our labels that no runtime owns: their state directory or conversation is gone,
        or they carry no conversation at all (a canary left by a killed process); then reap, and release the
        volumes nothing uses (see :meth:`release_unused_volumes`)."""
        removals: list[Removal] = []
        for info in self.backend.list_containers({LABEL_RUNTIME: "1"}):
            state_dir = info.labels.get(LABEL_STATE_DIR)
            conversation = info.labels.get(LABEL_CONVERSATION)
            if state_dir != self.state_dir_label:
                if state_dir and not Path(state_dir, "state.sqlite3").exists():
                    removals.append(self._remove(info, "orphan: its state directory is gone"))
                    self._release_orphan_volume(state_dir, conversation)
                continue
            age_s = self.clock() - float(info.labels.get(LABEL_CREATED_AT, 0))
            if not conversation or (conversation == CANARY_CONVERSATION and age_s > _CANARY_MAX_AGE_S):
                removals.append(self._remove(info, "orphan: a canary or unnamed container"))
            elif conversation != CANARY_CONVERSATION and self.state.conversation(conversation) is None:
                removal = self._remove_unknown(info, conversation)
                if removal is not None:
                    removals.append(removal)
        removals += self.reap()
        self.release_unused_volumes()
        return removals

    def _remove_unknown(self, info: ContainerInfo, conversation: str) -> Removal | None:
        """Remove a container of a conversation the state database does not know (unless a live process holds
        it) and release its volume."""
        reason = "orphan: its conversation is not in the state database"
        lock = self.lock(conversation)
        if not lock.acquire(blocking=False):
            return None
        try:
            with self._host_lock():
                if self._held_elsewhere(info, self.state.live_holds(conversation)) is not None:
                    return None
                self.state.mark_removed(info.id, reason)
            removal = self._finish_removal(info, reason)
            with self._host_lock():
                if self.store.quota_mode == "loop" and not self._volume_in_use(conversation, None):
                    try:
                        self.store.release(self.store.folders(conversation, quota_mode="loop"))
                    except (QuotaError, ValueError) as exc:
                        logger.warning("could not release the volume of orphan %s: %s", conversation, exc)
            return removal
        finally:
            lock.release()
