"""The audit trail: one append-only, hash-chained log per state store (the ``audit_log`` table).

Every entry has a number (1, 2, 3, ... with no gap), when it was written, what happened (:data:`AuditKind`), the
tenant, the conversation key and call id it concerns, and its details as canonical JSON (digests, statuses and
names: never an argument's or a result's value, never a token). It carries the hash of the entry before it and
its own hash, a SHA-256 over both and every field, so an entry edited, removed, inserted or moved breaks the
chain where it happened; ``audit_head`` keeps the number and hash of the last entry, so a removed tail shows too.
:meth:`AuditLog.verify` walks the chain and names the first entry that breaks it. A chain anyone can recompute
(it has no secret) shows tampering that did not rewrite every later entry and the head; to rule that out too,
keep the head hash elsewhere (``audit verify`` prints it) and pass it to a later ``verify(head=...)``.

An entry is written in the transaction of the operation it records (a call's decision, an attachment's record,
a sandbox's), so both reach the disk with one flush, or neither; one that records nothing else stored (a call
admission refused, an attachment read, a refused token) in a transaction of its own. Appends are serialised by
the one-row head (an ``UPDATE ... RETURNING`` locks it until the transaction ends), across threads, processes and
replicas alike.
Writing an entry never fails the operation it records: it is written behind a savepoint, and an entry the store
refuses (a full disk, the server away) is lost alone — logged as an error, and the next entry written is preceded
by an ``audit_gap`` entry counting those lost (also kept in :attr:`AuditLog.missed`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.errors import SandboxRuntimeError
from sandbox_runtime.models import CallRecord
from sandbox_runtime.state.engine import Row, StateEngine, Statements
from sandbox_runtime.state.tenants import TenantNames

__all__ = ["GENESIS_HASH", "AuditCheck", "AuditEntry", "AuditKind", "AuditLog", "call_detail", "unsettled_detail"]

logger = logging.getLogger(__name__)

AuditKind = Literal[
    "call",
    "approval",
    "denial",
    "attachment_made",
    "attachment_downloaded",
    "sandbox_started",
    "sandbox_removed",
    "auth_failed",
    "audit_gap",
]
GENESIS_HASH = "0" * 64  # the "previous hash" of entry 1
_PAGE_ROWS = 1000


class AuditEntry(BaseModel):
    """One entry of the audit trail, as stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int
    at: float
    kind: str
    tenant: str | None
    conversation_id: str | None
    call_id: str | None
    detail: str  # canonical JSON
    prev_hash: str
    hash: str

    def expected_hash(self) -> str:
        """The hash this entry's fields give, after ``prev_hash``."""
        return entry_hash(self.prev_hash, self.seq, self.at, self.kind, self.tenant, self.conversation_id,
                          self.call_id, self.detail)  # fmt: skip

    def shown(self) -> dict[str, Any]:
        """The entry as one JSON object (its details parsed), for export."""
        return {**self.model_dump(exclude={"detail"}), "detail": json.loads(self.detail)}


