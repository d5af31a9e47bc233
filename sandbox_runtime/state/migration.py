"""Moving a state directory's SQLite state to a PostgreSQL server (``sandbox-runtime state migrate --to URL``).

Every record is copied in one transaction on the server (all of it, or nothing): conversations, sandboxes,
decisions and the execution record (in the order they were stored, so a replay afterwards gives the same texts in
the same order), attachments, expired files, tasks, tenants and the audit trail (its chain and head as they
were: ``audit verify`` passes on the server as it did on the file). Leases, holds and claims are not copied: they
belong to live processes, and a migration refuses to start while one uses the state. The server's database must hold no
state yet. Afterwards the SQLite file is renamed (kept, never used again) and the state directory names the
server (``state.url``): a runtime opening the directory without that server's URL is refused.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.errors import ConversationInUse, SandboxRuntimeError
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.state.engine import Row

__all__ = ["MigrationReport", "copy_state"]

# every table of records, parents first; the insertion order of the ones a replay reads in order is kept
_TABLES = (
    "conversations",
    "sandboxes",
    "tool_results",
    "calls",
    "attachments",
    "expired_files",
    "tasks",
    "tenants",
    "audit_log",
)
_IN_ORDER = frozenset({"tool_results", "calls"})
_BATCH_ROWS = 500


class MigrationReport(BaseModel):
    """What a migration copied: rows per table, and a digest of every decision's text (equal on both sides)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    target: str
    rows: dict[str, int]
    decisions_sha256: str
    kept_as: str  # where the SQLite file is now


def _columns(state: StateDB, table: str) -> set[str]:
    with state.engine.statements() as db:
        return state.engine.columns(db, table)


def _decisions_digest(state: StateDB) -> str:
    digest = hashlib.sha256()
    for record in state.conversations():
        for call_id, decision in state.stored_results(record.id).items():
            digest.update(f"{record.id}\0{call_id}\0".encode())
            digest.update(decision.text.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


def copy_state(source: StateDB, target: StateDB, sqlite_file: Path) -> MigrationReport:
    """Copy every record of ``source`` (SQLite) into ``target`` (a server holding no state yet), check the
    decisions read back the same, then set the SQLite file aside (see the module text)."""
    live = source.leases.live()
    if live:
        who = ", ".join(f"pid {lease.pid} on {lease.host}" for lease in live)
        raise ConversationInUse(f"the state is in use by {who}: stop every runtime using it, then migrate")
    if target.conversations():
        raise SandboxRuntimeError(f"{target.engine.shown} holds state already: migrate into an empty database")
    rows: dict[str, int] = {}
    with target.engine.transaction() as tx:
        for table in _TABLES:
            columns = sorted(_columns(source, table) & _columns(target, table))
            names = ", ".join(columns)
            order = f" ORDER BY {source.engine.insertion_order}" if table in _IN_ORDER else ""
            with source.engine.statements() as db:
                found: list[Row] = db.rows(f"SELECT {names} FROM {table}{order}")  # noqa: S608  (our own tables)
            insert = f"INSERT INTO {table}({names}) VALUES ({', '.join('?' * len(columns))})"  # noqa: S608  (our own tables)
            for start in range(0, len(found), _BATCH_ROWS):
                tx.run_many(insert, [tuple(row[c] for c in columns) for row in found[start : start + _BATCH_ROWS]])
            rows[table] = len(found)
        seq, digest = source.audit.head()  # the chain goes on where it ended
        tx.run("UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1", (seq, digest))
    before, after = _decisions_digest(source), _decisions_digest(target)
    if before != after:  # never expected: the server's copy stays, the SQLite file too, and both are named
        raise SandboxRuntimeError(
            f"the decisions read back from {target.engine.shown} differ from {sqlite_file}'s; both are kept as they "
            "are: report this"
        )
    kept = sqlite_file.with_name(f"{sqlite_file.name}.migrated-{time.strftime('%Y%m%dT%H%M%S')}")
    source.close()
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{sqlite_file}{suffix}")
        if part.exists():
            part.rename(f"{kept}{suffix}")
    return MigrationReport(
        source=str(sqlite_file), target=target.engine.shown, rows=rows, decisions_sha256=after, kept_as=str(kept)
    )
