"""MCP tasks as the state keeps them (the ``tasks`` table), so that any replica answers for a task another started.

A task row names the lease of the runtime running its call. Its status moves from ``working`` to ``completed``,
``failed`` or ``cancelled`` once; ``ended`` says its call's result (or the protocol error that ended it) is
stored. A cancel is a status written by whichever runtime was asked; the runtime running the call sees it and
cancels the call (:mod:`~sandbox_runtime.mcp.tasks`). What the task *means* to a client is the MCP layer's.
An end the state refused (it was away) is owed (:mod:`~sandbox_runtime.state.owed`) and written once it answers:
a task whose call ended never stays ``working`` while its runtime lives.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.state.engine import Row, StateEngine
from sandbox_runtime.state.owed import OwedWrites

__all__ = ["TaskRecord", "TaskRecords"]


class TaskRecord(BaseModel):
    """One task as stored; ``result`` and ``error`` are JSON (the ``CallToolResult``, a JSON-RPC error)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    conversation_id: str
    lease_id: str  # the runtime running its call
    ttl_ms: int
    created_at: float
    updated_at: float
    status: str
    status_message: str | None = None
    ended: bool = False
    result: bytes | None = None
    error: str | None = None


_COLUMNS = ", ".join(TaskRecord.model_fields)


def _record(row: Row) -> TaskRecord:
    result = row["result"]
    return TaskRecord(**{**row, "result": None if result is None else bytes(result)})


class TaskRecords:
    """The tasks of one state database."""

    def __init__(self, engine: StateEngine, owed: OwedWrites) -> None:
        self._engine = engine
        self._owed = owed

    def add(self, task: TaskRecord) -> None:
        with self._engine.statements() as db:
            db.run(
                f"INSERT INTO tasks({_COLUMNS}) VALUES ({', '.join('?' * len(TaskRecord.model_fields))})",  # noqa: S608  (our own columns)
                tuple(int(value) if isinstance(value, bool) else value for value in task.model_dump().values()),
            )

    def get(self, task_id: str) -> TaskRecord | None:
        with self._engine.statements() as db:
            row = db.row(f"SELECT {_COLUMNS} FROM tasks WHERE task_id = ?", (task_id,))  # noqa: S608  (our own columns)
        return None if row is None else _record(row)

    def of_conversation(self, conversation_id: str) -> list[TaskRecord]:
        with self._engine.statements() as db:
            rows = db.rows(
                f"SELECT {_COLUMNS} FROM tasks WHERE conversation_id = ? ORDER BY created_at",  # noqa: S608  (our own columns)
                (conversation_id,),
            )
        return [_record(row) for row in rows]

    def running(self) -> list[tuple[str, str]]:
        """The tasks that have not ended (in every runtime): (task id, the lease running its call)."""
        with self._engine.statements() as db:
            rows = db.rows("SELECT task_id, lease_id FROM tasks WHERE ended = 0")
        return [(row["task_id"], row["lease_id"]) for row in rows]

    def end(self, task_id: str, status: str, status_message: str | None, result: bytes, error: str | None) -> bool:
        """Store the call's result (and the error that ended it), unless it ended already; the status too,
        unless it was set already (a cancel). False when it had ended (or is not stored). When the state is
        away, the end is owed and the failure raised."""
        return self._owed.make(f"end task {task_id}", lambda: self._end(task_id, status, status_message, result, error))

    def _end(self, task_id: str, status: str, status_message: str | None, result: bytes, error: str | None) -> bool:
        with self._engine.statements() as db:
            return bool(
                db.run(
                    "UPDATE tasks SET ended = 1, result = ?, error = ?, updated_at = ?, "
                    "status_message = CASE WHEN status = 'working' THEN ? ELSE status_message END, "
                    "status = CASE WHEN status = 'working' THEN ? ELSE status END "
                    "WHERE task_id = ? AND ended = 0",
                    (result, error, time.time(), status_message, status, task_id),
                )
            )

    def cancel(self, task_id: str, message: str) -> bool:
        """Mark a ``working`` task ``cancelled`` (its runtime cancels the call); False when it was not working."""
        with self._engine.statements() as db:
            return bool(
                db.run(
                    "UPDATE tasks SET status = 'cancelled', status_message = ?, updated_at = ? "
                    "WHERE task_id = ? AND status = 'working'",
                    (message, time.time(), task_id),
                )
            )

    def cancelled(self, task_ids: list[str]) -> list[str]:
        """Which of these tasks are ``cancelled``."""
        if not task_ids:
            return []
        marks = ",".join("?" * len(task_ids))
        with self._engine.statements() as db:
            rows = db.rows(
                f"SELECT task_id FROM tasks WHERE status = 'cancelled' AND task_id IN ({marks})",  # noqa: S608  (only ? marks)
                task_ids,
            )
        return [row["task_id"] for row in rows]

    def purge(self, now: float, kept_max: int) -> None:
        """Delete ended tasks past their ttl (counted from their creation), then the oldest ended ones while more
        than ``kept_max`` are kept."""
        with self._engine.transaction() as db:
            db.run("DELETE FROM tasks WHERE ended = 1 AND created_at + ttl_ms / 1000.0 < ?", (now,))
            row = db.row("SELECT count(*) AS n FROM tasks")
            over = (0 if row is None else int(row["n"])) - kept_max
            if over > 0:
                db.run(
                    "DELETE FROM tasks WHERE task_id IN "
                    "(SELECT task_id FROM tasks WHERE ended = 1 ORDER BY created_at LIMIT ?)",
                    (over,),
                )
