"""Fair admission: how the tenants of one runtime share its capacity (the policy's ``[admission]``).

A call a model (or host) makes takes a **run slot** while it runs: at most ``tenant_runs_max`` of one tenant at
once and ``runs_max`` of all tenants (this runtime's; each replica counts its own). A call that finds no free
slot waits in its tenant's queue: first come first served within a tenant, and **round-robin across tenants**: when
a slot frees, the next tenant after the one served last that has a call waiting (and a slot of its own left) is
served, so one tenant's burst of twenty calls delays another tenant's single call by at most one slot's release (the
waiting tenant served longest ago goes first; one with nothing running or waiting counts as never served).
While it waits, a call reports its place in line as progress (``notifications/progress`` over MCP), about once a
second; one cancelled leaves the queue and never runs; one that waited ``max_wait_s`` fails with
:class:`~sandbox_runtime.errors.AdmissionRefused` carrying ``retry_after_s`` and the wait it measured
(``waited_s``; 0 for a refusal at once).

Calls a ``run_python`` script makes (``sandbox_tools``) run inside their run's slot and never queue (a script
waiting for a slot its own run holds would never end); a stored decision replayed takes no slot; a host's own
result handed in takes none.

A tenant whose results folders hold ``tenant_disk_max_bytes`` or more is refused at once (waiting frees no
disk). Its usage is measured in the background (:meth:`Admission.measure_disk`, every ``DISK_LOOK_S`` seconds, for
the tenants that made calls since: the allocated blocks of each conversation's quota volume, or a bounded walk of
its folder), never on a call's way: a call is checked against the last measure. The sandbox limit
(``tenant_sandboxes_max``) is kept where sandboxes start (:mod:`~sandbox_runtime.conversations.service`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import AdmissionRefused, SandboxRuntimeError
from sandbox_runtime.policy.admission import AdmissionPolicy
from sandbox_runtime.telemetry.metrics import Metric, RuntimeMetrics, gauge, top_series
from sandbox_runtime.telemetry.tracing import span

__all__ = ["DISK_LOOK_S", "Admission", "Admitted", "TenantQuota"]

logger = logging.getLogger(__name__)

DISK_LOOK_S = 30.0
_PROGRESS_EVERY_S = 1.0


class TenantQuota(BaseModel):
    """What a tenant uses and may use now (``_meta["sandbox-runtime/quota"]`` of every MCP result)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str
    runs: int
    runs_max: int
    waiting: int
    runs_all: int  # every tenant's, in this runtime
    runs_all_max: int
    sandboxes: int | None = None
    sandboxes_max: int
    disk_bytes: int | None = None  # as last measured (at most DISK_LOOK_S old)
    disk_max_bytes: int
    waited_s: float = 0.0  # how long the call waited for its turn


@dataclass
class Admitted:
    """A call's turn: how long it waited (``cancelled``: it left the queue instead, and must not run)."""

    tenant: str
    waited_s: float = 0.0
    cancelled: bool = False


@dataclass
class _Ticket:
    tenant: str
    granted: threading.Event = field(default_factory=threading.Event)


