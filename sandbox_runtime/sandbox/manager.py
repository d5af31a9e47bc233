"""Sandbox lifecycle: one container per conversation, found again by label, reaped when idle or old.

* ``get_or_create`` returns the conversation's running container or starts one; after a runtime restart it
  re-attaches by label instead of starting a second one.
* ``reap`` removes sandboxes idle longer than ``idle_timeout_s`` or older than ``max_lifetime_s`` (their results
  folders stay); ``sweep_orphans`` removes containers with our labels that nothing owns any more.
* Before the first sandbox of a process starts, the self-check runs; when it fails, no sandbox ever starts
  (:mod:`~sandbox_runtime.sandbox.canary`).
* A sandbox removed or stopped from outside is replaced on the next use (the results folder stays), and so is
  one whose engine went away during a run (a daemon restart: ``abandon``); a conversation deleted by another
  runtime or process starts afresh here (what this process knew of it is dropped, its folders and record are
  made anew).

Several processes may share a state directory (``serve``, a host application, a cron'd ``gc``), each under its
own policy: each manager registers a lease and *holds* the conversations it uses, and never removes a sandbox
another live process holds (:mod:`~sandbox_runtime.sandbox.holds`); a quota volume is mounted only while it is
in use (:mod:`~sandbox_runtime.sandbox.volumes`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sandbox_runtime.errors import SandboxError, SelfCheckFailed
from sandbox_runtime.leases import HoldRecord, LeaseRecord
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import ContainerInfo, ContainerSpec, SandboxBackend
from sandbox_runtime.sandbox.canary import CANARY_CONVERSATION, CANARY_MAX_AGE_S, SelfCheckGate
from sandbox_runtime.sandbox.holds import LABEL_LEASE, HostLock, held_elsewhere, own_hold
from sandbox_runtime.sandbox.profile import (
    LABEL_CONVERSATION,
    LABEL_CREATED_AT,
    LABEL_POLICY,
    LABEL_RUNTIME,
    LABEL_STATE_DIR,
    container_spec,
)
from sandbox_runtime.sandbox.records import Removal, Sandbox
from sandbox_runtime.sandbox.selfcheck import SelfCheckReport
from sandbox_runtime.sandbox.volumes import QuotaVolumes, release_orphan_volume
from sandbox_runtime.state import StateDB
from sandbox_runtime.store.folders import ConversationFolders, ConversationStore

__all__ = ["Removal", "Sandbox", "SandboxManager"]

logger = logging.getLogger(__name__)


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
        self._host_lock = HostLock(Path(store.state_dir) / "mounts.lock")
        self._known: dict[str, Sandbox] = {}
        self.lease: LeaseRecord = state.leases.open(self._digest)
        self.volumes = QuotaVolumes(
            backend=backend,
            store=store,
            state=state,
            host_lock=self._host_lock,
            lease_id=self.lease.id,
            state_dir_label=self.state_dir_label,
            lock=self.lock,
            forget=self.forget,
        )
        self._checks = SelfCheckGate(
            backend=backend,
            policy=policy,
            store=store,
            image=image,
            base_labels=self.base_labels,
            spec_for=self._spec,
            lock=self.lock,
            clock=lambda: self.clock(),  # noqa: PLW0108  (late bound: the manager's clock can be set later)
        )

    def end_lease(self) -> None:
        """Drop this process's lease and holds (at close): its sandboxes and mounts stay for the next start."""
        self.state.leases.close(self.lease.id)
        self._known.clear()

    # locking ------------------------------------------------------------------------------------------
    def lock(self, conversation_id: str) -> threading.RLock:
        """The lock that serialises everything done in one conversation's sandbox."""
        with self._locks_guard:
            return self._locks.setdefault(conversation_id, threading.RLock())

    # self-check ---------------------------------------------------------------------------------------
    def self_check(self, *, force: bool = False) -> SelfCheckReport:
        """Run (once per process, or again with force) the canary check; the report is kept."""
        return self._checks.check(force=force)

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
            self.state.leases.hold(self.lease.id, conversation_id, self._digest, self.clock(), use=use)
            self.store.prepare(folders)
            self.state.ensure_conversation(conversation_id, folders.quota_mode, folders.quota_bytes)
            return folders

    @contextlib.contextmanager
    def borrowed(self, conversation_id: str) -> Iterator[ConversationFolders]:
        """The conversation's folders for a short look (its disk use, retention): mounted for the look when they
        were not, and released again afterwards when nothing uses them (no sandbox, no use by this or another
        process)."""
        try:
            with self.volumes.looking(conversation_id):
                yield self.folders(conversation_id, use=False)
        finally:
            self.volumes.release_if_free(conversation_id, used_before=self._idle_before(self.clock()))

    def get_or_create(self, conversation_id: str) -> Sandbox:
        """The conversation's running sandbox, re-attached by label when one exists, else a new one. The sandbox
        this process knew is not used when the conversation was deleted meanwhile (by another runtime): it
        starts afresh; one removed from outside is dropped by its user (``forget``) when the engine says so."""
        with self.lock(conversation_id):
            now = self.clock()
            known = self._known.get(conversation_id)
            if known is not None and self.state.conversation(conversation_id) is None:
                logger.info("conversation %s was deleted elsewhere; starting it afresh", conversation_id)
                known = None
                self.forget(conversation_id)
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
            self._checks.require()
            labels = {
                **self._labels(conversation_id),
                LABEL_CREATED_AT: str(int(now)),
                LABEL_POLICY: self._digest,
                LABEL_LEASE: self.lease.id,  # held from its first moment, before the hold names it
            }
            info = self.backend.create_and_start(self._spec(folders, labels))
            self.state.leases.hold(self.lease.id, conversation_id, self._digest, now, container_id=info.id)
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
            holds = self.state.leases.live_holds(conversation_id)
            for info in found:
                reason = self._unusable_reason(info, now)
                if reason is None and keep is None:
                    keep = info
                    self.state.leases.hold(self.lease.id, conversation_id, self._digest, now, container_id=info.id)
                    continue
                holder = held_elsewhere(info, holds, self.lease.id)
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
        self.state.leases.touch_hold(self.lease.id, sandbox.conversation_id, now)

    def discard(self, sandbox: Sandbox, reason: str) -> None:
        """Remove a sandbox that can no longer be trusted to work; the next use starts a fresh one."""
        self.forget(sandbox.conversation_id)
        self.state.mark_removed(sandbox.container_id, reason)
        self.backend.remove(sandbox.container_id)
        logger.warning("removed sandbox %s: %s", sandbox.container_id[:12], reason)

    def abandon(self, sandbox: Sandbox, reason: str) -> None:
        """Never use the sandbox again, without asking the engine (it went away): it is marked removed, so the
        conversation's next use starts a fresh one and removes it (also one a live-restore engine kept running)."""
        self.forget(sandbox.conversation_id)
        self.state.mark_removed(sandbox.container_id, reason)
        logger.warning("abandoned sandbox %s: %s", sandbox.container_id[:12], reason)

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
            if not self.volumes.release(conversation_id):  # done with it: the next gc releases it
                self.state.leases.touch_hold(self.lease.id, conversation_id, 0.0)
            self.forget(conversation_id)  # also a sandbox removed from outside, which no listing showed
        return bool(removed)

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
                    self.volumes.release(conversation, used_before=self._idle_before(now))
            finally:
                lock.release()
        self.volumes.release_idle_holds(self._idle_before(now))
        return removals

    def _idle_before(self, now: float) -> float:
        """Uses before this time are older than ``idle_timeout_s``."""
        return now - self.policy.sandbox.idle_timeout_s

    def _reap_reason(self, info: ContainerInfo, now: float) -> str | None:
        """Why the container goes (None: it stays); under the state directory's lock."""
        conversation = info.labels.get(LABEL_CONVERSATION, "")
        holds = self.state.leases.live_holds(conversation) if conversation else []
        idle_timeout = self.policy.sandbox.idle_timeout_s
        if held_elsewhere(info, holds, self.lease.id) is not None:
            mine = own_hold(holds, self.lease.id)
            if mine is not None and now - mine.used_at > idle_timeout:
                self.state.leases.drop_hold(self.lease.id, conversation)  # shared, and unused here: the last one reaps
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

    def sweep_orphans(self) -> list[Removal]:
        """Remove containers with our labels that no runtime owns: their state directory or conversation is gone,
        or they carry no conversation at all (a canary left by a killed process); then reap, and release the
        volumes nothing uses (see :meth:`QuotaVolumes.release_unused`)."""
        removals: list[Removal] = []
        for info in self.backend.list_containers({LABEL_RUNTIME: "1"}):
            state_dir = info.labels.get(LABEL_STATE_DIR)
            conversation = info.labels.get(LABEL_CONVERSATION)
            if state_dir != self.state_dir_label:
                if state_dir and not Path(state_dir, "state.sqlite3").exists():
                    removals.append(self._remove(info, "orphan: its state directory is gone"))
                    release_orphan_volume(state_dir, conversation)
                continue
            age_s = self.clock() - float(info.labels.get(LABEL_CREATED_AT, 0))
            if not conversation or (conversation == CANARY_CONVERSATION and age_s > CANARY_MAX_AGE_S):
                removals.append(self._remove(info, "orphan: a canary or unnamed container"))
            elif conversation != CANARY_CONVERSATION and self.state.conversation(conversation) is None:
                removal = self._remove_unknown(info, conversation)
                if removal is not None:
                    removals.append(removal)
        removals += self.reap()
        self.volumes.release_unused(self._idle_before(self.clock()))
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
                if held_elsewhere(info, self.state.leases.live_holds(conversation), self.lease.id) is not None:
                    return None
                self.state.mark_removed(info.id, reason)
            removal = self._finish_removal(info, reason)
            self.volumes.release_unrecorded(conversation)
            return removal
        finally:
            lock.release()
