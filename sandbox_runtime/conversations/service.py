"""The conversation service: one state directory's conversations, apart from their containers.

It owns what a conversation is on the host — its folders (made, and with quota mode ``loop`` mounted, only while
in use), its record in the state database, its lock in this process, its run numbers — and ends it: ``close``
(the sandbox goes, the folders stay) and ``delete`` (everything goes). Containers are the
:class:`~sandbox_runtime.sandbox.manager.SandboxManager`'s: the service hands it the results folder to bind and
releases a conversation's quota volume once no container uses it (:mod:`~sandbox_runtime.conversations.volumes`).

A conversation deleted by another runtime or process starts afresh here on its next use: what this process knew of
its sandbox is dropped, and its folders and record are made anew.

With a warm pool (:mod:`~sandbox_runtime.sandbox.pool`), a new conversation's first use takes a pooled sandbox:
its slot's folders become the conversation's (:mod:`~sandbox_runtime.conversations.pool_slots`) and the sandbox is
recorded as its own, so the first call finds folders, quota volume, sandbox and executor ready.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from sandbox_runtime.conversations.handle import SandboxHandle
from sandbox_runtime.conversations.pool_slots import PoolSlots, ended_leases
from sandbox_runtime.conversations.volumes import QuotaVolumes, release_orphan_volume
from sandbox_runtime.errors import AdmissionRefused, QuotaError, SandboxError
from sandbox_runtime.models import QuotaMode
from sandbox_runtime.policy import Policy, PoolPolicy
from sandbox_runtime.sandbox.backend import SandboxBackend
from sandbox_runtime.sandbox.canary import CANARY_CONVERSATION
from sandbox_runtime.sandbox.holds import LABEL_LEASE, ConversationLocks, HostLocks, RunLock
from sandbox_runtime.sandbox.labels import LABEL_POOL_SLOT, LABEL_RUNTIME, LABEL_STATE_DIR
from sandbox_runtime.sandbox.manager import SandboxManager
from sandbox_runtime.sandbox.manager_models import Removal, ResultsFolder, Sandbox
from sandbox_runtime.sandbox.pool import WarmPool
from sandbox_runtime.sandbox.run_protocol import PYTHON, run_request
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.store.folders import ConversationFolders, ConversationStore
from sandbox_runtime.store.quota import QuotaUsage
from sandbox_runtime.telemetry.metrics import Metric, RuntimeMetrics, counter, gauge
from sandbox_runtime.telemetry.tracing import span
from sandbox_runtime.tenancy import key_tag

__all__ = ["ConversationService"]

logger = logging.getLogger(__name__)

_CANARY_QUOTA_BYTES = 16 * 1024 * 1024  # the self-check writes a few bytes and probes the quota's edge
_SHARE_LOOK_S = 0.5  # a conversation waiting for its tenant's sandbox share looks again this often


class ConversationService:
    """The conversations of one state directory, and (through its manager) their sandboxes, and a warm pool for new
    conversations once :meth:`start_pool` made one."""

    def __init__(
        self,
        backend: SandboxBackend,
        policy: Policy,
        store: ConversationStore,
        state: StateDB,
        image: str,
        *,
        extra_labels: dict[str, str] | None = None,
        metrics: RuntimeMetrics,
    ) -> None:
        self.policy = policy
        self.store = store
        self.state = state
        self.metrics = metrics
        self.manager = SandboxManager(
            backend,
            policy,
            state,
            image,
            state_dir=store.state_dir,
            locks=ConversationLocks(),
            host_locks=HostLocks(state.engine.lock),
            canary_folder=self._canary_folder,
            quota_mode=store.quota_mode,
            extra_labels=extra_labels,
            metrics=metrics,
        )
        self.volumes = QuotaVolumes(manager=self.manager, store=store, state=state)
        self.slots = PoolSlots(store, self.manager.lease.id)
        self.pool: WarmPool | None = None
        self._cold_starts = 0
        self._cold_start_guard = threading.Lock()

    def start_pool(self, policy: PoolPolicy, *, refill: bool = True) -> WarmPool:
        """Make the warm pool ``policy`` describes (``refill=False``: for one new conversation only); its owner runs
        :meth:`WarmPool.tend` as a job."""
        # the executor is loaded for every run_python's requests (they differ only in program and time limit)
        request = run_request(self.policy, self.policy.run.default_timeout_s, (PYTHON, "-c", "pass"))
        self.pool = WarmPool(self.manager, policy, self.slots, request, refill=refill, cold_starts=self.cold_starts)
        return self.pool

    def is_new(self, conversation_id: str) -> bool:
        """Whether the conversation has no folders (nor volume) yet: only such a one can take a pooled sandbox."""
        folders = self.store.folders(conversation_id)
        return not folders.root.exists() and not folders.volume.exists()

    def lock(self, conversation_id: str) -> threading.RLock:
        """The lock that serialises everything done in one conversation's sandbox, in this process."""
        return self.manager.lock(conversation_id)

    def run_lock(self, conversation_id: str) -> RunLock:
        """The lock a run holds from its start to its end: :meth:`lock`, and the conversation's run lock across
        the processes that share the state directory (two processes never run in one sandbox at once)."""
        return RunLock(self.lock(conversation_id), self.manager.host_lock.run_lock(conversation_id))

    # folders -------------------------------------------------------------------------------------------
    def folders(self, conversation_id: str, *, use: bool = True) -> ConversationFolders:
        """The conversation's folders (made and mounted when needed), recorded in the state database, and held
        by this process (``use=False``: for a short look, which does not count as a use).

        One at a time per conversation, across the processes of the state directory (under its host-wide lock,
        apart from its lock in this process so that a running script does not hold up the conversation's other
        tools): calls that arrive together must not mount twice, and no other process unmounts what this one
        just claimed. Other conversations are not held up, even while this one's volume is made. A new
        conversation's first use takes a sandbox from the warm pool, when one waits."""
        manager = self.manager
        with manager.host_lock(conversation_id):
            record = self.state.conversation(conversation_id)
            if record is None:
                self._drop_deleted(conversation_id)
                taken = self._take_pooled(conversation_id) if use and self._pool_for(conversation_id) else None
                if taken is not None:
                    return taken
            mode = self.store.quota_mode if record is None else record.quota_mode
            folders = self.store.folders(conversation_id, quota_mode=mode)  # type: ignore[arg-type]
            self.state.leases.hold(manager.lease.id, conversation_id, manager.digest, manager.clock(), use=use)
            self.store.prepare(folders)
            self.state.ensure_conversation(conversation_id, folders.quota_mode, folders.quota_bytes)
            return folders

    def _pool_for(self, conversation_id: str) -> bool:
        """Whether a new conversation may take a pooled sandbox: a pool waits, and its tenant has room for one
        more sandbox (else its folders are made plain, and its first run waits for its share)."""
        if self.pool is None:
            return False
        live = self.state.live_sandbox_count(key_tag(conversation_id))
        return live < self.policy.admission.tenant_sandboxes_max

    def gauges(self) -> Iterator[Metric]:
        """This runtime's sandboxes and warm pool, for a scrape."""
        backend, runtime = self.manager.backend.name, self.policy.sandbox.runtime
        yield gauge(
            "sandboxes",
            "Sandboxes this runtime holds for conversations (the warm pool's apart).",
            [((backend, runtime), self.manager.held_count())],
            ["backend", "runtime"],
        )
        pool = self.pool
        ready, starting = (pool.ready(), pool.starting()) if pool is not None else (0, 0)
        yield gauge(
            "pool_sandboxes",
            "Warm sandboxes ready for new conversations, and being started.",
            [(("ready",), ready), (("starting",), starting)],
            ["state"],
        )
        yield gauge(
            "pool_target_sandboxes",
            "Warm sandboxes the pool keeps ready now (it follows the demand of new conversations).",
            0 if pool is None else pool.target(),
        )
        yield counter(
            "executor_restarts",
            "Resident executors a run ended or got around (the next run started a fresh one).",
            [((backend,), self.manager.backend.executor_restarts())],
            ["backend"],
        )

    def tenant_bytes(self, tag: str) -> int:
        """Bytes the results folders of a tenant's conversations hold (by its tag; see
        :meth:`~sandbox_runtime.store.folders.ConversationStore.held_bytes`)."""
        held = 0
        for record in self.state.conversations():
            if key_tag(record.id) == tag:
                mode: QuotaMode = "loop" if record.quota_mode == "loop" else "measured"
                held += self.store.held_bytes(self.store.folders(record.id, quota_mode=mode))
        return held

    def _take_pooled(self, conversation_id: str) -> ConversationFolders | None:
        """A new conversation's folders and sandbox from the warm pool; None when none waits or the conversation
        has folders from before. Under the conversation's host-wide lock."""
        assert self.pool is not None  # noqa: S101  (the caller checked)
        if not self.is_new(conversation_id):
            return None
        with span("pool.take") as taking:
            pooled = self.pool.take()
            taking.set_attribute("sandbox_runtime.pool.hit", pooled is not None)
        self.metrics.pool_takes.labels("miss" if pooled is None else "hit").inc()
        if pooled is None:
            return None
        try:
            folders = self.slots.adopt(pooled.slot, conversation_id)
        except OSError as exc:
            logger.warning("could not hand pooled sandbox %s to %s: %s", pooled.container_id[:12], conversation_id, exc)
            self.pool.discard(pooled)
            return None
        self.state.ensure_conversation(conversation_id, folders.quota_mode, folders.quota_bytes)
        self.manager.adopt(conversation_id, pooled.container_id, pooled.created_at)
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
            idle_before = self.manager.idle_before(self.manager.clock())
            self.volumes.release_if_free(conversation_id, used_before=idle_before)

    def usage(self, conversation_id: str) -> QuotaUsage:
        """Bytes used in the results folder against the quota (a short look)."""
        with self.borrowed(conversation_id) as folders:
            return self.store.usage(folders)

    def begin_run(self, conversation_id: str, sandbox: Sandbox) -> int:
        """The conversation's next run number, with the use of its sandbox (and this process's hold) recorded in
        the same transaction (``ConversationDeleted`` when it was deleted meanwhile)."""
        manager = self.manager
        return self.state.begin_run(conversation_id, sandbox.container_id, manager.lease.id, manager.clock())

    # sandboxes ------------------------------------------------------------------------------------------
    def sandbox(self, conversation_id: str) -> Sandbox:
        """The conversation's running sandbox, started (or re-attached) when needed; a new one only while its
        tenant has fewer than ``admission.tenant_sandboxes_max`` live sandboxes (every replica's), waiting up to
        ``admission.max_wait_s`` for one to end (:class:`AdmissionRefused` then)."""
        with self.lock(conversation_id):
            if self.manager.known(conversation_id) is not None and not self.state.knows_conversation(conversation_id):
                self._drop_deleted(conversation_id)
            if self.manager.known(conversation_id) is not None or self.state.live_sandboxes_of(conversation_id):
                return self.manager.get_or_create(conversation_id, lambda: self._bind(conversation_id))
            return self._start_within_share(conversation_id)

    def _start_within_share(self, conversation_id: str) -> Sandbox:
        """Start the conversation's sandbox once its tenant has room. The room is taken under the tenant's lock
        across processes (a start recorded while the lock is held counts as a live sandbox, so two starts never
        both take its last place); the engine then starts the sandbox without the lock, beside the tenant's other
        starts."""
        admission, tag = self.policy.admission, key_tag(conversation_id)
        leases, lease_id = self.state.leases, self.manager.lease.id
        started = self.manager.clock()
        deadline = started + admission.max_wait_s
        while True:
            with self.manager.host_lock(f"sandboxes.{tag or 'default'}"):
                live = self.state.live_sandbox_count(tag)
                if live < admission.tenant_sandboxes_max:
                    leases.begin_start(lease_id, conversation_id, self.manager.clock())
                    break
            if self.manager.clock() >= deadline:
                tenant = self.state.tenants.of_key(conversation_id)
                raise AdmissionRefused(
                    f"tenant {tenant!r} has {live} live sandboxes, its most (admission.tenant_sandboxes_max), and "
                    f"none ended within {admission.max_wait_s:g} s (admission.max_wait_s); nothing ran: close "
                    f"conversations it no longer uses, or try again in {admission.retry_after_s:g} s",
                    retry_after_s=admission.retry_after_s,
                    waited_s=self.manager.clock() - started,
                )
            time.sleep(_SHARE_LOOK_S)  # another conversation's sandbox may end (reaped, closed) meanwhile
        with self._cold_start_guard:
            self._cold_starts += 1
        try:
            return self.manager.get_or_create(conversation_id, lambda: self._bind(conversation_id))
        finally:
            leases.end_start(lease_id, conversation_id)  # the sandbox's record counts now (or none was made)
            with self._cold_start_guard:
                self._cold_starts -= 1

    def cold_starts(self) -> int:
        """How many conversations' sandboxes this process is starting now (the warm pool grows only after them)."""
        with self._cold_start_guard:
            return self._cold_starts

    def handle(self, conversation_id: str, folders: ConversationFolders | None = None) -> SandboxHandle:
        """What a tool uses of the conversation's sandbox (``folders``: already made for this call)."""
        return SandboxHandle(self, conversation_id, self.folders(conversation_id) if folders is None else folders)

    def _bind(self, conversation_id: str) -> ResultsFolder:
        folders = self.folders(conversation_id)
        return ResultsFolder(str(folders.results), folders.quota_mode)

    def _drop_deleted(self, conversation_id: str) -> None:
        """The conversation has no record: when this process knew a sandbox of it, it was deleted elsewhere."""
        if self.manager.known(conversation_id) is not None:
            logger.info("conversation %s was deleted elsewhere; starting it afresh", conversation_id)
            self.manager.forget(conversation_id)

    @contextlib.contextmanager
    def _canary_folder(self) -> Iterator[ResultsFolder]:
        """The self-check's results folder, apart from every conversation's, removed after the check."""
        folders = self.store.canary_folders(_CANARY_QUOTA_BYTES, self.manager.lease.id)
        folders.root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.store.prepare(folders)
        try:
            yield ResultsFolder(str(folders.results), folders.quota_mode)
        finally:
            self.store.delete(folders)

    # ending ---------------------------------------------------------------------------------------------
    def release_all(self) -> None:
        """At this process's close (its calls ended): remove what its warm pool left (a sandbox whose start was in
        flight, and every slot of its own, unmounted), then unmount the volumes of the conversations it holds
        that no other live process holds (:meth:`QuotaVolumes.release_held`). Conversations' sandboxes keep
        running for the next process; nothing of this process stays mounted."""
        left = set(self.slots.own())
        if left:
            manager = self.manager
            mine = {LABEL_RUNTIME: "1", LABEL_STATE_DIR: manager.state_dir_label, LABEL_LEASE: manager.lease.id}
            for info in manager.backend.list_containers(mine):
                if info.labels.get(LABEL_POOL_SLOT) in left and manager.conversation_of(info) is None:
                    try:
                        manager.backend.remove(info.id)
                    except SandboxError as exc:
                        logger.warning("could not remove pooled sandbox %s: %s", info.id[:12], exc)
            for slot in sorted(left):
                try:
                    self.slots.drop(slot)
                except (QuotaError, OSError) as exc:
                    logger.warning("could not remove pool slot %s: %s", slot, exc)
        self.manager.backend.let_go_of_folders()
        self.volumes.release_held()

    def close(self, conversation_id: str) -> bool:
        """End the conversation's sandbox and release its quota volume (unless another live process holds it);
        its folders stay. True when a sandbox was running."""
        with self.lock(conversation_id):
            removed = self.manager.close(conversation_id)
            if not self.volumes.release(conversation_id):  # done with it: the next gc releases it
                self.state.leases.touch_hold(self.manager.lease.id, conversation_id, 0.0)
        return bool(removed)

    def delete(self, conversation_id: str) -> None:
        """End the sandbox and delete every file and record of the conversation (results, outputs, quota volume,
        stored results)."""
        with self.lock(conversation_id):
            self.close(conversation_id)
            record = self.state.conversation(conversation_id)
            if record is not None:
                mode = record.quota_mode
                self.store.delete(self.store.folders(conversation_id, quota_mode=mode))  # type: ignore[arg-type]
                self.state.forget_conversation(conversation_id)
            self.manager.host_lock.remove(conversation_id)

    def reap(self) -> list[Removal]:
        """End the resident executors idle longer than ``executor_idle_s``, remove the sandboxes that are idle,
        too old or stopped (never one another live process holds), then release the quota volumes this process no
        longer uses."""
        self.manager.backend.drop_idle_executors(self.policy.sandbox.executor_idle_s)
        idle_before = self.manager.idle_before(self.manager.clock())
        removals = self.manager.reap()
        for removal in removals:
            if removal.conversation_id:
                self.volumes.release_if_free(removal.conversation_id, used_before=idle_before)
        self.volumes.release_idle_holds(idle_before)
        return removals

    def sweep(self) -> list[Removal]:
        """Remove the containers no runtime owns and release their volumes, reap, then release the volumes
        nothing uses (see :meth:`QuotaVolumes.release_unused`)."""
        removals = self.manager.sweep_orphans()
        live = {lease.id for lease in self.state.leases.live()}
        self.slots.sweep(live, {c.labels.get(LABEL_POOL_SLOT, "") for c in self.manager.mounting()})
        for lease in ended_leases(self.store.state_dir / "canary", live):  # a process killed during its self-check
            try:
                self.store.delete(self.store.canary_folders(_CANARY_QUOTA_BYTES, lease))
            except (QuotaError, OSError) as exc:
                logger.warning("could not remove the self-check folder of an ended process %s: %s", lease, exc)
        for removal in removals:
            conversation = removal.conversation_id
            if removal.state_dir != self.manager.state_dir_label:
                if removal.state_dir:
                    release_orphan_volume(removal.state_dir, conversation)
            elif conversation and conversation != CANARY_CONVERSATION:
                self.volumes.release_unrecorded(conversation)
        removals += self.reap()
        self.volumes.release_unused(self.manager.idle_before(self.manager.clock()))
        return removals
