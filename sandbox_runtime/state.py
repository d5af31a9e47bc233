"""The runtime's embedded SQLite state: conversations, sandboxes, run numbering, the decision made for every
tool result (persisted replacements), the files retention removed, and which live process uses what (its
:class:`~sandbox_runtime.leases.Leases`, as ``StateDB.leases``).

Every write is one transaction; WAL mode keeps readers from blocking the writer. Connections are per thread.
Model-facing texts are stored as UTF-8 blobs (surrogates passed through), so a replayed text is the same string.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from sandbox_runtime.leases import Leases
from sandbox_runtime.records import (
    Attachment,
    CallRecord,
    ConversationRecord,
    ExpiredFile,
    SandboxRecord,
    StoredResult,
)

__all__ = ["StateDB"]

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
"""


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
        self.leases = Leases(self._connect, self._transaction)

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

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on this thread's connection: committed when the block ends, else rolled back."""
        db = self._connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

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
        with self._transaction() as db:
            for table in ("sandboxes", "tool_results", "calls", "attachments", "expired_files", "holds"):
                db.execute(f"DELETE FROM {table} WHERE conversation_id = ?", (conversation_id,))  # noqa: S608
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

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
        with self._transaction() as db:
            db.execute(
                "UPDATE sandboxes SET removed_at = ?, removed_reason = ? WHERE container_id = ? AND removed_at IS NULL",
                (time.time(), reason, container_id),
            )
            db.execute("UPDATE holds SET container_id = NULL WHERE container_id = ?", (container_id,))

    # tool results -----------------------------------------------------------------------------------------
    def store_results(
        self, results: list[StoredResult], calls: list[CallRecord] | None = None
    ) -> dict[str, StoredResult]:
        """Record decisions (and their calls' execution records) in one transaction; a call id decided before
        keeps its first decision. Returns what is stored for each call id afterwards."""
        with self._transaction() as db:
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
        with self._transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO expired_files(conversation_id, path, bytes, modified_at, removed_at) "
                "VALUES (?, ?, ?, ?, ?)",
                [(f.conversation_id, f.path, f.bytes, f.modified_at, f.removed_at) for f in files],
            )

    def expired_file(self, conversation_id: str, path: str) -> ExpiredFile | None:
        row = (
            self._connect()
            .execute("SELECT * FROM expired_files WHERE conversation_id = ? AND path = ?", (conversation_id, path))
            .fetchone()
        )
        return None if row is None else ExpiredFile(**dict(row))
