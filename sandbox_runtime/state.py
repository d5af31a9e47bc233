"""The runtime's embedded SQLite state: conversations, sandboxes, run numbering, the decision made for every
tool result (persisted replacements), the files retention removed, and which live process uses what.

Leases: every open runtime registers one (its pid, the process's start time from ``/proc`` so that a reused pid
is not mistaken for it, the host name, the policy digest). While it uses a conversation it *holds* it (and, once
it started or re-attached one, the conversation's sandbox container). Another process never removes a sandbox
that a live process holds, nor unmounts a volume it holds; a lease whose process is gone counts as gone and is
deleted (with its holds) the next time anyone asks. New tables only (``CREATE TABLE IF NOT EXISTS``): an older
database gains them when it is opened, and older versions of the runtime ignore them.

Every write is one transaction; WAL mode keeps readers from blocking the writer. Connections are per thread.
Model-facing texts are stored as UTF-8 blobs (surrogates passed through), so a replayed text is the same string.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict

__all__ = [
    "Attachment",
    "CallRecord",
    "ConversationRecord",
    "ExpiredFile",
    "HoldRecord",
    "LeaseRecord",
    "SandboxRecord",
    "StateDB",
    "StoredResult",
    "lease_is_alive",
    "process_start",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    quota_mode TEXT NOT NULL,
    quota_bytes INTEGER NOT NULL,
    runs INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS sandboxes (
    container_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL REFERENCES conversations(id),
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL,
    removed_at REAL,
    removed_reason TEXT
);
CREATE INDEX IF NOT EXISTS sandboxes_live ON sandboxes(conversation_id) WHERE removed_at IS NULL;
CREATE TABLE IF NOT EXISTS tool_results (
    conversation_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    turn_id TEXT,
    decided_at REAL NOT NULL,
    is_error INTEGER NOT NULL,
    replaced INTEGER NOT NULL,
    text BLOB NOT NULL,
    descriptor TEXT,
    error_path TEXT,
    PRIMARY KEY (conversation_id, call_id)
);
CREATE TABLE IF NOT EXISTS calls (
    conversation_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    turn_id TEXT,
    tool TEXT NOT NULL,
    target TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    status TEXT NOT NULL,
    arguments BLOB,
    expanded BLOB,
    arguments_sha256 TEXT,
    arguments_cut INTEGER NOT NULL DEFAULT 0,
    descriptor TEXT,
    error_path TEXT,
    PRIMARY KEY (conversation_id, call_id)
);
CREATE TABLE IF NOT EXISTS attachments (
    conversation_id TEXT NOT NULL,
    attachment_id TEXT PRIMARY KEY,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    mime_type TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    source TEXT NOT NULL,
    host_path TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS expired_files (
    conversation_id TEXT NOT NULL,
    path TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    modified_at REAL NOT NULL,
    removed_at REAL NOT NULL,
    PRIMARY KEY (conversation_id, path)
);
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    process_start TEXT,
    host TEXT NOT NULL,
    started_at REAL NOT NULL,
    policy_digest TEXT NOT NULL
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
"""

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_GONE_STATES = frozenset("ZXx")  # a zombie (killed, not yet waited for) or a dead task is no longer running


def _boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return "-"


def process_start(pid: int) -> str | None:
    """``<boot id>:<start time in clock ticks>`` of a running process, from ``/proc/<pid>/stat``; None when the
    process does not exist, is a zombie, or ``/proc`` cannot be read. Two processes that ever had the same pid on
    one host never have the same value."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name (in parentheses) may hold spaces
    if len(fields) < 20 or fields[0] in _GONE_STATES:
        return None
    return f"{_boot_id()}:{fields[19]}"


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ConversationRecord(BaseModel):
    """One conversation as stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    created_at: float
    quota_mode: str
    quota_bytes: int
    runs: int


class SandboxRecord(BaseModel):
    """One sandbox container as stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    container_id: str
    conversation_id: str
    created_at: float
    last_used_at: float
    removed_at: float | None = None
    removed_reason: str | None = None


class LeaseRecord(BaseModel):
    """One open runtime process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    pid: int
    process_start: str | None  # see process_start(); None where /proc is not readable
    host: str
    started_at: float
    policy_digest: str


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


def lease_is_alive(lease: LeaseRecord, host: str | None = None) -> bool:
    """Whether the lease's process still runs. A lease of another host counts as alive (it cannot be checked
    from here); on this host the pid must exist with the same start time (a reused pid is another process)."""
    if lease.host != (host or socket.gethostname()):
        return True
    if lease.process_start is None:
        return _pid_exists(lease.pid)
    return process_start(lease.pid) == lease.process_start


