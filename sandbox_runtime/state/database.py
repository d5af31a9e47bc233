"""The runtime's embedded SQLite state: conversations, sandboxes, run numbering, the decision made for every
tool result (persisted replacements), the files retention removed, and which live process uses what (its
:class:`~sandbox_runtime.state.leases.Leases`, as ``StateDB.leases``).

Every write is one transaction; WAL mode keeps readers from blocking the writer. Each thread has its own
connection, closed when the thread ends (a host that serves each request on a thread of its own keeps no
descriptor of the threads that are gone) and, for every thread, when the ``StateDB`` closes. Model-facing texts
are stored as UTF-8 blobs (surrogates passed through), so a replayed text is the same string.

The schema has a version, and opening a database migrates it (:mod:`~sandbox_runtime.state.schema`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

from sandbox_runtime.errors import ConversationDeleted, StateUnavailable
from sandbox_runtime.models import Attachment, CallRecord, ResultDescriptor, StoredResult
from sandbox_runtime.state.leases import Leases
from sandbox_runtime.state.records import ConversationRecord, ExpiredFile, SandboxRecord
from sandbox_runtime.state.schema import SCHEMA_VERSION, migrate

__all__ = ["SCHEMA_VERSION", "STATE_PATH_MAX_BYTES", "StateDB"]

# SQLite's unix VFS opens paths of at most 512 bytes; the rollback journal adds "-journal" to the name
STATE_PATH_MAX_BYTES = 512 - len("-journal")


def _text_blob(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _descriptor_json(descriptor: ResultDescriptor | None) -> str | None:
    return None if descriptor is None else descriptor.model_dump_json()


def _descriptor(text: str | None) -> ResultDescriptor | None:
    return None if text is None else ResultDescriptor.model_validate_json(text)


def _stored(row: sqlite3.Row) -> StoredResult:
    fields = dict(row)
    fields["text"] = bytes(fields["text"]).decode("utf-8", "surrogatepass")
    fields["descriptor"] = _descriptor(fields["descriptor"])
    return StoredResult(**fields)


class _Slot:
    """A thread's connection, kept in the ``StateDB``'s thread-local storage: when the thread ends, its storage
    goes and so does the slot, whose finalizer closes the connection."""

    __slots__ = ("__weakref__", "db", "generation")

    def __init__(self, db: sqlite3.Connection, generation: int) -> None:
        self.db = db
        self.generation = generation


def _close_tracked(tracked: dict[int, sqlite3.Connection], guard: threading.Lock, key: int) -> None:
    """Close one tracked connection unless it was closed already (a finalizer: holds no ``StateDB``)."""
    with guard:
        db = tracked.pop(key, None)
    if db is not None:
        db.close()


def _check_path_length(path: Path) -> None:
    """SQLite opens files by paths of at most 512 bytes (its unix VFS), and its journal's name is 8 bytes longer."""
    full = len(os.fsencode(path.resolve()))
    if full > STATE_PATH_MAX_BYTES:
        raise StateUnavailable(
            f"the state database's path is {full:,} bytes long, and SQLite opens paths of at most "
            f"{STATE_PATH_MAX_BYTES} bytes (with its journal's suffix): choose a state directory with a shorter path "
            f"(--state-dir or SANDBOX_RUNTIME_STATE_DIR): {str(path)[:120]}..."
        )


