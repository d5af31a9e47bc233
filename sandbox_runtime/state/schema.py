"""The schema of the state database and its version (:data:`SCHEMA_VERSION`; kept as each engine keeps it:
SQLite's ``PRAGMA user_version``, PostgreSQL's ``schema_version`` table).

:func:`migrate` runs the steps from a database's version up, in one exclusive transaction (so that processes
opening it together migrate it once): a database of the versions before there was a number (version 0) is brought
up to date, and one of a newer version, which this code does not know, is refused
(:class:`~sandbox_runtime.errors.SandboxRuntimeError`, naming both versions) before anything in it changes. A
step only ever adds (tables, indexes): an older runtime can still open a database a newer one migrated. The
lease tables are :mod:`~sandbox_runtime.state.leases`'s own (made when missing, whatever the version).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from sandbox_runtime.errors import StateVersionUnknown
from sandbox_runtime.state.audit import GENESIS_HASH
from sandbox_runtime.state.engine import EngineKind, StateEngine
from sandbox_runtime.state.leases import LEASE_TABLES

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


class _Only(NamedTuple):
    """A step of one engine only (written as that engine spells it)."""

    kind: EngineKind
    statement: str


class _AddColumn(NamedTuple):
    """A column added to a table that may have it already (the lease tables are made as they are now when they
    are missing, whatever the version)."""

    table: str
    column: str
    type: str


# _MIGRATIONS[n] takes a database from version n to n + 1 (statements run in one transaction, in order; each engine
# spells the types its way, see StateEngine.ddl)
_MIGRATIONS: tuple[tuple[str | _Only | _AddColumn, ...], ...] = (
    (  # 0 -> 1: the tables (made when missing: a new database starts at 0 too), and attachments by conversation
        *(statement.strip() for statement in _TABLES.split(";") if statement.strip()),
        "CREATE INDEX IF NOT EXISTS attachments_by_conversation ON attachments(conversation_id, created_at)",
        # SQLite orders a table's rows as inserted by its rowid; PostgreSQL has none, so it keeps a number
        _Only("postgresql", "ALTER TABLE tool_results ADD COLUMN seq BIGSERIAL"),
        _Only("postgresql", "ALTER TABLE calls ADD COLUMN seq BIGSERIAL"),
    ),
    (  # 1 -> 2: a call made by a run_python script names the call of that run
        "ALTER TABLE calls ADD COLUMN made_by TEXT",
    ),
    (  # 2 -> 3: why a call failed, as data (a script's call replayed reads it from its decision)
        "ALTER TABLE calls ADD COLUMN failure TEXT",
        "ALTER TABLE tool_results ADD COLUMN failure TEXT",
    ),
    (  # 3 -> 4: what replicas sharing the state need: a lease renewed (one on another host counts as gone once its
        # renewals stop), a call id claimed by the one runtime that runs it, MCP tasks any replica can read, and
        # what a turn id has shown so far (its calls may reach several replicas)
        _AddColumn("leases", "renewed_at", "REAL"),
        """CREATE TABLE IF NOT EXISTS call_claims (
            conversation_id TEXT NOT NULL,
            call_id TEXT NOT NULL,
            claim TEXT NOT NULL,
            lease_id TEXT NOT NULL,
            claimed_at REAL NOT NULL,
            PRIMARY KEY (conversation_id, call_id)
        )""",
        """CREATE TABLE IF NOT EXISTS tasks (
            task_id TEXT PRIMARY KEY,
            conversation_id TEXT NOT NULL,
            lease_id TEXT NOT NULL,
            ttl_ms INTEGER NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            status TEXT NOT NULL,
            status_message TEXT,
            ended INTEGER NOT NULL DEFAULT 0,
            result BLOB,
            error TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS tasks_by_conversation ON tasks(conversation_id, created_at)",
        """CREATE TABLE IF NOT EXISTS turn_totals (
            conversation_id TEXT NOT NULL,
            turn_id TEXT NOT NULL,
            shown_chars INTEGER NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (conversation_id, turn_id)
        )""",
    ),
    (  # 4 -> 5: tenants (a conversation key holds its tenant's tag; the tag's tenant is kept here) and the
        # hash-chained audit trail, with its head (the last entry's number and hash; its one row serialises appends)
        """CREATE TABLE IF NOT EXISTS tenants (
            tag TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            first_seen_at REAL NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS audit_log (
            seq INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            tenant TEXT,
            conversation_id TEXT,
            call_id TEXT,
            detail TEXT NOT NULL,
            prev_hash TEXT NOT NULL,
            hash TEXT NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS audit_by_time ON audit_log(at)",
        """CREATE TABLE IF NOT EXISTS audit_head (
            id INTEGER PRIMARY KEY,
            seq INTEGER NOT NULL,
            hash TEXT NOT NULL
        )""",
        f"INSERT INTO audit_head(id, seq, hash) VALUES (1, 0, '{GENESIS_HASH}') ON CONFLICT(id) DO NOTHING",  # noqa: S608  (a constant)
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)


def migrate(engine: StateEngine) -> None:
    """Bring the database up to :data:`SCHEMA_VERSION` in one exclusive transaction; refuse a newer one untouched.
    The lease tables are made when missing, whatever the version."""
    with engine.transaction(exclusive=True) as tx:
        recorded = engine.schema_version(tx)
        found = recorded or 0
        if found > SCHEMA_VERSION:
            raise StateVersionUnknown(
                f"the state database {engine.shown} has schema version {found}, newer than this sandbox-runtime "
                f"knows ({SCHEMA_VERSION}): it was written by a newer version; open it with that version (or "
                "newer), or use another state directory"
            )
        for statement in LEASE_TABLES:  # first: a step may change them
            tx.run(engine.ddl(statement))
        for version in range(found, SCHEMA_VERSION):
            for step in _MIGRATIONS[version]:
                if isinstance(step, str):
                    tx.run(engine.ddl(step))
                elif isinstance(step, _AddColumn):
                    if step.column not in engine.columns(tx, step.table):
                        tx.run(engine.ddl(f"ALTER TABLE {step.table} ADD COLUMN {step.column} {step.type}"))
                elif step.kind == engine.kind:
                    tx.run(step.statement)
        if found != SCHEMA_VERSION or recorded is None:
            engine.set_schema_version(tx, SCHEMA_VERSION)
    if recorded is None:
        logger.info("made the state database %s (schema version %d)", engine.shown, SCHEMA_VERSION)
    elif found != SCHEMA_VERSION:
        logger.info("migrated the state database %s from schema version %d to %d", engine.shown, found, SCHEMA_VERSION)
