"""Which live process uses what: the ``leases``, ``holds`` and ``sandbox_starts`` tables of the state database.

Every open runtime registers a lease (its pid, the process's start time from ``/proc`` so that a reused pid is
not mistaken for it, the host name, the policy digest). While it uses a conversation it *holds* it (and, once it
started or re-attached one, the conversation's sandbox container). Another process never removes a sandbox that
a live process holds, nor unmounts a volume it holds; a lease whose process is gone counts as gone and is deleted
(with its holds and starts) the next time anyone asks. While it starts a conversation's sandbox, a *start* names
the conversation: it counts against the tenant's live sandboxes from the moment its place was granted until the
sandbox's own record does, so the tenant's lock is held only while the place is taken, not while the engine
starts the sandbox. New tables only (``CREATE TABLE IF NOT EXISTS``): an older database gains them when it is
opened, and older versions of the runtime ignore them.
"""

from __future__ import annotations

import os
import socket
import time
import uuid

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.processes import pid_exists, process_start
from sandbox_runtime.state.engine import StateEngine

__all__ = ["LEASE_TABLES", "LEASE_TTL_S", "HoldRecord", "LeaseRecord", "Leases", "lease_is_alive"]

LEASE_TTL_S = 30.0  # the policy's default state.lease_ttl_s

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    process_start TEXT,
    host TEXT NOT NULL,
    started_at REAL NOT NULL,
    policy_digest TEXT NOT NULL,
    renewed_at REAL
);
CREATE TABLE IF NOT EXISTS holds (
    lease_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    container_id TEXT,
    policy_digest TEXT NOT NULL,
    held_at REAL NOT NULL,
    used_at REAL NOT NULL,
    PRIMARY KEY (lease_id, conversation_id)
);
CREATE INDEX IF NOT EXISTS holds_by_conversation ON holds(conversation_id);
CREATE TABLE IF NOT EXISTS sandbox_starts (
    conversation_id TEXT PRIMARY KEY,
    lease_id TEXT NOT NULL,
    started_at REAL NOT NULL
);
"""
LEASE_TABLES = tuple(statement.strip() for statement in _SCHEMA.split(";") if statement.strip())


class LeaseRecord(BaseModel):
    """One open runtime process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    pid: int
    process_start: str | None  # see processes.process_start(); None where /proc is not readable
    host: str
    started_at: float
    policy_digest: str
    renewed_at: float | None = None  # its last renewal (its clock); None: never renewed since it started


