"""Tool calls as MCP tasks: a long call answers at once, and ends in the usual result.

Two generations of the same idea share one store:

- **2025-11-25** (the handshake era): a ``tools/call`` that carries ``task`` (for a tool listed with
  ``execution.taskSupport``) is answered with a ``CreateTaskResult`` right away; ``tasks/get`` gives the status
  (``working`` → ``completed`` | ``failed`` | ``cancelled``; ``failed`` when the result has ``isError``),
  ``tasks/result`` waits for the end and gives exactly the ``CallToolResult`` the same call would have answered
  without ``task`` (its ``_meta`` also names the task), ``tasks/cancel`` cancels it and ``tasks/list`` lists them.
- **2026-07-28** (the Tasks extension ``io.modelcontextprotocol/tasks``): the client declares the extension in
  a request's ``_meta`` capabilities and the server decides. A long tool's call that has not ended within
  ``mcp.task_after_s`` is answered with ``resultType: "task"``; ``tasks/get`` gives the whole task, the
  ``CallToolResult`` inlined once ``completed`` (a tool error is ``completed`` too, with ``isError``; ``failed``
  is for a protocol error only); ``tasks/update`` is acknowledged (these tasks never ask for input);
  ``tasks/cancel`` cancels the call. There is no ``tasks/result`` and no ``tasks/list`` in this generation.

**The rule.** A task belongs to the conversation its call ran in: every ``tasks/*`` request sees only the tasks
of its own conversation (the same one a ``tools/call`` would get: ``_meta`` or the server's default), and any
other id is "not found". A task is kept for its ttl (the one asked for, within ``mcp.task_ttl_max_s``;
``mcp.task_ttl_default_s`` when none) counted from its creation, and only once it ended; at most
``mcp.tasks_kept_max`` tasks are kept in all — the oldest ended ones go first, and a new task is refused while
that many are still running. Cancelling a task ends its call (a run ends every process it started). A task's
call is never asked for approval by elicitation (it has no request to ask on): the policy's
``approval.rule_without_approver`` decides.

**Replicas.** Tasks live in the state (:mod:`~sandbox_runtime.state.tasks`), so every replica sharing it answers
``tasks/*`` for a task another started: ``tasks/get`` reads it, ``tasks/result`` waits for it (looking again at
the state, at most every ``pollInterval``), ``tasks/cancel`` marks it cancelled and the replica running its call
cancels the call within :data:`CANCEL_LOOK_S`. A task whose replica died before its call ended is ``failed``
(its call lost) the next time it is asked for. A call that may become a task (2026-07-28) is written to the state
only once it does.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.methods import serialize_server_result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from sandbox_runtime.control import CallControl
from sandbox_runtime.policy import McpPolicy
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.state.tasks import TaskRecord

__all__ = ["META_RELATED_TASK", "TASKS_EXTENSION", "TaskServer", "TaskStore", "TrackedTask"]

META_RELATED_TASK = "io.modelcontextprotocol/related-task"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

_POLL_INTERVAL_MS = 500
CANCEL_LOOK_S = 0.5  # how often a runtime looks for cancels of its tasks asked of another replica
_CANCELLED = "Cancelled by the client."

_TERMINAL: frozenset[types.TaskStatus] = frozenset({"completed", "failed", "cancelled"})


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class TrackedTask:
    """One task as a client sees it: its status and, once it ended, its ``CallToolResult`` (JSON fields) or the
    protocol error that ended it."""

    task_id: str
    conversation: str
    ttl_ms: int
    lease_id: str  # the runtime running its call
    created: float  # when it was made (the clock of the runtime that made it)
    updated: float = 0.0
    status: types.TaskStatus = "working"
    status_message: str | None = None
    ended: bool = False
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # a JSON-RPC error object: the call failed as a protocol error

    def __post_init__(self) -> None:
        self.updated = self.updated or self.created

    @classmethod
    def of(cls, record: TaskRecord) -> TrackedTask:
        return cls(
            task_id=record.task_id,
            conversation=record.conversation_id,
            ttl_ms=record.ttl_ms,
            lease_id=record.lease_id,
            created=record.created_at,
            updated=record.updated_at,
            status=cast("types.TaskStatus", record.status),
            status_message=record.status_message,
            ended=record.ended,
            result=None if record.result is None else json.loads(record.result),
            error=None if record.error is None else json.loads(record.error),
        )

    def record(self) -> TaskRecord:
        return TaskRecord(
            task_id=self.task_id,
            conversation_id=self.conversation,
            lease_id=self.lease_id,
            ttl_ms=self.ttl_ms,
            created_at=self.created,
            updated_at=self.updated,
            status=self.status,
            status_message=self.status_message,
            ended=self.ended,
            result=None if self.result is None else _json(self.result),
            error=None if self.error is None else _json(self.error).decode(),
        )

    def view(self) -> types.Task:
        """The task as 2025-11-25 shows it."""
        return types.Task(
            task_id=self.task_id,
            status=self.status,
            status_message=self.status_message,
            created_at=_iso(self.created),
            last_updated_at=_iso(self.updated),
            ttl=self.ttl_ms,
            poll_interval=_POLL_INTERVAL_MS,
        )

    def payload(self) -> dict[str, Any]:
        """The call's result with ``_meta`` naming this task (only once it :attr:`ended`)."""
        result = self.result or {}
        meta = {**(result.get("_meta") or {}), META_RELATED_TASK: {"taskId": self.task_id}}
        return {**result, "_meta": meta}

    def detailed(self, protocol_version: str) -> dict[str, Any]:
        """The task as the Tasks extension shows it: a ``DetailedTask``, its result (shaped for the request's
        ``protocol_version``) or error inlined."""
        status = self.status
        if status == "failed" and self.error is None:
            status = "completed"  # a tool error is a result (isError), not a failed task, in this generation
        shown: dict[str, Any] = {
            "taskId": self.task_id,
            "status": status,
            "createdAt": _iso(self.created),
            "lastUpdatedAt": _iso(self.updated),
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": _POLL_INTERVAL_MS,
        }
        if self.status_message is not None:
            shown["statusMessage"] = self.status_message
        if status == "completed":
            shown["result"] = serialize_server_result("tools/call", protocol_version, self.result or {})
        elif status == "failed":
            shown["error"] = self.error
        return shown


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@dataclass
class _Running:
    """A task whose call runs in this process: its control, the moment it ends, and whether it was written to
    the state (a call that may become a task is written only once it does)."""

    task: TrackedTask
    control: CallControl
    stored: bool
    done: threading.Event = field(default_factory=threading.Event)