class StoredResult(BaseModel):
    """The decision made for one tool result: the exact text the model was given, kept for replay."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    call_id: str
    tool: str
    turn_id: str | None
    decided_at: float
    is_error: bool
    replaced: bool
    text: str
    descriptor: str | None  # the ResultDescriptor as JSON
    error_path: str | None


class CallRecord(BaseModel):
    """The execution record of one call: what the model wrote, what was really run, and how it ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    call_id: str
    turn_id: str | None
    tool: str  # as the model called it (e.g. delegate_call)
    target: str  # what ran (the delegated tool)
    started_at: float
    finished_at: float
    status: str  # ok | error | denied
    arguments: str | None  # the short call, as JSON (cut to the policy's record cap)
    expanded: str | None  # the expanded arguments, when they differ from the short call
    arguments_sha256: str | None  # of the expanded arguments, whole
    arguments_cut: bool
    descriptor: str | None
    error_path: str | None


class Attachment(BaseModel):
    """A file handed to the user as a download: the card a host renders."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attachment_id: str
    filename: str
    bytes: int
    mime_type: str
    sha256: str
    source: str  # the sandbox path it was copied from
    host_path: str  # where the copy is on the host (outputs/)


class ExpiredFile(BaseModel):
    """A file retention removed: answers "where did it go" with when, instead of a bare "not found"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    path: str
    bytes: int
    modified_at: float
    removed_at: float


