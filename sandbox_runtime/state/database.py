"""The runtime's state: conversations, sandboxes, run numbering, the decision made for every tool result
(persisted replacements), the files retention removed, and which live process uses what (its
:class:`~sandbox_runtime.state.leases.Leases`, as ``StateDB.leases``) and which of them runs a call id now
(:class:`~sandbox_runtime.state.claims.CallClaims`, as ``StateDB.claims``).

The records are kept by a :class:`~sandbox_runtime.state.engine.StateEngine`: the embedded SQLite file in the state
directory by default, or a PostgreSQL server several replicas share. Every write is one statement or one
transaction. Model-facing texts are stored as UTF-8 bytes (surrogates passed through), so a replayed text is the
same string. The schema has a version, and opening a database migrates it (:mod:`~sandbox_runtime.state.schema`).
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from sandbox_runtime.errors import ConversationDeleted
from sandbox_runtime.models import Attachment, CallRecord, ResultDescriptor, StoredResult
from sandbox_runtime.state.audit import AuditLog, call_detail
from sandbox_runtime.state.claims import CallClaims
from sandbox_runtime.state.engine import Row, StateEngine
from sandbox_runtime.state.leases import LEASE_TTL_S, Leases
from sandbox_runtime.state.owed import OwedWrites
from sandbox_runtime.state.records import ConversationRecord, ExpiredFile, SandboxRecord, StoreReport
from sandbox_runtime.state.schema import SCHEMA_VERSION, migrate
from sandbox_runtime.state.sqlite import STATE_PATH_MAX_BYTES, SqliteEngine
from sandbox_runtime.state.tasks import TaskRecords
from sandbox_runtime.state.tenants import TenantNames

__all__ = ["SCHEMA_VERSION", "STATE_PATH_MAX_BYTES", "StateDB"]


def _text_blob(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _text(blob: bytes | memoryview) -> str:
    return bytes(blob).decode("utf-8", "surrogatepass")


def _descriptor_json(descriptor: ResultDescriptor | None) -> str | None:
    return None if descriptor is None else descriptor.model_dump_json()


def _descriptor(text: str | None) -> ResultDescriptor | None:
    return None if text is None else ResultDescriptor.model_validate_json(text)


def _columns(model: type[BaseModel]) -> str:
    """The columns of a table whose rows are ``model``'s records (an engine's own columns left out)."""
    return ", ".join(model.model_fields)


# every table with rows of one conversation (deleted with it)
_CONVERSATION_TABLES = (
    "sandboxes",
    "tool_results",
    "calls",
    "attachments",
    "expired_files",
    "holds",
    "call_claims",
    "tasks",
    "turn_totals",
)


def _marks(model: type[BaseModel]) -> str:
    return ", ".join("?" * len(model.model_fields))


# a decision and an execution record, inserted unless their call id was recorded before (our own columns only)
_INSERT_RESULT = (
    f"INSERT INTO tool_results({_columns(StoredResult)}) VALUES ({_marks(StoredResult)}) "  # noqa: S608  (our own columns)
    "ON CONFLICT(conversation_id, call_id) DO NOTHING"
)
_INSERT_CALL = (
    f"INSERT INTO calls({_columns(CallRecord)}) VALUES ({_marks(CallRecord)}) "  # noqa: S608  (our own columns)
    "ON CONFLICT(conversation_id, call_id) DO NOTHING"
)


def _stored(row: Row) -> StoredResult:
    row["text"] = _text(row["text"])
    row["descriptor"] = _descriptor(row["descriptor"])
    return StoredResult(**row)


def _call_record(row: Row) -> CallRecord:
    for key in ("arguments", "expanded"):
        if row[key] is not None:
            row[key] = _text(row[key])
    row["descriptor"] = _descriptor(row["descriptor"])
    return CallRecord(**row)


class StateDB:
    """The state's typed records, kept by an engine (given, or a path: the SQLite file there). Opening a database
    of a newer schema version raises :class:`~sandbox_runtime.errors.StateVersionUnknown`; one the engine cannot
    reach, :class:`~sandbox_runtime.errors.StateUnavailable`."""

    def __init__(self, where: Path | StateEngine, *, lease_ttl_s: float = LEASE_TTL_S) -> None:
        self.engine: StateEngine = SqliteEngine(where) if isinstance(where, Path) else where
        try:
            migrate(self.engine)
        except BaseException:
            self.engine.close()
            raise
        self.leases = Leases(self.engine, lease_ttl_s)
        self.owed = OwedWrites()  # rows to clear that the state was away for
        self.claims = CallClaims(self.engine, self.leases, self.owed)
        self.tasks = TaskRecords(self.engine, self.owed)
        self.tenants = TenantNames(self.engine)
        self.audit = AuditLog(self.engine, self.tenants)

    def report(self) -> StoreReport:
        """Where the state lives and its schema version."""
        with self.engine.statements() as db:
            version = self.engine.schema_version(db) or 0
        return StoreReport(store=self.engine.kind, where=self.engine.shown, schema_version=version)

    def open_connections(self) -> int:
        """How many connections the engine has open now."""
        return self.engine.open_connections()

    def close(self) -> None:
        """Close the engine's connections (call it when no other thread is inside a state operation); a later use
        opens new ones."""
        self.engine.close()

    # conversations ---------------------------------------------------------------------------------------
    def ensure_conversation(self, conversation_id: str, quota_mode: str, quota_bytes: int) -> ConversationRecord:
        with self.engine.statements() as db:
            db.run(
                "INSERT INTO conversations(id, created_at, quota_mode, quota_bytes) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(id) DO NOTHING",
                (conversation_id, time.time(), quota_mode, quota_bytes),
            )
        record = self.conversation(conversation_id)
        assert record is not None  # noqa: S101  (inserted just above)
        return record

    def conversation(self, conversation_id: str) -> ConversationRecord | None:
        with self.engine.statements() as db:
            row = db.row("SELECT * FROM conversations WHERE id = ?", (conversation_id,))
        return None if row is None else ConversationRecord(**row)

    def knows_conversation(self, conversation_id: str) -> bool:
        return self.conversation(conversation_id) is not None

    def conversations(self) -> list[ConversationRecord]:
        with self.engine.statements() as db:
            rows = db.rows("SELECT * FROM conversations ORDER BY created_at")
        return [ConversationRecord(**row) for row in rows]

    def forget_conversation(self, conversation_id: str) -> None:
        with self.engine.transaction() as db:
            for table in _CONVERSATION_TABLES:
                db.run(f"DELETE FROM {table} WHERE conversation_id = ?", (conversation_id,))  # noqa: S608  (table names from our own list)
            db.run("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def begin_run(self, conversation_id: str, container_id: str, lease_id: str, when: float) -> int:
        """The conversation's next run number, and the use of its sandbox and of the lease's hold recorded at
        ``when``, in one transaction; :class:`ConversationDeleted` when the conversation is no longer recorded
        (another process deleted it between the start of the run and now).

        Not waited on to reach the disk (an fsync is a tenth of a warm run): the run's decision, recorded
        durably before anyone sees its result, makes it durable too. A crash before that may hand the number
        out again, to a run whose files then take fresh names (``create_numbered``)."""
        with self.engine.transaction(durable=False) as db:
            row = db.row("UPDATE conversations SET runs = runs + 1 WHERE id = ? RETURNING runs", (conversation_id,))
            if row is not None:
                db.run("UPDATE sandboxes SET last_used_at = ? WHERE container_id = ?", (when, container_id))
                db.run(
                    "UPDATE holds SET used_at = ? WHERE lease_id = ? AND conversation_id = ?",
                    (when, lease_id, conversation_id),
                )
        if row is None:
            raise ConversationDeleted(
                f"conversation {conversation_id!r} was deleted while it was in use; open it again with "
                f"runtime.conversation({conversation_id!r}) to start it afresh"
            )
        return int(row["runs"])

    # sandboxes -------------------------------------------------------------------------------------------
    def record_sandbox(self, container_id: str, conversation_id: str, created_at: float) -> None:
        """Record the conversation's sandbox (once; written to the audit trail when it is new)."""
        tenant = self.audit.tenant_of(conversation_id)
        with self.engine.transaction() as db:
            added = db.run(
                "INSERT INTO sandboxes(container_id, conversation_id, created_at, last_used_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(container_id) DO NOTHING",
                (container_id, conversation_id, created_at, time.time()),
            )
            if added:
                facts = {"conversation": conversation_id, "container_id": container_id}
                self.audit.append_in(db, "sandbox_started", tenant=tenant, **facts)

    def touch_sandbox(self, container_id: str, when: float) -> None:
        with self.engine.statements() as db:
            db.run("UPDATE sandboxes SET last_used_at = ? WHERE container_id = ?", (when, container_id))

    def sandbox(self, container_id: str) -> SandboxRecord | None:
        with self.engine.statements() as db:
            row = db.row("SELECT * FROM sandboxes WHERE container_id = ?", (container_id,))
        return None if row is None else SandboxRecord(**row)

    def live_sandboxes(self) -> list[SandboxRecord]:
        with self.engine.statements() as db:
            rows = db.rows("SELECT * FROM sandboxes WHERE removed_at IS NULL ORDER BY created_at")
        return [SandboxRecord(**row) for row in rows]

    def live_sandboxes_of(self, conversation_id: str) -> list[SandboxRecord]:
        """The conversation's sandboxes not recorded as removed, oldest first."""
        with self.engine.statements() as db:
            rows = db.rows(
                "SELECT * FROM sandboxes WHERE conversation_id = ? AND removed_at IS NULL ORDER BY created_at",
                (conversation_id,),
            )
        return [SandboxRecord(**row) for row in rows]

    def live_sandbox_count(self, tag: str) -> int:
        """How many sandboxes of a tenant's conversations (by its tag) are not recorded as removed, or are being
        started by a live process (a start whose process is gone no longer counts)."""
        where = "conversation_id LIKE ?" if tag else "conversation_id NOT LIKE ?"
        pattern = f"{tag}.%" if tag else "%.%"
        query = (
            f"SELECT (SELECT count(*) FROM sandboxes WHERE removed_at IS NULL AND {where}) AS live, "  # noqa: S608  (one of two constants)
            f"(SELECT count(*) FROM sandbox_starts s WHERE s.{where} AND NOT EXISTS (SELECT 1 FROM sandboxes x "
            "WHERE x.conversation_id = s.conversation_id AND x.removed_at IS NULL)) AS starting"
        )

        def counted() -> tuple[int, int]:
            with self.engine.statements() as db:
                row = db.row(query, (pattern, pattern))
            return (0, 0) if row is None else (int(row["live"]), int(row["starting"]))

        live, starting = counted()
        if starting:
            self.leases.live()  # the starts of processes that are gone are dropped with their leases
            live, starting = counted()
        return live + starting

    def mark_removed(self, container_id: str, reason: str) -> None:
        """Record the container as removed (before it is: nobody re-attaches it meanwhile) and clear it from every
        hold, in one transaction."""
        with self.engine.transaction() as db:
            marked = db.row(
                "UPDATE sandboxes SET removed_at = ?, removed_reason = ? WHERE container_id = ? AND removed_at IS NULL "
                "RETURNING conversation_id",
                (time.time(), reason, container_id),
            )
            db.run("UPDATE holds SET container_id = NULL WHERE container_id = ?", (container_id,))
            if marked is not None:
                conversation = str(marked["conversation_id"])
                tenant = self.audit.tenant_of(conversation)  # (the tenants table is read apart: cached as a rule)
                facts = {"conversation": conversation, "tenant": tenant, "container_id": container_id}
                self.audit.append_in(db, "sandbox_removed", reason=reason, **facts)

    # tool results -----------------------------------------------------------------------------------------
    def store_results(
        self, results: list[StoredResult], calls: list[CallRecord] | None = None
    ) -> dict[str, StoredResult]:
        """Record decisions (and their calls' execution records) in one transaction, with an audit entry for each
        call whose decision this is (:func:`~sandbox_runtime.state.audit.call_detail`); a call id decided before
        keeps its first decision. Returns what is stored for each call id afterwards."""
        records = {c.call_id: c for c in calls or []}
        tenants = {r.conversation_id: self.audit.tenant_of(r.conversation_id) for r in results}
        with self.engine.transaction() as db:
            for c in records.values():
                db.run(_INSERT_CALL, _call_values(c))
            for r in results:
                decided_now = db.run(_INSERT_RESULT, _result_values(r))
                record = records.get(r.call_id)
                if decided_now and record is not None:
                    conversation, tenant = r.conversation_id, tenants[r.conversation_id]
                    detail = call_detail(record, r.text)
                    self.audit.append_in(
                        db, "call", conversation=conversation, call_id=r.call_id, tenant=tenant, **detail
                    )
        by_conversation: dict[str, list[str]] = {}
        for r in results:
            by_conversation.setdefault(r.conversation_id, []).append(r.call_id)
        stored: dict[str, StoredResult] = {}
        for conversation_id, call_ids in by_conversation.items():
            stored.update(self.stored_results(conversation_id, call_ids))
        return stored

    def record_calls(self, calls: list[CallRecord], texts: list[str]) -> None:
        """Keep calls that have no decision to store (a host program's own: nothing was shown to a model) in the
        execution record, each with its audit entry, ``texts`` standing for what they returned, in one
        transaction."""
        tenants = {c.conversation_id: self.audit.tenant_of(c.conversation_id) for c in calls}
        with self.engine.transaction() as db:
            for record, text in zip(calls, texts, strict=True):
                db.run(_INSERT_CALL, _call_values(record))
                conversation, tenant = record.conversation_id, tenants[record.conversation_id]
                detail = call_detail(record, text)
                self.audit.append_in(
                    db, "call", conversation=conversation, call_id=record.call_id, tenant=tenant, **detail
                )

    def stored_results(self, conversation_id: str, call_ids: list[str] | None = None) -> dict[str, StoredResult]:
        """Stored decisions of a conversation (all, or those of ``call_ids``), by call id, oldest first."""
        select = f"SELECT {_columns(StoredResult)} FROM tool_results WHERE conversation_id = ?"  # noqa: S608  (our own columns)
        order = f" ORDER BY decided_at, {self.engine.insertion_order}"
        with self.engine.statements() as db:
            if call_ids is None:
                rows = db.rows(select + order, (conversation_id,))
            else:
                rows = []
                for start in range(0, len(call_ids), 500):
                    chunk = call_ids[start : start + 500]
                    marks = ",".join("?" * len(chunk))
                    rows += db.rows(f"{select} AND call_id IN ({marks}){order}", (conversation_id, *chunk))
        return {row["call_id"]: _stored(row) for row in rows}

    def calls(self, conversation_id: str) -> list[CallRecord]:
        """The execution record of a conversation, oldest first."""
        with self.engine.statements() as db:
            rows = db.rows(
                f"SELECT {_columns(CallRecord)} FROM calls WHERE conversation_id = ? "  # noqa: S608  (our own columns)
                f"ORDER BY started_at, {self.engine.insertion_order}",
                (conversation_id,),
            )
        return [_call_record(row) for row in rows]

    # turns ----------------------------------------------------------------------------------------------
    def turn_shown(self, conversation_id: str, turn_id: str) -> int:
        """How many characters the turn's decided calls showed so far (in every runtime)."""
        with self.engine.statements() as db:
            row = db.row(
                "SELECT shown_chars FROM turn_totals WHERE conversation_id = ? AND turn_id = ?",
                (conversation_id, turn_id),
            )
        return 0 if row is None else int(row["shown_chars"])

    def add_turn_shown(self, conversation_id: str, turn_id: str, chars: int, when: float) -> None:
        """Count ``chars`` more shown by the turn (added in one statement: two runtimes adding at once both
        count)."""
        with self.engine.transaction(durable=False) as db:  # a crash forgets at most what a turn showed
            db.run(
                "INSERT INTO turn_totals(conversation_id, turn_id, shown_chars, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(conversation_id, turn_id) DO UPDATE SET "
                "shown_chars = turn_totals.shown_chars + excluded.shown_chars, updated_at = excluded.updated_at",
                (conversation_id, turn_id, chars, when),
            )

    def forget_turns_before(self, when: float) -> None:
        """Drop the totals of turns not added to since ``when``."""
        with self.engine.statements() as db:
            db.run("DELETE FROM turn_totals WHERE updated_at < ?", (when,))

    # attachments ------------------------------------------------------------------------------------------
    def record_attachment(self, conversation_id: str, a: Attachment) -> None:
        """Record an attachment, with its audit entry."""
        tenant = self.audit.tenant_of(conversation_id)
        with self.engine.transaction() as db:
            db.run(
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
            self.audit.append_in(
                db,
                "attachment_made",
                conversation=conversation_id,
                tenant=tenant,
                attachment_id=a.attachment_id,
                filename=a.filename,
                bytes=a.bytes,
                sha256=a.sha256,
                source=a.source,
            )

    def attachments(self, conversation_id: str) -> list[Attachment]:
        with self.engine.statements() as db:
            rows = db.rows(
                f"SELECT {_columns(Attachment)} FROM attachments WHERE conversation_id = ? ORDER BY created_at",  # noqa: S608  (our own columns)
                (conversation_id,),
            )
        return [Attachment(**row) for row in rows]

    # retention --------------------------------------------------------------------------------------------
    def record_expired(self, files: list[ExpiredFile]) -> None:
        with self.engine.transaction() as db:
            db.run_many(
                "INSERT INTO expired_files(conversation_id, path, bytes, modified_at, removed_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT(conversation_id, path) DO UPDATE SET bytes = excluded.bytes, "
                "modified_at = excluded.modified_at, removed_at = excluded.removed_at",
                [(f.conversation_id, f.path, f.bytes, f.modified_at, f.removed_at) for f in files],
            )

    def expired_file(self, conversation_id: str, path: str) -> ExpiredFile | None:
        with self.engine.statements() as db:
            row = db.row("SELECT * FROM expired_files WHERE conversation_id = ? AND path = ?", (conversation_id, path))
        return None if row is None else ExpiredFile(**row)


def _call_values(c: CallRecord) -> tuple[object, ...]:
    fields = c.model_dump()
    for key in ("arguments", "expanded"):
        if fields[key] is not None:
            fields[key] = _text_blob(fields[key])
    fields["arguments_cut"] = int(c.arguments_cut)
    fields["descriptor"] = _descriptor_json(c.descriptor)
    return tuple(fields[name] for name in CallRecord.model_fields)


def _result_values(r: StoredResult) -> tuple[object, ...]:
    fields = r.model_dump()
    fields.update(
        is_error=int(r.is_error),
        replaced=int(r.replaced),
        text=_text_blob(r.text),
        descriptor=_descriptor_json(r.descriptor),
    )
    return tuple(fields[name] for name in StoredResult.model_fields)