class AuditCheck(BaseModel):
    """What :meth:`AuditLog.verify` found: how many entries it walked, the head hash, and the first problem."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entries: int
    head_hash: str
    first_bad: int | None = None  # the number of the first entry that breaks the chain
    problem: str | None = None
    lost_entries: int = 0  # entries the store refused to take, as the audit_gap entries walked count them

    @property
    def ok(self) -> bool:
        return self.problem is None


def call_detail(record: CallRecord, text: str) -> dict[str, Any]:
    """A ``call`` entry's details: the tool and what ran, the status and why it failed, digests of the expanded
    arguments, of the text the model was given and of the file a result was saved to, the turn, the call whose
    script made it, and its timings. Never an argument's or a result's value."""
    return {
        "tool": record.tool,
        "target": record.target,
        "status": record.status,
        "failure": record.failure,
        "arguments_sha256": record.arguments_sha256,
        "result_sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
        "result_file_sha256": None if record.descriptor is None else record.descriptor.sha256,
        "turn_id": record.turn_id,
        "made_by": record.made_by,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
    }


def unsettled_detail(record: CallRecord, status: str, reason: str, **facts: Any) -> dict[str, Any]:
    """A ``call`` entry's details for a call that ended without a decision (it raised: nothing is kept for its call
    id, which runs anew when tried again, and no result was given): those of :func:`call_detail`, with ``status``
    as the metrics count it (``refused``: admission refused it), no result digest, and why (``reason``, the
    message the caller got) with ``facts`` (how long it waited, when to try again)."""
    detail = call_detail(record, "")
    return detail | {"status": status, "failure": None, "result_sha256": None, "reason": reason, **facts}


def canonical(detail: dict[str, Any]) -> str:
    """Details as the one JSON text they are stored and hashed as."""
    return json.dumps(detail, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def entry_hash(
    prev_hash: str,
    seq: int,
    at: float,
    kind: str,
    tenant: str | None,
    conversation_id: str | None,
    call_id: str | None,
    detail: str,
) -> str:
    fields = [prev_hash, seq, repr(float(at)), kind, tenant, conversation_id, call_id, detail]
    return hashlib.sha256(json.dumps(fields, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()


_COLUMNS = ", ".join(AuditEntry.model_fields)
_INSERT = f"INSERT INTO audit_log({_COLUMNS}) VALUES ({', '.join('?' * len(AuditEntry.model_fields))})"  # noqa: S608  (our own columns)
# PostgreSQL: the entry and the head's hash in one statement
_INSERT_AND_HEAD = f"WITH entry AS ({_INSERT} RETURNING hash) UPDATE audit_head SET hash = entry.hash FROM entry"  # noqa: S608  (our own columns)


def _entry(row: Row) -> AuditEntry:
    return AuditEntry(**{**row, "seq": int(row["seq"]), "at": float(row["at"])})


class AuditLog:
    """The audit trail of one state database."""

    def __init__(self, engine: StateEngine, tenants: TenantNames) -> None:
        self._engine = engine
        self._tenants = tenants
        self._guard = threading.Lock()
        self.missed = 0  # entries this process could not write (reported by doctor; a gap entry follows)
        self.lost_total = 0  # the same, never reset: what the metrics count

    def append(
        self,
        kind: AuditKind,
        *,
        conversation: str | None = None,
        call_id: str | None = None,
        tenant: str | None = None,
        **detail: Any,
    ) -> bool:
        """Write one entry in a transaction of its own (``tenant`` defaults to the conversation key's); False when
        the store refused it (then logged as an error, and counted)."""
        tenant = self.tenant_of(conversation) if tenant is None else tenant
        try:
            with self._engine.transaction() as tx:
                return self.append_in(tx, kind, conversation=conversation, call_id=call_id, tenant=tenant, **detail)
        except Exception as exc:  # the commit itself refused
            self._lost(kind, conversation, call_id, exc)
            return False

    def append_in(
        self,
        tx: Statements,
        kind: AuditKind,
        *,
        conversation: str | None = None,
        call_id: str | None = None,
        tenant: str | None,
        **detail: Any,
    ) -> bool:
        """Write one entry in the transaction ``tx`` of the operation it records, so both commit at once (one
        disk flush); behind a savepoint, so an entry the store refuses is lost alone (logged as an error, and
        counted) and the operation goes on. ``tenant``: read before the transaction (:meth:`tenant_of`)."""
        with self._guard:
            missed = self.missed
        tx.run("SAVEPOINT audit_entry")  # (never released: the commit ends it, one round trip fewer)
        try:
            if missed:
                self._write(tx, "audit_gap", None, None, None, canonical({"missed_entries": missed}))
            self._write(tx, kind, tenant, conversation, call_id, canonical(detail))
        except Exception as exc:  # whatever the store or its driver raised: the operation recorded goes on
            tx.run("ROLLBACK TO SAVEPOINT audit_entry")
            self._lost(kind, conversation, call_id, exc)
            return False
        if missed:  # (a commit refused after this counts the entry itself, not the gap: the gap may be shown twice)
            with self._guard:
                self.missed -= missed
        return True

    def tenant_of(self, conversation: str | None) -> str | None:
        """The tenant an entry of this conversation key names (None for none)."""
        return None if conversation is None else self._tenants.of_key(conversation)

    def _lost(self, kind: str, conversation: str | None, call_id: str | None, exc: BaseException) -> None:
        with self._guard:
            self.missed += 1
            self.lost_total += 1
        logger.error("AUDIT ENTRY LOST (%s, conversation %s, call %s): %s", kind, conversation, call_id, exc)

    def _write(
        self, tx: Statements, kind: str, tenant: str | None, conversation: str | None, call_id: str | None, detail: str
    ) -> None:
        head = tx.row("UPDATE audit_head SET seq = seq + 1 WHERE id = 1 RETURNING seq, hash")
        if head is None:
            raise SandboxRuntimeError("the audit head is missing: the audit trail cannot be continued")
        seq, prev_hash, at = int(head["seq"]), str(head["hash"]), time.time()
        digest = entry_hash(prev_hash, seq, at, kind, tenant, conversation, call_id, detail)
        values = (seq, at, kind, tenant, conversation, call_id, detail, prev_hash, digest)
        if self._engine.kind == "postgresql":  # the entry and the head's hash in one round trip
            tx.run(_INSERT_AND_HEAD, values)
            return
        tx.run(_INSERT, values)
        tx.run("UPDATE audit_head SET hash = ? WHERE id = 1", (digest,))

    def entries(self, *, since: float | None = None, tenant: str | None = None) -> Iterator[AuditEntry]:
        """Every entry in order (written at or after ``since``, of ``tenant``), read a page at a time."""
        after = 0
        while True:
            sql = f"SELECT {_COLUMNS} FROM audit_log WHERE seq > ?"  # noqa: S608  (our own columns)
            params: list[object] = [after]
            if since is not None:
                sql += " AND at >= ?"
                params.append(since)
            if tenant is not None:
                sql += " AND tenant = ?"
                params.append(tenant)
            with self._engine.statements() as db:
                rows = db.rows(f"{sql} ORDER BY seq LIMIT {_PAGE_ROWS}", params)
            for row in rows:
                yield _entry(row)
            if len(rows) < _PAGE_ROWS:
                return
            after = int(rows[-1]["seq"])

    def head(self) -> tuple[int, str]:
        """The number and hash of the last entry written (0 and :data:`GENESIS_HASH` for none)."""
        with self._engine.statements() as db:
            row = db.row("SELECT seq, hash FROM audit_head WHERE id = 1")
        return (0, GENESIS_HASH) if row is None else (int(row["seq"]), str(row["hash"]))

    def verify(self, *, head: str | None = None) -> AuditCheck:
        """Walk the whole chain; the first entry that breaks it, named. ``head``: a head hash noted earlier, which
        must still be in the chain (a rewritten chain has lost it)."""
        expected_seq, prev_hash, walked, head_seen = 1, GENESIS_HASH, 0, head is None or head == GENESIS_HASH
        lost = 0
        for entry in self.entries():
            problem = _break(entry, expected_seq, prev_hash)
            if problem is not None:
                return AuditCheck(
                    entries=walked, head_hash=prev_hash, first_bad=expected_seq, problem=problem, lost_entries=lost
                )
            walked, expected_seq, prev_hash = walked + 1, entry.seq + 1, entry.hash
            head_seen = head_seen or entry.hash == head
            if entry.kind == "audit_gap":
                lost += int(json.loads(entry.detail).get("missed_entries", 0))
        recorded_seq, recorded_hash = self.head()
        if (recorded_seq, recorded_hash) != (walked, prev_hash):
            problem = (
                f"the log ends at entry {walked} but its head records entry {recorded_seq}: "
                f"entries {walked + 1}-{recorded_seq} were removed"
                if recorded_seq > walked
                else f"the head (entry {recorded_seq}, hash {recorded_hash[:16]}…) does not match the last entry"
            )
            return AuditCheck(
                entries=walked, head_hash=prev_hash, first_bad=walked + 1, problem=problem, lost_entries=lost
            )
        if not head_seen:
            problem = f"the head hash {head} noted earlier is not in the chain: the log was rewritten"
            return AuditCheck(entries=walked, head_hash=prev_hash, first_bad=1, problem=problem, lost_entries=lost)
        return AuditCheck(entries=walked, head_hash=prev_hash, lost_entries=lost)


def _break(entry: AuditEntry, expected_seq: int, prev_hash: str) -> str | None:
    """Why an entry breaks the chain at the place ``expected_seq`` (None: it does not)."""
    if entry.seq != expected_seq:
        return f"entry {expected_seq} is missing (the log goes on at entry {entry.seq})"
    if entry.prev_hash != prev_hash:
        return f"entry {entry.seq} does not follow entry {entry.seq - 1}: it was moved or put in"
    if entry.expected_hash() != entry.hash:
        return f"entry {entry.seq} was changed after it was written (its fields do not give its hash)"
    return None