class TaskStore:
    """The tasks of the state every replica shares, as this server runs and answers for them (see the module
    text). Safe to use from any thread."""

    def __init__(
        self,
        policy: McpPolicy,
        state: StateDB,
        lease_id: str,
        run: Callable[[Callable[[], None]], object],
    ) -> None:
        self._run_in_pool = run  # the runtime's workers (``Workers.submit``)
        self._records = state.tasks
        self._leases = state.leases
        self._lease_id = lease_id
        self._kept_max = policy.tasks_kept_max
        self._ttl_default_ms = policy.task_ttl_default_s * 1000
        self._ttl_max_ms = policy.task_ttl_max_s * 1000
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}  # the tasks whose calls run here

    def start(
        self,
        conversation: str,
        ttl_ms: int | None,
        control: CallControl,
        work: Callable[[], types.CallToolResult],
        *,
        announce: bool = True,
    ) -> TrackedTask:
        """Run ``work`` in the runtime's pool as a new task of ``conversation``, and return the task; one not
        ``announce``d is written to the state only by :meth:`announce` (a call that may become a task)."""
        ttl = self._ttl_default_ms if ttl_ms is None else max(0, min(ttl_ms, self._ttl_max_ms))
        task = TrackedTask(
            task_id=uuid.uuid4().hex,
            conversation=conversation,
            ttl_ms=ttl,
            lease_id=self._lease_id,
            created=time.time(),
        )
        if len(self._records.running()) >= self._kept_max:
            self._lose_orphans()  # a dead runtime's never end by themselves
            if len(self._records.running()) >= self._kept_max:
                raise MCPError(
                    code=types.INTERNAL_ERROR, message=f"{self._kept_max} tasks are still running; try again later"
                )
        running = _Running(task, control, stored=announce)
        if announce:
            self._add(task)
        with self._lock:
            self._running[task.task_id] = running
        self._run_in_pool(lambda: self._run(running, work))
        return task

    def announce(self, task: TrackedTask) -> TrackedTask:
        """Write a task started unannounced to the state, as it is now (it may have ended meanwhile), and return
        it."""
        with self._lock:
            running = self._running.get(task.task_id)
            if running is None or not running.stored:
                self._add(task)
            if running is not None:
                running.stored = True
        return task

    def _add(self, task: TrackedTask) -> None:
        """Write a new task to the state, the expired and surplus ended ones going first (the table grows only
        here)."""
        self._records.purge(time.time(), self._kept_max)
        self._records.add(task.record())

    def _run(self, running: _Running, work: Callable[[], types.CallToolResult]) -> None:
        task = running.task
        failure: str | None = None
        try:
            result = work()
        except Exception as exc:  # the call's own failures are results already: this is a bug, said as one
            failure = f"The task's call failed: {type(exc).__name__}: {exc}"
            result = types.CallToolResult(content=[types.TextContent(text=failure)], is_error=True)
        with self._lock:
            task.result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            if failure is not None:
                task.error = {"code": types.INTERNAL_ERROR, "message": failure}
            if task.status not in _TERMINAL:
                task.status = "failed" if result.is_error else "completed"
                task.status_message = failure
            task.updated, task.ended = time.time(), True
            try:
                if running.stored:
                    self._records.end(
                        task.task_id,
                        task.status,
                        task.status_message,
                        _json(task.result),
                        None if task.error is None else _json(task.error).decode(),
                    )
            finally:
                running.done.set()
                self._running.pop(task.task_id, None)

    def get(self, conversation: str, task_id: str) -> TrackedTask:
        """The task as stored; one whose runtime is gone before its call ended is ``failed`` (its call lost)."""
        with self._lock:
            running = self._running.get(task_id)
            if running is not None and not running.stored:
                return running.task  # unannounced: only its own request knows it
        self._records.purge(time.time(), self._kept_max)
        record = self._records.get(task_id)
        if record is None or record.conversation_id != conversation:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Failed to retrieve task: Task not found: {task_id}")
        if not record.ended and record.lease_id != self._lease_id and not self._alive(record.lease_id):
            self._lose(record.task_id)
            record = self._records.get(task_id) or record
        return TrackedTask.of(record)

    def _lose_orphans(self) -> None:
        """End the tasks whose runtime is gone (they would count as running for ever)."""
        live = {lease.id for lease in self._leases.live()}
        orphans = [task_id for task_id, lease_id in self._records.running() if lease_id not in live]
        for task_id in orphans:
            self._lose(task_id)

    def _alive(self, lease_id: str) -> bool:
        return lease_id in {lease.id for lease in self._leases.live()}

    def _lose(self, task_id: str) -> None:
        """End a task whose runtime is gone: its call's outcome is unknown (a retry with the same call id runs it
        again unless its decision was stored)."""
        said = (
            "The task's call was lost: the runtime running it stopped before it ended. Call the tool again (with "
            "the same call id, its stored decision is given if it was made)."
        )
        result = types.CallToolResult(content=[types.TextContent(text=said)], is_error=True)
        dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        error = {"code": types.INTERNAL_ERROR, "message": said}
        self._records.end(task_id, "failed", said, _json(dumped), _json(error).decode())

    def wait(self, task: TrackedTask, timeout_s: float | None = None) -> bool:
        """Wait until the task's call ended (at most ``timeout_s``; None: as long as it runs); whether it did."""
        with self._lock:
            running = self._running.get(task.task_id)
            if task.ended:  # one of this runtime's, ended (``start`` returned the very object its run updates)
                return True
        if running is not None:
            return running.done.wait(timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = 0.05
        while not self.get(task.conversation, task.task_id).ended:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(pause)  # another runtime runs it: a bounded look again at the state
            pause = min(pause * 2, _POLL_INTERVAL_MS / 1000)
        return True

    def cancel(self, conversation: str, task_id: str, *, ended_ok: bool = False) -> TrackedTask:
        """Cancel the task's call (its run ends every process it started; a call another runtime runs is
        cancelled by that runtime, which looks every :data:`CANCEL_LOOK_S`); the task is ``cancelled`` at once.
        A task that already ended is refused, unless ``ended_ok`` (then it stays as it ended)."""
        task = self.get(conversation, task_id)
        if task.status not in _TERMINAL:
            with self._lock:
                running = self._running.get(task_id)
                if running is not None and not running.stored:
                    running.task.status, running.task.status_message = "cancelled", _CANCELLED
                    running.task.updated = time.time()
            if running is None or running.stored:
                self._records.cancel(task_id, _CANCELLED)
            if running is not None:
                running.control.cancel()
            task = self.get(conversation, task_id)
            if task.status == "cancelled":
                return task
        if ended_ok:
            return task
        raise MCPError(
            code=types.INVALID_PARAMS, message=f"Cannot cancel task: already in terminal status {task.status}"
        )

    def look_for_cancels(self) -> None:
        """Cancel the calls of this runtime's tasks that another runtime was asked to cancel (a background job,
        every :data:`CANCEL_LOOK_S`)."""
        with self._lock:
            stored = {task_id: r for task_id, r in self._running.items() if r.stored}
        for task_id in self._records.cancelled(list(stored)):
            stored[task_id].control.cancel()

    def forget(self, task_id: str) -> None:
        """Drop a task its client was never told of (its call was answered with the result itself)."""
        with self._lock:
            self._running.pop(task_id, None)  # never announced: nothing of it is in the state

    def listed(self, conversation: str) -> list[TrackedTask]:
        return [self.get(conversation, record.task_id) for record in self._records.of_conversation(conversation)]


class TaskServer(Server[Any]):
    """The SDK's low-level server, advertising tasks: the 2025-11-25 ``tasks`` capability (``tasks/list``,
    ``tasks/cancel``, task-augmented ``tools/call``) to the handshake era, the Tasks extension to 2026-07-28."""

    def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(*args, **kwargs)
        if kwargs.get("protocol_version") in MODERN_PROTOCOL_VERSIONS:
            extensions = {**(capabilities.extensions or {}), TASKS_EXTENSION: {}}
            return capabilities.model_copy(update={"extensions": extensions})
        tasks = types.ServerTasksCapability(
            list=types.TasksListCapability(),
            cancel=types.TasksCancelCapability(),
            requests=types.ServerTasksRequestsCapability(
                tools=types.TasksToolsCapability(call=types.TasksCallCapability())
            ),
        )
        return capabilities.model_copy(update={"tasks": tasks})