class StateDB:
    """A small typed wrapper around ``STATE_DIR/state.sqlite3``; see the module's text for its connections and
    its schema version. Opening a database of a newer schema version raises :class:`SandboxRuntimeError`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        _check_path_length(path)
        self._local = threading.local()
        self._tracked: dict[int, sqlite3.Connection] = {}  # every open connection, by slot number
        self._tracked_guard = threading.Lock()
        self._numbers = itertools.count()
        self._generation = 0  # close() moves it on: a slot of an earlier generation holds a closed connection
        try:
            migrate(self._connect(), path)
            self.leases = Leases(self._connect, self._transaction)
        except BaseException:
            self.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        """This thread's connection, opened on its first use (again after :meth:`close`)."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is not None and slot.generation == self._generation:
            return slot.db
        # not tied to its thread, so that close() (or a finalizer) can close it from another one; only its own
        # thread ever runs statements on it
        try:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        except sqlite3.OperationalError as exc:
            raise StateUnavailable(f"cannot open the state database {self.path}: {exc}") from exc
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA foreign_keys=ON")
        except sqlite3.OperationalError as exc:
            db.close()
            raise StateUnavailable(f"cannot use the state database {self.path}: {exc}") from exc
        except BaseException:
            db.close()
            raise
        key = next(self._numbers)
        with self._tracked_guard:
            self._tracked[key] = db
            slot = _Slot(db, self._generation)
        weakref.finalize(slot, _close_tracked, self._tracked, self._tracked_guard, key)
        self._local.slot = slot
        return db

    @contextlib.contextmanager
    def _transaction(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction on this thread's connection: committed when the block ends, else rolled back.

        ``durable=False`` commits without waiting for the disk (``synchronous=NORMAL`` for this one commit): a
        process that crashes keeps it, a power cut may lose it, until the next durable commit (of any thread or
        process) makes it durable with its own."""
        db = self._connect()
        if not durable:
            db.execute("PRAGMA synchronous=NORMAL")
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            if not durable:
                db.execute("PRAGMA synchronous=FULL")

    def open_connections(self) -> int:
        """How many connections are open now (one per thread that used the database and is still running)."""
        with self._tracked_guard:
            return len(self._tracked)

    def close(self) -> None:
        """Close the connection of every thread (call it when no other thread is inside a state operation); a
        thread that uses the database afterwards opens a new one."""
        with self._tracked_guard:
            self._generation += 1
            closing = list(self._tracked.values())
            self._tracked.clear()
        for db in closing:
            db.close()

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

    def knows_conversation(self, conversation_id: str) -> bool:
        return self.conversation(conversation_id) is not None

    def conversations(self) -> list[ConversationRecord]:
        rows = self._connect().execute("SELECT * FROM conversations ORDER BY created_at").fetchall()
        return [ConversationRecord(**dict(row)) for row in rows]

    def forget_conversation(self, conversation_id: str) -> None:
        with self._transaction() as db:
            for table in ("sandboxes", "tool_results", "calls", "attachments", "expired_files", "holds"):
                db.execute(f"DELETE FROM {table} WHERE conversation_id = ?", (conversation_id,))  # noqa: S608  (table names from our own list)
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def begin_run(self, conversation_id: str, container_id: str, lease_id: str, when: float) -> int:
        """The conversation's next run number, and the use of its sandbox and of the lease's hold recorded at
        ``when``, in one transaction; :class:`ConversationDeleted` when the conversation is no longer recorded
        (another process deleted it between the start of the run and now).

        Not waited on to reach the disk (an fsync is a tenth of a warm run): the run's decision, recorded
        durably before anyone sees its result, makes it durable too. A power cut before that may hand the number
        out again, to a run whose files then take fresh names (``create_numbered``)."""
        with self._transaction(durable=False) as db:
            row = db.execute(
                "UPDATE conversations SET runs = runs + 1 WHERE id = ? RETURNING runs", (conversation_id,)
            ).fetchone()
            if row is not None:
                db.execute("UPDATE sandboxes SET last_used_at = ? WHERE container_id = ?", (when, container_id))
                db.execute(
                    "UPDATE holds SET used_at = ? WHERE lease_id = ? AND conversation_id = ?",
                    (when, lease_id, conversation_id),
                )
        if row is None:
            raise ConversationDeleted(
                f"conversation {conversation_id!r} was deleted while it was in use; open it again with "
                f"runtime.conversation({conversation_id!r}) to start it afresh"
            )
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

    def live_sandboxes_of(self, conversation_id: str) -> list[SandboxRecord]:
        """The conversation's sandboxes not recorded as removed, oldest first."""
        rows = (
            self._connect()
            .execute(
                "SELECT * FROM sandboxes WHERE conversation_id = ? AND removed_at IS NULL ORDER BY created_at",
                (conversation_id,),
            )
            .fetchall()
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
                    "error_path, made_by, failure) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                        _descriptor_json(c.descriptor),
                        c.error_path,
                        c.made_by,
                        c.failure,
                    ),
                )
            for r in results:
                db.execute(
                    "INSERT OR IGNORE INTO tool_results(conversation_id, call_id, tool, turn_id, decided_at, is_error, "
                    "replaced, text, descriptor, error_path, failure) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        r.conversation_id,
                        r.call_id,
                        r.tool,
                        r.turn_id,
                        r.decided_at,
                        int(r.is_error),
                        int(r.replaced),
                        _text_blob(r.text),
                        _descriptor_json(r.descriptor),
                        r.error_path,
                        r.failure,
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
                    f"SELECT * FROM tool_results WHERE conversation_id = ? AND call_id IN ({marks}) "  # noqa: S608  (only ? marks)
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
            fields["descriptor"] = _descriptor(fields["descriptor"])
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