class HoldRecord(BaseModel):
    """A conversation a runtime process uses: its folders (mounted), and the sandbox it started or re-attached."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lease_id: str
    conversation_id: str
    container_id: str | None
    policy_digest: str  # the policy the holder runs under (its sandbox was made under it)
    held_at: float
    used_at: float  # the holder's last use of the conversation (its clock); 0 for a short look
    pid: int
    host: str


def lease_is_alive(lease: LeaseRecord, ttl_s: float, host: str | None = None, now: float | None = None) -> bool:
    """Whether the lease's process still runs. On this host the pid must exist with the same start time (a reused
    pid is another process); a lease of another host, which cannot be checked from here, counts as alive while
    it was renewed within ``ttl_s`` seconds."""
    if lease.host != (host or socket.gethostname()):
        renewed = lease.started_at if lease.renewed_at is None else lease.renewed_at
        return (time.time() if now is None else now) - renewed <= ttl_s
    if lease.process_start is None:
        return pid_exists(lease.pid)
    return process_start(lease.pid) == lease.process_start


class Leases:
    """The leases and holds of one state database (its tables are made with the schema: ``LEASE_TABLES``). A
    lease of another host counts as gone once it was not renewed for ``ttl_s`` seconds (:meth:`renew`)."""

    def __init__(self, engine: StateEngine, ttl_s: float) -> None:
        self._engine = engine
        self.ttl_s = ttl_s

    def open(self, policy_digest: str, *, pid: int | None = None) -> LeaseRecord:
        """Register a runtime process (this one unless ``pid`` is given)."""
        pid = os.getpid() if pid is None else pid
        lease = LeaseRecord(
            id=uuid.uuid4().hex,
            pid=pid,
            process_start=process_start(pid),
            host=socket.gethostname(),
            started_at=time.time(),
            policy_digest=policy_digest,
        )
        self._register(lease)
        return lease

    def _register(self, lease: LeaseRecord) -> None:
        with self._engine.statements() as db:
            db.run(
                "INSERT INTO leases(id, pid, process_start, host, started_at, policy_digest, renewed_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO NOTHING",
                (
                    lease.id,
                    lease.pid,
                    lease.process_start,
                    lease.host,
                    lease.started_at,
                    lease.policy_digest,
                    time.time(),
                ),
            )

    def renew(self, lease: LeaseRecord) -> bool:
        """Renew the lease (its process is alive); False when it had been deleted (counted as gone while it did
        not renew: a long pause, a state store that was away), and it is registered again (its holds are taken
        again as it uses its conversations)."""
        with self._engine.statements() as db:
            renewed = db.run("UPDATE leases SET renewed_at = ? WHERE id = ?", (time.time(), lease.id))
        if not renewed:
            self._register(lease)
        return bool(renewed)

    def close(self, lease_id: str) -> None:
        """Drop a lease, its holds and its claims (its sandboxes and mounts stay as they are)."""
        self._drop([lease_id])

    def _drop(self, lease_ids: list[str]) -> None:
        with self._engine.transaction() as db:
            for lease_id in lease_ids:
                db.run("DELETE FROM holds WHERE lease_id = ?", (lease_id,))
                db.run("DELETE FROM sandbox_starts WHERE lease_id = ?", (lease_id,))
                db.run("DELETE FROM call_claims WHERE lease_id = ?", (lease_id,))  # its calls may be run again
                db.run("DELETE FROM leases WHERE id = ?", (lease_id,))
            db.run("DELETE FROM holds WHERE lease_id NOT IN (SELECT id FROM leases)")  # strays of closed ones

    def registered(self) -> list[LeaseRecord]:
        """Every registered lease, dead or alive: see :meth:`live`."""
        with self._engine.statements() as db:
            rows = db.rows("SELECT * FROM leases ORDER BY started_at")
        return [LeaseRecord(**row) for row in rows]

    def live(self) -> list[LeaseRecord]:
        """The leases whose process still runs; those of processes that are gone are deleted with their holds."""
        host, now = socket.gethostname(), time.time()
        leases = self.registered()
        dead = [lease for lease in leases if not lease_is_alive(lease, self.ttl_s, host, now)]
        if dead:
            self._drop([lease.id for lease in dead])
        return [lease for lease in leases if lease not in dead]

    def hold(
        self,
        lease_id: str,
        conversation_id: str,
        policy_digest: str,
        when: float,
        *,
        container_id: str | None = None,
        use: bool = True,
    ) -> None:
        """Record that the lease uses the conversation (``use``: now, else a short look that keeps the time of
        its last real use) and, given one, the container it started or re-attached."""
        with self._engine.statements() as db:
            db.run(
                "INSERT INTO holds(lease_id, conversation_id, container_id, policy_digest, held_at, used_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(lease_id, conversation_id) DO UPDATE SET "
                "container_id = COALESCE(excluded.container_id, holds.container_id), "
                "used_at = CASE WHEN ? = 1 THEN excluded.used_at ELSE holds.used_at END "
                "WHERE (excluded.container_id IS NOT NULL "
                "AND excluded.container_id <> COALESCE(holds.container_id, '')) "
                "OR (? = 1 AND abs(excluded.used_at - holds.used_at) >= 1.0)",  # within a second: nothing to write
                (
                    lease_id,
                    conversation_id,
                    container_id,
                    policy_digest,
                    when,
                    when if use else 0.0,
                    int(use),
                    int(use),
                ),
            )

    def begin_start(self, lease_id: str, conversation_id: str, when: float) -> None:
        """Record that the lease is starting the conversation's sandbox (a place of its tenant's is taken)."""
        with self._engine.statements() as db:
            db.run(
                "INSERT INTO sandbox_starts(conversation_id, lease_id, started_at) VALUES (?, ?, ?) "
                "ON CONFLICT(conversation_id) DO UPDATE SET lease_id = excluded.lease_id, "
                "started_at = excluded.started_at",
                (conversation_id, lease_id, when),
            )

    def end_start(self, lease_id: str, conversation_id: str) -> None:
        """The start ended (its sandbox recorded, or none made)."""
        with self._engine.statements() as db:
            db.run("DELETE FROM sandbox_starts WHERE conversation_id = ? AND lease_id = ?", (conversation_id, lease_id))

    def touch_hold(self, lease_id: str, conversation_id: str, when: float) -> None:
        with self._engine.statements() as db:
            db.run(
                "UPDATE holds SET used_at = ? WHERE lease_id = ? AND conversation_id = ?",
                (when, lease_id, conversation_id),
            )

    def drop_hold(self, lease_id: str, conversation_id: str) -> None:
        with self._engine.statements() as db:
            db.run("DELETE FROM holds WHERE lease_id = ? AND conversation_id = ?", (lease_id, conversation_id))

    def unhold_container(self, lease_id: str, conversation_id: str) -> None:
        """The lease keeps using the conversation's folders but no longer claims its sandbox."""
        with self._engine.statements() as db:
            db.run(
                "UPDATE holds SET container_id = NULL WHERE lease_id = ? AND conversation_id = ?",
                (lease_id, conversation_id),
            )

    def holds(self, *, conversation_id: str | None = None, lease_id: str | None = None) -> list[HoldRecord]:
        """Holds of registered leases (of one conversation, or of one lease), dead or alive: see
        :meth:`live_holds`."""
        query = (
            "SELECT holds.*, leases.pid AS pid, leases.host AS host "
            "FROM holds JOIN leases ON leases.id = holds.lease_id"
        )
        conditions, values = [], []
        if conversation_id is not None:
            conditions.append("holds.conversation_id = ?")
            values.append(conversation_id)
        if lease_id is not None:
            conditions.append("holds.lease_id = ?")
            values.append(lease_id)
        if conditions:
            query += " WHERE " + " AND ".join(conditions)
        with self._engine.statements() as db:
            rows = db.rows(query + " ORDER BY holds.held_at", values)
        return [HoldRecord(**row) for row in rows]

    def live_holds(self, conversation_id: str) -> list[HoldRecord]:
        """The conversation's holds by processes that still run (dead ones are cleaned up first)."""
        if not self.holds(conversation_id=conversation_id):
            return []
        live = {lease.id for lease in self.live()}
        return [h for h in self.holds(conversation_id=conversation_id) if h.lease_id in live]
