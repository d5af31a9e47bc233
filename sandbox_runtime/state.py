"""The runtime's embedded SQLite state: conversations, their sandboxes, and run numbering.

Every write is one transaction; WAL mode keeps readers from blocking the writer. Connections are per thread.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

__all__ = ["ConversationRecord", "SandboxRecord", "StateDB"]

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
"""


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
            db.execute("DELETE FROM sandboxes WHERE conversation_id = ?", (conversation_id,))
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
        self._connect().execute(
            "UPDATE sandboxes SET removed_at = ?, removed_reason = ? WHERE container_id = ? AND removed_at IS NULL",
            (time.time(), reason, container_id),
        )