def _text_blob(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _stored(row: sqlite3.Row) -> StoredResult:
    fields = dict(row)
    fields["text"] = bytes(fields["text"]).decode("utf-8", "surrogatepass")
    return StoredResult(**fields)


class StateDB:
    """A small typed wrapper around ``STATE_DIR/state.sqlite3``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        with self._connect() as db:
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA foreign_keys=ON")
            self._local.db = db
        return db

    def close(self) -> None:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # conversations ---------------------------------------------------------------------------------------
    def ensure_conversation(self, conversation_id: str, quota_mode: str, quota_bytes: int) -> ConversationRecord:
        db = self._connect()
        db.execute(
            "INSERT OR IGNORE INTO conversations(id, created_at, quota_mode, quota_bytes) VALUES (?, ?, ?, ?)",
            (conversation_id, time.time(), quota_mode, quota_bytes),
        )
        record = self.conversation(conversation_id)
        assert record is not None  # noqa: S101  (inserted just above)
        return record

    def conversation(self, conversation_id: str) -> ConversationRecord | None:
        row = self._connect().execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return None if row is None else ConversationRecord(**dict(row))

    def conversations(self) -> list[ConversationRecord]:
        rows = self._connect().execute("SELECT * FROM conversations ORDER BY created_at").fetchall()
        return [ConversationRecord(**dict(row)) for row in rows]

    def forget_conversation(self, conversation_id: str) -> None:
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            for table in ("sandboxes", "tool_results", "calls", "attachments", "expired_files", "holds"):
                db.execute(f"DELETE FROM {table} WHERE conversation_id = ?", (conversation_id,))  # noqa: S608
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def next_run_number(self, conversation_id: str) -> int:
        row = (
            self._connect()
            .execute("UPDATE conversations SET runs = runs + 1 WHERE id = ? RETURNING runs", (conversation_id,))
            .fetchone()
        )
        if row is None:
            raise KeyError(conversation_id)
        return int(row[0])

    # sandboxes -------------------------------------------------------------------------------------------
    def record_sandbox(self, container_id: str, conversation_id: str, created_at: float) -> None:
        self._connect().execute(
            "INSERT OR IGNORE INTO sandboxes(container_id, conversation_id, created_at, last_used_at) "
            "VALUES (?, ?, ?, ?)",
            (container_id, conversation_id, created_at, time.time()),
        )

    def touch_sandbox(self, container_id: str, when: float) -> None:
        self._connect().execute("UPDATE sandboxes SET last_used_at = ? WHERE container_id = ?", (when, container_id))

    def sandbox(self, container_id: str) -> SandboxRecord | None:
        row = self._connect().execute("SELECT * FROM sandboxes WHERE container_id = ?", (container_id,)).fetchone()
        return None if row is None else SandboxRecord(**dict(row))

    def live_sandboxes(self) -> list[SandboxRecord]:
        rows = (
            self._connect().execute("SELECT * FROM sandboxes WHERE removed_at IS NULL ORDER BY created_at").fetchall()
        )
        return [SandboxRecord(**dict(row)) for row in rows]

    def mark_removed(self, container_id: str, reason: str) -> None:
        """Record the container as removed (before it is: nobody re-attaches it meanwhile) and clear it from every
        hold, in one transaction."""
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "UPDATE sandboxes SET removed_at = ?, removed_reason = ? WHERE container_id = ? AND removed_at IS NULL",
                (time.time(), reason, container_id),
            )
            db.execute("UPDATE holds SET container_id = NULL WHERE container_id = ?", (container_id,))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # leases and holds -------------------------------------------------------------------------------------
    def open_lease(self, policy_digest: str, *, pid: int | None = None) -> LeaseRecord:
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
        self._connect().execute(
            "INSERT INTO leases(id, pid, process_start, host, started_at, policy_digest) VALUES (?, ?, ?, ?, ?, ?)",
            (lease.id, lease.pid, lease.process_start, lease.host, lease.started_at, lease.policy_digest),
        )
        return lease

    def close_lease(self, lease_id: str) -> None:
        """Drop a lease and its holds (its sandboxes and mounts stay as they are)."""
        self._drop_leases([lease_id])

    def _drop_leases(self, lease_ids: list[str]) -> None:
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            for lease_id in lease_ids:
                db.execute("DELETE FROM holds WHERE lease_id = ?", (lease_id,))
                db.execute("DELETE FROM leases WHERE id = ?", (lease_id,))
            db.execute("DELETE FROM holds WHERE lease_id NOT IN (SELECT id FROM leases)")  # strays of closed ones
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def leases(self) -> list[LeaseRecord]:
        rows = self._connect().execute("SELECT * FROM leases ORDER BY started_at").fetchall()
        return [LeaseRecord(**dict(row)) for row in rows]

    def live_leases(self) -> list[LeaseRecord]:
        """The leases whose process still runs; those of processes that are gone are deleted with their holds."""
        host = socket.gethostname()
        leases = self.leases()
        dead = [lease for lease in leases if not lease_is_alive(lease, host)]
        if dead:
            self._drop_leases([lease.id for lease in dead])
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
        self._connect().execute(
            "INSERT INTO holds(lease_id, conversation_id, container_id, policy_digest, held_at, used_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(lease_id, conversation_id) DO UPDATE SET "
            "container_id = COALESCE(excluded.container_id, holds.container_id), "
            "used_at = CASE WHEN ? THEN excluded.used_at ELSE holds.used_at END "
            "WHERE excluded.container_id IS NOT NULL AND excluded.container_id IS NOT holds.container_id "
            "OR ? AND abs(excluded.used_at - holds.used_at) >= 1.0",  # within a second: nothing to write
            (lease_id, conversation_id, container_id, policy_digest, when, when if use else 0.0, int(use), int(use)),
        )

    def touch_hold(self, lease_id: str, conversation_id: str, when: float) -> None:
        self._connect().execute(
            "UPDATE holds SET used_at = ? WHERE lease_id = ? AND conversation_id = ?", (when, lease_id, conversation_id)
        )

    def drop_hold(self, lease_id: str, conversation_id: str) -> None:
        self._connect().execute(
            "DELETE FROM holds WHERE lease_id = ? AND conversation_id = ?", (lease_id, conversation_id)
        )

    def unhold_container(self, lease_id: str, conversation_id: str) -> None:
        """The lease keeps using the conversation's folders but no longer claims its sandbox."""
        self._connect().execute(
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
        rows = self._connect().execute(query + " ORDER BY holds.held_at", values).fetchall()
        return [HoldRecord(**dict(row)) for row in rows]

    def live_holds(self, conversation_id: str) -> list[HoldRecord]:
        """The conversation's holds by processes that still run (dead ones are cleaned up first)."""
        if not self.holds(conversation_id=conversation_id):
            return []
        live = {lease.id for lease in self.live_leases()}
        return [h for h in self.holds(conversation_id=conversation_id) if h.lease_id in live]

    # tool results -----------------------------------------------------------------------------------------
    def store_results(
        self, results: list[StoredResult], calls: list[CallRecord] | None = None
    ) -> dict[str, StoredResult]:
        """Record decisions (and their calls' execution records) in one transaction; a call id decided before
        keeps its first decision. Returns what is stored for each call id afterwards."""
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            for c in calls or []:
                db.execute(
                    "INSERT OR IGNORE INTO calls(conversation_id, call_id, turn_id, tool, target, started_at, "
                    "finished_at, status, arguments, expanded, arguments_sha256, arguments_cut, descriptor, "
                    "error_path) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        c.conversation_id,
                        c.call_id,
                        c.turn_id,
                        c.tool,
                        c.target,
                        c.started_at,
                        c.finished_at,
                        c.status,
                        None if c.arguments is None else _text_blob(c.arguments),
                        None if c.expanded is None else _text_blob(c.expanded),
                        c.arguments_sha256,
                        int(c.arguments_cut),
                        c.descriptor,
                        c.error_path,
                    ),
                )
            for r in results:
                db.execute(
                    "INSERT OR IGNORE INTO tool_results(conversation_id, call_id, tool, turn_id, decided_at, is_error, "
                    "replaced, text, descriptor, error_path) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        r.conversation_id,
                        r.call_id,
                        r.tool,
                        r.turn_id,
                        r.decided_at,
                        int(r.is_error),
                        int(r.replaced),
                        _text_blob(r.text),
                        r.descriptor,
                        r.error_path,
                    ),
                )
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        by_conversation: dict[str, list[str]] = {}
        for r in results:
            by_conversation.setdefault(r.conversation_id, []).append(r.call_id)
        stored: dict[str, StoredResult] = {}
        for conversation_id, call_ids in by_conversation.items():
            stored.update(self.stored_results(conversation_id, call_ids))
        return stored

    def stored_results(self, conversation_id: str, call_ids: list[str] | None = None) -> dict[str, StoredResult]:
        """Stored decisions of a conversation (all, or those of ``call_ids``), by call id, oldest first."""
        db = self._connect()
        if call_ids is None:
            rows = db.execute(
                "SELECT * FROM tool_results WHERE conversation_id = ? ORDER BY decided_at, rowid", (conversation_id,)
            ).fetchall()
        else:
            rows = []
            for start in range(0, len(call_ids), 500):
                chunk = call_ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows += db.execute(
                    f"SELECT * FROM tool_results WHERE conversation_id = ? AND call_id IN ({marks}) "  # noqa: S608
                    "ORDER BY decided_at, rowid",
                    (conversation_id, *chunk),
                ).fetchall()
        return {row["call_id"]: _stored(row) for row in rows}

    def calls(self, conversation_id: str) -> list[CallRecord]:
        """The execution record of a conversation, oldest first."""
        rows = (
            self._connect()
            .execute("SELECT * FROM calls WHERE conversation_id = ? ORDER BY started_at, rowid", (conversation_id,))
            .fetchall()
        )
        records = []
        for row in rows:
            fields = dict(row)
            for key in ("arguments", "expanded"):
                if fields[key] is not None:
                    fields[key] = bytes(fields[key]).decode("utf-8", "surrogatepass")
            records.append(CallRecord(**fields))
        return records

    # attachments ------------------------------------------------------------------------------------------
    def record_attachment(self, conversation_id: str, a: Attachment) -> None:
        self._connect().execute(
            "INSERT INTO attachments(conversation_id, attachment_id, filename, bytes, mime_type, sha256, source, "
            "host_path, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                conversation_id,
                a.attachment_id,
                a.filename,
                a.bytes,
                a.mime_type,
                a.sha256,
                a.source,
                a.host_path,
                time.time(),
            ),
        )

    def attachments(self, conversation_id: str) -> list[Attachment]:
        rows = (
            self._connect()
            .execute("SELECT * FROM attachments WHERE conversation_id = ? ORDER BY created_at", (conversation_id,))
            .fetchall()
        )
        return [Attachment(**{k: row[k] for k in Attachment.model_fields}) for row in rows]

    # retention --------------------------------------------------------------------------------------------
    def record_expired(self, files: list[ExpiredFile]) -> None:
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(
                "INSERT OR REPLACE INTO expired_files(conversation_id, path, bytes, modified_at, removed_at) "
                "VALUES (?, ?, ?, ?, ?)",
                [(f.conversation_id, f.path, f.bytes, f.modified_at, f.removed_at) for f in files],
            )
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def expired_file(self, conversation_id: str, path: str) -> ExpiredFile | None:
        row = (
            self._connect()
            .execute("SELECT * FROM expired_files WHERE conversation_id = ? AND path = ?", (conversation_id, path))
            .fetchone()
        )
        return None if row is None else ExpiredFile(**dict(row))
