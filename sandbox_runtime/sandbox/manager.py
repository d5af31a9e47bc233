"""Sandbox lifecycle: one container per conversation, found again by label, reaped when idle or old.

The manager owns containers only: it is handed a results folder to bind (made and mounted by the conversation
service, :mod:`~sandbox_runtime.conversations`, which owns folders, quota volumes and conversation records), the
per-conversation locks, and a :class:`~sandbox_runtime.sandbox.manager_models.SandboxRecords` to keep its lease, holds
and sandbox rows in.

* ``get_or_create`` returns the conversation's running container or starts one; after a runtime restart it
  re-attaches by label instead of starting a second one.
* ``reap`` removes sandboxes idle longer than ``idle_timeout_s`` or older than ``max_lifetime_s`` (their results
  folders stay); ``sweep_orphans`` removes containers with our labels that nothing owns any more.
* Before the first sandbox starts, the self-check runs (once per process and sandbox configuration); until it
  passes, no sandbox starts (:mod:`~sandbox_runtime.sandbox.canary`).
* A sandbox removed or stopped from outside is replaced on the next use (the results folder stays), and so is
  one whose engine went away during a run (a daemon restart: ``abandon``).

Several processes may share a state directory (``serve``, a host application, a cron'd ``gc``), each under its
own policy: each manager registers a lease and *holds* the conversations it uses, and never removes a sandbox
another live process holds (:mod:`~sandbox_runtime.sandbox.holds`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from sandbox_runtime.errors import SandboxError, SelfCheckFailed
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import ContainerInfo, ContainerSpec, SandboxBackend
from sandbox_runtime.sandbox.canary import CANARY_CONVERSATION, CANARY_MAX_AGE_S, SelfCheckGate
from sandbox_runtime.sandbox.holds import LABEL_LEASE, ConversationLocks, HostLocks, held_elsewhere, own_hold
from sandbox_runtime.sandbox.labels import (
    LABEL_CONVERSATION,
    LABEL_CREATED_AT,
    LABEL_POLICY,
    LABEL_POOL_SLOT,
    LABEL_RUNTIME,
    LABEL_STATE_DIR,
)
from sandbox_runtime.sandbox.manager_models import Removal, ResultsFolder, Sandbox, SandboxRecords
from sandbox_runtime.sandbox.profile import container_spec, sandbox_identity
from sandbox_runtime.sandbox.selfcheck import SelfCheckReport
from sandbox_runtime.state.leases import HoldRecord, LeaseRecord
from sandbox_runtime.state.location import state_dir_in_use
from sandbox_runtime.telemetry.metrics import RuntimeMetrics
from sandbox_runtime.telemetry.tracing import span

__all__ = ["Removal", "Sandbox", "SandboxManager"]

logger = logging.getLogger(__name__)

_USING_STATES = frozenset({"running", "paused", "restarting", "removing"})  # a container that may have the folder


class SandboxManager:
    """Owns the sandboxes of one state directory (together with the other live processes that share it).

    ``locks`` and ``host_locks`` are shared with the owner of the conversations' folders: a conversation's lock
    in this process is held while it is used (the reaper skips it), its host-wide lock while a hold is taken, a
    claim checked or its volume mounted. ``canary_folder`` makes the self-check's results folder for one check
    (``quota_mode``: the store's, as the folders it makes have)."""

    def __init__(
        self,
        backend: SandboxBackend,
        policy: Policy,
        records: SandboxRecords,
        image: str,
        *,
        state_dir: Path,
        locks: ConversationLocks,
        host_locks: HostLocks,
        canary_folder: Callable[[], AbstractContextManager[ResultsFolder]],
        quota_mode: str,
        extra_labels: dict[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        metrics: RuntimeMetrics,
    ) -> None:
        self.backend = backend
        self.metrics = metrics
        self.policy = policy
        self.records = records
        self.image = image
        self.clock = clock
        self.lock = locks
        self.host_lock = host_locks
        self.state_dir_label = str(Path(state_dir).resolve())
        self.base_labels = {LABEL_RUNTIME: "1", LABEL_STATE_DIR: self.state_dir_label, **(extra_labels or {})}
        self.digest = sandbox_identity(policy, image)  # what shapes its sandboxes, not the whole policy
        self._known: dict[str, Sandbox] = {}
        self.lease: LeaseRecord = records.leases.open(self.digest)
        self._checks = SelfCheckGate(
            backend=backend,
            policy=policy,
            canary_folder=canary_folder,
            image=image,
            identity=self.digest,
            quota_mode=quota_mode,
            base_labels=self.base_labels,
            spec_for=self._spec,
            lock=self.lock,
            clock=lambda: self.clock(),  # noqa: PLW0108  (late bound: the manager's clock can be set later)
        )

    def renew_lease(self) -> None:
        """Renew this process's lease (a background job, every third of the policy's ``state.lease_ttl_s``)."""
        if not self.records.leases.renew(self.lease):
            logger.warning(
                "this runtime's lease %s had been counted as gone (not renewed for %g s): registered again",
                self.lease.id,
                self.records.leases.ttl_s,
            )

    def end_lease(self) -> None:
        """Drop this process's lease and holds (at close): its sandboxes and mounts stay for the next start."""
        self.records.leases.close(self.lease.id)
        self._known.clear()

    # self-check ---------------------------------------------------------------------------------------
    def self_check(self, *, force: bool = False) -> SelfCheckReport:
        """Run (once per process, or again with force) the canary check; the report is kept."""
        return self._checks.check(force=force)

    # lifecycle ------------------------------------------------------------------------------------------
    def _spec(self, folder: ResultsFolder, labels: dict[str, str]) -> ContainerSpec:
        return container_spec(self.policy, self.image, folder.path, labels)

    def _labels(self, conversation_id: str) -> dict[str, str]:
        return {**self.base_labels, LABEL_CONVERSATION: conversation_id}

    def held_count(self) -> int:
        """How many conversations' sandboxes this process started or adopted."""
        return len(self._known)

    def known(self, conversation_id: str) -> Sandbox | None:
        """The sandbox this process started or adopted for the conversation, if any (not asking the engine)."""
        return self._known.get(conversation_id)

    def get_or_create(self, conversation_id: str, bind: Callable[[], ResultsFolder]) -> Sandbox:
        """The conversation's running sandbox, re-attached by label when one exists, else a new one; the caller
        holds the conversation's lock. ``bind`` makes the results folder ready (and counts a use) before a
        sandbox is re-attached or started on it. One removed from outside is dropped by its user (``forget``)
        when the engine says so."""
        now = self.clock()
        known = self._known.get(conversation_id)
        if known is not None and now - known.created_at <= self.policy.sandbox.max_lifetime_s:
            return known  # started or adopted by this process; forget() drops it when the engine disagrees
        folder = bind()
        existing = self._adoptable(conversation_id, now)
        if existing is not None:
            created = float(existing.labels.get(LABEL_CREATED_AT, now))
            self.records.record_sandbox(existing.id, conversation_id, created)
            self.records.touch_sandbox(existing.id, now)
            pooled = LABEL_POOL_SLOT in existing.labels
            return self._remember(
                Sandbox(conversation_id=conversation_id, container_id=existing.id, created_at=created, pooled=pooled)
            )
        info = self.start(folder, self._labels(conversation_id), hold_for=conversation_id)
        created = float(info.labels[LABEL_CREATED_AT])
        self.records.record_sandbox(info.id, conversation_id, created)
        logger.info("started sandbox %s for conversation %s", info.id[:12], conversation_id)
        return self._remember(Sandbox(conversation_id=conversation_id, container_id=info.id, created_at=created))

    def start(self, folder: ResultsFolder, labels: dict[str, str], *, hold_for: str | None = None) -> ContainerInfo:
        """Start a hardened container on ``folder`` (once the self-check passed) with these labels and this
        process's own: its creation time, policy and lease (held from its first moment, before a hold names it);
        ``hold_for``: the conversation whose hold names it at once. One the engine could not give the whole profile,
        or that stopped at once, is removed and raises."""
        self._checks.require()
        now = self.clock()
        labels = {**labels, LABEL_CREATED_AT: str(int(now)), LABEL_POLICY: self.digest, LABEL_LEASE: self.lease.id}
        purpose = "pool" if hold_for is None else "conversation"
        with span("sandbox.start", {"sandbox_runtime.sandbox.purpose": purpose}):
            began = time.monotonic()
            try:
                info = self.backend.create_and_start(self._spec(folder, labels))
            except BaseException:
                self.metrics.sandbox_start_failures.labels(self.metrics.backend).inc()
                raise
            self.metrics.sandbox_start_seconds.labels(self.metrics.backend, purpose).observe(time.monotonic() - began)
        if hold_for is not None:
            self.records.leases.hold(self.lease.id, hold_for, self.digest, now, container_id=info.id)
        if info.warnings:
            self._remove(info, "the engine could not apply the profile")
            raise SelfCheckFailed(f"the engine could not apply the profile: {'; '.join(info.warnings)}")
        if not info.running:
            self._remove(info, f"stopped right after it started ({info.status})")
            raise SandboxError(
                f"a sandbox ({hold_for or 'pooled'}) stopped right after it started "
                f"({info.status}, exit code {info.exit_code})"
            )
        return info

    def adopt(self, conversation_id: str, container_id: str, created_at: float) -> Sandbox:
        """Make a pooled sandbox this process started the conversation's: its record and this process's hold name
        it. The caller holds the conversation's locks and has recorded the conversation."""
        self.records.record_sandbox(container_id, conversation_id, created_at)
        self.records.leases.hold(self.lease.id, conversation_id, self.digest, self.clock(), container_id=container_id)
        logger.info("conversation %s took pooled sandbox %s", conversation_id, container_id[:12])
        return self._remember(
            Sandbox(conversation_id=conversation_id, container_id=container_id, created_at=created_at, pooled=True)
        )

    def conversation_of(self, info: ContainerInfo) -> str | None:
        """The conversation a container of this state directory serves: its label, or for a pooled sandbox the
        one its record names (None: no conversation took it yet)."""
        named = info.labels.get(LABEL_CONVERSATION)
        if named is not None or LABEL_POOL_SLOT not in info.labels:
            return named
        record = self.records.sandbox(info.id)
        return None if record is None else record.conversation_id

    def _containers_of(self, conversation_id: str, labels: dict[str, str]) -> list[ContainerInfo]:
        """The conversation's containers that carry ``labels``: those labelled with it, and a pooled one it took
        (found by its record; a record whose container is gone is marked removed)."""
        found = self.backend.list_containers({**labels, LABEL_CONVERSATION: conversation_id})
        listed = {info.id for info in found}
        for record in self.records.live_sandboxes_of(conversation_id):
            if record.container_id in listed:
                continue
            info = self.backend.inspect(record.container_id)
            if info is None:
                self.records.mark_removed(record.container_id, "no longer exists")
            elif LABEL_POOL_SLOT in info.labels and all(info.labels.get(k) == v for k, v in labels.items()):
                found.append(info)
        return found

    def _adoptable(self, conversation_id: str, now: float) -> ContainerInfo | None:
        """The newest usable container of this conversation, claimed by this process; every other one is removed,
        except those another live process holds (that process decides about them)."""
        doomed: list[tuple[ContainerInfo, str]] = []
        keep: ContainerInfo | None = None
        foreign: tuple[ContainerInfo, HoldRecord, str] | None = None
        # claim and removal checks are one step: no process removes what is claimed here
        with self.host_lock(conversation_id):
            found = sorted(
                self._containers_of(conversation_id, self.base_labels),
                key=lambda c: float(c.labels.get(LABEL_CREATED_AT, 0)),
                reverse=True,
            )
            holds = self.records.leases.live_holds(conversation_id)
            for info in found:
                reason = self._unusable_reason(info, now)
                if reason is None and keep is None:
                    keep = info
                    self.records.leases.hold(self.lease.id, conversation_id, self.digest, now, container_id=info.id)
                    continue
                holder = held_elsewhere(info, holds, self.lease.id)
                if holder is not None:
                    if info.running and foreign is None:
                        foreign = (info, holder, reason or "a second sandbox of the conversation")
                    continue
                reason = reason or "duplicate sandbox for one conversation"
                self.records.mark_removed(info.id, reason)
                doomed.append((info, reason))
        for info, reason in doomed:
            self._finish_removal(info, reason)
        if keep is None and foreign is not None:
            info, holder, reason = foreign
            raise SandboxError(
                f"conversation {conversation_id!r} is in use by another runtime (pid {holder.pid} on {holder.host}, "
                f"policy {holder.policy_digest}), whose sandbox {info.id[:12]} this one (policy {self.digest}) "
                f"cannot use: {reason}. Use the conversation from one of them at a time, or under the same policy."
            )
        return keep

    def _unusable_reason(self, info: ContainerInfo, now: float) -> str | None:
        if not info.running:
            return f"not running ({info.status})"
        if info.labels.get(LABEL_POLICY) != self.digest:
            return "made under another policy"
        created = float(info.labels.get(LABEL_CREATED_AT, 0))
        if now - created > self.policy.sandbox.max_lifetime_s:
            return f"older than max_lifetime_s={self.policy.sandbox.max_lifetime_s}"
        record = self.records.sandbox(info.id)
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
        self.records.mark_removed(info.id, reason)
        return self._finish_removal(info, reason)

    def _finish_removal(self, info: ContainerInfo, reason: str) -> Removal:
        """Remove a container already marked removed in the state database (so nobody re-attaches it)."""
        state_dir = info.labels.get(LABEL_STATE_DIR)
        conversation = self.conversation_of(info) if state_dir == self.state_dir_label else None
        known = self._known.get(conversation or "")
        if known is not None and known.container_id == info.id:
            self.forget(known.conversation_id)
        self.backend.remove(info.id)
        logger.info("removed sandbox %s: %s", info.id[:12], reason)
        slot = info.labels.get(LABEL_POOL_SLOT) if conversation is None else None
        return Removal(
            container_id=info.id, conversation_id=conversation, reason=reason, state_dir=state_dir, pool_slot=slot
        )

    def touch(self, sandbox: Sandbox) -> None:
        now = self.clock()
        self.records.touch_sandbox(sandbox.container_id, now)
        self.records.leases.touch_hold(self.lease.id, sandbox.conversation_id, now)

    def discard(self, sandbox: Sandbox, reason: str) -> None:
        """Remove a sandbox that can no longer be trusted to work; the next use starts a fresh one."""
        self.forget(sandbox.conversation_id)
        self.records.mark_removed(sandbox.container_id, reason)
        self.backend.remove(sandbox.container_id)
        logger.warning("removed sandbox %s: %s", sandbox.container_id[:12], reason)

    def abandon(self, sandbox: Sandbox, reason: str) -> None:
        """Never use the sandbox again, without asking the engine (it went away): it is marked removed, so the
        conversation's next use starts a fresh one and removes it (also one a live-restore engine kept running)."""
        self.forget(sandbox.conversation_id)
        self.records.mark_removed(sandbox.container_id, reason)
        logger.warning("abandoned sandbox %s: %s", sandbox.container_id[:12], reason)

    def restart(self, sandbox: Sandbox) -> None:
        """End every process of the sandbox at once (its results folder stays). A pooled one is removed instead
        (the next use starts a fresh one): the engine would bind its slot's old path again."""
        if sandbox.pooled:
            self.discard(sandbox, "every process had to end (a pooled sandbox is replaced, not restarted)")
        else:
            self.backend.restart(sandbox.container_id)

    def close(self, conversation_id: str) -> list[Removal]:
        """Remove every container of the conversation; the caller holds its lock (and releases its folders)."""
        removed = [self._remove(info, "closed") for info in self._containers_of(conversation_id, self.base_labels)]
        self.forget(conversation_id)  # also a sandbox removed from outside, which no listing showed
        return removed

    def mounting(self, conversation_id: str | None = None) -> list[ContainerInfo]:
        """This state directory's containers (of one conversation, whatever their other labels) that may have
        their results folder mounted."""
        labels = {LABEL_RUNTIME: "1", LABEL_STATE_DIR: self.state_dir_label}
        found = (
            self.backend.list_containers(labels)
            if conversation_id is None
            else self._containers_of(conversation_id, labels)
        )
        return [c for c in found if c.status in _USING_STATES]

    # reaping ------------------------------------------------------------------------------------------
    def reap(self) -> list[Removal]:
        """Remove this state directory's sandboxes that are idle, too old, or stopped, except those another live
        process holds, those in use here right now (their lock is taken) and pooled ones no conversation took (their
        pool tends them)."""
        now = self.clock()
        removals: list[Removal] = []
        for info in self.backend.list_containers(self.base_labels):
            named = self.conversation_of(info)
            if named == CANARY_CONVERSATION or (named is None and LABEL_POOL_SLOT in info.labels):
                continue  # a self-check in progress (sweep_orphans removes those killed processes left), or pooled
            conversation = named or ""
            lock = self.lock(conversation)
            if not lock.acquire(blocking=False):
                continue  # in use right now: not idle
            try:
                with self.host_lock(conversation):
                    reason = self._reap_reason(info, conversation, now)
                    if reason is not None:
                        self.records.mark_removed(info.id, reason)
                if reason is not None:
                    removals.append(self._finish_removal(info, reason))
            finally:
                lock.release()
        return removals

    def idle_before(self, now: float) -> float:
        """Uses before this time are older than ``idle_timeout_s``."""
        return now - self.policy.sandbox.idle_timeout_s

    def _reap_reason(self, info: ContainerInfo, conversation: str, now: float) -> str | None:
        """Why the container goes (None: it stays); under the conversation's host-wide lock."""
        holds = self.records.leases.live_holds(conversation) if conversation else []
        idle_timeout = self.policy.sandbox.idle_timeout_s
        if held_elsewhere(info, holds, self.lease.id) is not None:
            mine = own_hold(holds, self.lease.id)
            if mine is not None and now - mine.used_at > idle_timeout:
                self.records.leases.drop_hold(
                    self.lease.id, conversation
                )  # shared, and unused here: the last one reaps
                self.forget(conversation)
            return None  # another live process uses it: its decision
        reason = self._unusable_reason(info, now)
        if reason is not None:
            return reason
        record = self.records.sandbox(info.id)
        last_used = record.last_used_at if record else float(info.labels.get(LABEL_CREATED_AT, 0))
        if now - last_used > idle_timeout:
            return f"idle longer than idle_timeout_s={idle_timeout}"
        return None

    def sweep_orphans(self) -> list[Removal]:
        """Remove containers with our labels that no runtime owns: their state directory or conversation is gone,
        they carry no conversation at all (a canary left by a killed process), or they are pooled sandboxes no
        conversation took whose process ended. A container of a conversation the records do not know is removed
        under its conversation's lock (skipped while the lock is taken or a live process holds it)."""
        removals: list[Removal] = []
        live_leases: set[str] | None = None
        for info in self.backend.list_containers({LABEL_RUNTIME: "1"}):
            state_dir = info.labels.get(LABEL_STATE_DIR)
            if state_dir != self.state_dir_label:
                if state_dir and not state_dir_in_use(Path(state_dir)):
                    removals.append(self._remove(info, "orphan: its state directory is gone"))
                continue
            conversation = self.conversation_of(info)
            if conversation is None and LABEL_POOL_SLOT in info.labels:
                if live_leases is None:
                    live_leases = {lease.id for lease in self.records.leases.live()}
                if info.labels.get(LABEL_LEASE) not in live_leases:
                    removals.append(self._remove(info, "orphan: a pooled sandbox whose process ended"))
                continue  # else its live process's pool tends it
            age_s = self.clock() - float(info.labels.get(LABEL_CREATED_AT, 0))
            if not conversation or (conversation == CANARY_CONVERSATION and age_s > CANARY_MAX_AGE_S):
                removals.append(self._remove(info, "orphan: a canary or unnamed container"))
            elif conversation != CANARY_CONVERSATION and not self.records.knows_conversation(conversation):
                removal = self._remove_unknown(info, conversation)
                if removal is not None:
                    removals.append(removal)
        return removals

    def _remove_unknown(self, info: ContainerInfo, conversation: str) -> Removal | None:
        """Remove a container of a conversation the records do not know, unless it is in use."""
        reason = "orphan: its conversation is not in the state database"
        lock = self.lock(conversation)
        if not lock.acquire(blocking=False):
            return None
        try:
            with self.host_lock(conversation):
                if held_elsewhere(info, self.records.leases.live_holds(conversation), self.lease.id) is not None:
                    return None
                self.records.mark_removed(info.id, reason)
            return self._finish_removal(info, reason)
        finally:
            lock.release()