class Admission:
    """The run slots of one runtime and the fair queue in front of them (see the module text). ``disk_used``
    measures a tenant's results folders in bytes (None: no disk limit is kept)."""

    def __init__(
        self,
        policy: AdmissionPolicy,
        disk_used: Callable[[str], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        self.policy = policy
        self._disk_used = disk_used
        self._metrics = metrics if metrics is not None else RuntimeMetrics()  # counted, if nobody reads them
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        self._running_all = 0
        self._queues: dict[str, deque[_Ticket]] = {}  # in the order tenants began to wait
        self._granted_at: dict[str, int] = {}  # a tenant with calls running or waiting -> its last grant's number
        self._grants = 0
        self._disk: dict[str, tuple[float, int]] = {}  # tenant -> (measured at, bytes)
        self._disk_seen: set[str] = set()  # tenants that made a call since the last look

    @contextlib.contextmanager
    def slot(self, tenant: str, control: CallControl | None = None) -> Iterator[Admitted]:
        """Hold one run slot of ``tenant`` for the block (waiting for it first; see the module text)."""
        try:
            self._check_disk(tenant)
            with span("admission.wait"):
                admitted = self._wait_for_turn(tenant, control)
        except AdmissionRefused:
            self._metrics.admission_refused.inc()
            raise
        self._metrics.admission_wait_seconds.observe(admitted.waited_s)
        if admitted.cancelled:
            yield admitted
            return
        try:
            yield admitted
        finally:
            with self._lock:
                self._running[tenant] -= 1
                self._running_all -= 1
                if not self._running[tenant]:
                    del self._running[tenant]
                    if tenant not in self._queues:
                        self._granted_at.pop(tenant, None)  # idle again: first in line next time
                self._serve()

    def quota(self, tenant: str, *, waited_s: float = 0.0, sandboxes: int | None = None) -> TenantQuota:
        with self._lock:
            runs, runs_all = self._running.get(tenant, 0), self._running_all
            waiting = len(self._queues.get(tenant, ()))
            disk = self._disk.get(tenant)
        return TenantQuota(
            tenant=tenant,
            runs=runs,
            runs_max=self.policy.tenant_runs_max,
            waiting=waiting,
            runs_all=runs_all,
            runs_all_max=self.policy.runs_max,
            sandboxes=sandboxes,
            sandboxes_max=self.policy.tenant_sandboxes_max,
            disk_bytes=None if disk is None else disk[1],
            disk_max_bytes=self.policy.tenant_disk_max_bytes,
            waited_s=round(waited_s, 3),
        )

    def gauges(self, tenant_series_max: int) -> Iterator[Metric]:
        """The queue and the tenants' disk, for a scrape (the ``tenant_series_max`` tenants holding the most)."""
        with self._lock:
            waiting = sum(len(queue) for queue in self._queues.values())
            running = self._running_all
            disk = {tenant: float(used) for tenant, (_, used) in self._disk.items()}
        yield gauge("admission_waiting_calls", "Calls waiting for a run slot.", waiting)
        yield gauge("admission_running_calls", "Calls holding a run slot.", running)
        named = top_series(disk, tenant_series_max)
        yield gauge(
            "tenant_results_bytes",
            "Bytes a tenant's results folders hold, as last measured (every 30 s, the tenants that made calls).",
            (((tenant,), used) for tenant, used in named.items()),
            ["tenant"],
        )
        limit = float(self.policy.tenant_disk_max_bytes)
        yield gauge(
            "tenant_results_quota_bytes",
            "The bytes a tenant's results folders may hold (admission.tenant_disk_max_bytes).",
            (((tenant,), limit) for tenant in named if tenant in disk),
            ["tenant"],
        )

    # ------------------------------------------------------------------------------------------ the queue
    def _wait_for_turn(self, tenant: str, control: CallControl | None) -> Admitted:
        started = self._clock()
        ticket = _Ticket(tenant)
        with self._lock:
            if not self._queues and self._free(tenant):  # nobody waits: straight in
                self._grant(ticket)
                return Admitted(tenant)
            self._queues.setdefault(tenant, deque()).append(ticket)
            self._serve()
        deadline = started + self.policy.max_wait_s
        while not ticket.granted.wait(timeout=max(0.0, min(_PROGRESS_EVERY_S, deadline - self._clock()))):
            if control is not None and control.is_cancelled and self._leave(ticket):
                return Admitted(tenant, waited_s=self._clock() - started, cancelled=True)
            if self._clock() >= deadline and self._leave(ticket):
                raise AdmissionRefused(
                    f"tenant {tenant!r} has {self.policy.tenant_runs_max} calls running (admission.tenant_runs_max) "
                    f"or the runtime is full ({self.policy.runs_max}, admission.runs_max), and this call waited "
                    f"{self.policy.max_wait_s:g} s (admission.max_wait_s) without its turn; nothing ran: try "
                    f"again in {self.policy.retry_after_s:g} s",
                    retry_after_s=self.policy.retry_after_s,
                    waited_s=self._clock() - started,  # measured as an admitted call's wait is
                )
            if control is not None:
                control.report(self._clock() - started, None, self._place(ticket))
        return Admitted(tenant, waited_s=self._clock() - started)

    def _free(self, tenant: str) -> bool:
        return self._running_all < self.policy.runs_max and self._running.get(tenant, 0) < self.policy.tenant_runs_max

    def _grant(self, ticket: _Ticket) -> None:
        self._running[ticket.tenant] = self._running.get(ticket.tenant, 0) + 1
        self._running_all += 1
        self._granted_at[ticket.tenant] = self._grants
        self._grants += 1
        ticket.granted.set()

    def _serve(self) -> None:
        """Give free slots to waiting calls (the lock held): each to the head of the queue of the waiting tenant
        served longest ago (never: first) that has a slot of its own left — round-robin across tenants."""
        while self._queues and self._running_all < self.policy.runs_max:
            eligible = [t for t in self._queues if self._running.get(t, 0) < self.policy.tenant_runs_max]
            if not eligible:
                return  # every waiting tenant is at its own limit
            tenant = min(eligible, key=lambda t: self._granted_at.get(t, -1))  # ties: the first to wait
            queue = self._queues[tenant]
            ticket = queue.popleft()
            if not queue:
                del self._queues[tenant]
            self._grant(ticket)

    def _leave(self, ticket: _Ticket) -> bool:
        """Take a ticket out of its queue; False when it was granted meanwhile (then it runs after all)."""
        with self._lock:
            if ticket.granted.is_set():
                return False
            queue = self._queues[ticket.tenant]
            queue.remove(ticket)
            if not queue:
                del self._queues[ticket.tenant]
                if ticket.tenant not in self._running:
                    self._granted_at.pop(ticket.tenant, None)
            return True

    def _place(self, ticket: _Ticket) -> str:
        with self._lock:
            queue = self._queues.get(ticket.tenant, deque())
            place = next((i for i, t in enumerate(queue) if t is ticket), 0) + 1
            others = sum(len(q) for tenant, q in self._queues.items() if tenant != ticket.tenant)
            running = self._running.get(ticket.tenant, 0)
        return (
            f"waiting for a run slot: place {place} in line for tenant {ticket.tenant!r} ({running} of "
            f"{self.policy.tenant_runs_max} running); {others} calls of other tenants waiting"
        )

    # ------------------------------------------------------------------------------------------ disk
    def _check_disk(self, tenant: str) -> None:
        """Refuse a tenant its last measure says is over its disk share (one not measured yet goes on: the next
        look measures it)."""
        if self._disk_used is None:
            return
        with self._lock:
            self._disk_seen.add(tenant)
            known = self._disk.get(tenant)
        limit = self.policy.tenant_disk_max_bytes
        if known is not None and known[1] >= limit:
            raise AdmissionRefused(
                f"tenant {tenant!r} holds {known[1]:,} bytes in its results folders, at or over its "
                f"{limit:,} (admission.tenant_disk_max_bytes); nothing ran: delete conversations it no longer needs, "
                "or wait for retention to remove old files",
                retry_after_s=DISK_LOOK_S,
            )

    def measure_disk(self) -> None:
        """Measure the disk share of every tenant that made a call since the last look, and of every tenant over
        its share (so that one that freed space is let in again): a background job, every ``DISK_LOOK_S``."""
        if self._disk_used is None:
            return
        limit = self.policy.tenant_disk_max_bytes
        with self._lock:
            tenants, self._disk_seen = self._disk_seen, set()
            tenants |= {tenant for tenant, (_, used) in self._disk.items() if used >= limit}
        for tenant in sorted(tenants):
            try:
                used = self._disk_used(tenant)
            except (OSError, SandboxRuntimeError) as exc:  # the next look tries again; the last measure stays
                logger.warning("could not measure the disk use of tenant %r: %s", tenant, exc)
                continue
            with self._lock:
                self._disk[tenant] = (self._clock(), used)
