"""The schema of the state database and its version (``PRAGMA user_version``, :data:`SCHEMA_VERSION`).

:func:`migrate` runs the steps from a database's version up, in one transaction (so that processes opening it
together migrate it once): a database of the versions before there was a number (``user_version`` 0) is brought
up to date, and one of a newer version, which this code does not know, is refused
(:class:`~sandbox_runtime.errors.SandboxRuntimeError`, naming both versions) before anything in it changes. A
step only ever adds (tables, indexes): an older runtime can still open a database a newer one migrated. The
lease tables are :mod:`~sandbox_runtime.state.leases`'s own (made when missing, whatever the version).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from sandbox_runtime.errors import StateVersionUnknown

__all__ = ["SCHEMA_VERSION", "migrate"]

logger = logging.getLogger(__name__)

_TABLES = """
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
"""  # the schema of every version before there was a number (user_version 0), as it was last

# _MIGRATIONS[n] takes a database from version n to n + 1 (statements run in one transaction, in order)
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 0 -> 1: the tables (made when missing: a new database starts at 0 too), and attachments by conversation
        *(statement.strip() for statement in _TABLES.split(";") if statement.strip()),
        "CREATE INDEX IF NOT EXISTS attachments_by_conversation ON attachments(conversation_id, created_at)",
    ),
    (  # 1 -> 2: a call made by a run_python script names the call of that run
        "ALTER TABLE calls ADD COLUMN made_by TEXT",
    ),
    (  # 2 -> 3: why a call failed, as data (a script's call replayed reads it from its decision)
        "ALTER TABLE calls ADD COLUMN failure TEXT",
        "ALTER TABLE tool_results ADD COLUMN failure TEXT",
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the database up to :data:`SCHEMA_VERSION` in one transaction; refuse a newer one untouched."""
    db.execute("BEGIN IMMEDIATE")
    try:
        found = int(db.execute("PRAGMA user_version").fetchone()[0])
        new = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        if found > SCHEMA_VERSION:
            raise StateVersionUnknown(
                f"the state database {path} has schema version {found}, newer than this sandbox-runtime knows "
                f"({SCHEMA_VERSION}): it was written by a newer version; open it with that version (or newer), "
                "or use another state directory"
            )
        for version in range(found, SCHEMA_VERSION):
            for statement in _MIGRATIONS[version]:
                db.execute(statement)
        if found != SCHEMA_VERSION:
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    if new:
        logger.info("made the state database %s (schema version %d)", path, SCHEMA_VERSION)
    elif found != SCHEMA_VERSION:
        logger.info("migrated the state database %s from schema version %d to %d", path, found, SCHEMA_VERSION)
