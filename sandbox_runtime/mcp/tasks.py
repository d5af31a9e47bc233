"""Tool calls as MCP tasks (protocol 2025-11-25): a long call answers at once, and ends in the usual result.

A ``tools/call`` that carries ``task`` (for a tool listed with ``execution.taskSupport``) runs in a worker
thread of its own; the request is answered with a ``CreateTaskResult`` right away. ``tasks/get`` gives the
status (``working`` → ``completed`` | ``failed`` | ``cancelled``; ``failed`` when the result has
``isError``), ``tasks/result`` waits for the end and gives exactly the ``CallToolResult`` the same call would
have answered without ``task`` (its ``_meta`` also names the task), ``tasks/cancel`` cancels the call (a run
ends every process it started) and ``tasks/list`` lists the tasks.

**The rule.** A task belongs to the conversation its call ran in: every ``tasks/*`` request sees only the tasks
of its own conversation (the same one a ``tools/call`` would get: ``_meta`` or the server's default), and any
other id is "not found". A task is kept for its ``ttl`` (the one asked for, within
:data:`_TASK_TTL_MAX_MS`; :data:`_TASK_TTL_DEFAULT_MS` when none) counted from its creation, and only once it
ended; at most :data:`_TASKS_KEPT_MAX` tasks are kept in all — the oldest ended ones go first, and a new task
is refused while that many are still running. A task's call is never asked for approval by elicitation (it
has no request to ask on): the policy's ``approval.rule_without_approver`` decides.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from sandbox_runtime.control import CallControl

__all__ = ["META_RELATED_TASK", "TaskServer", "TaskStore", "TrackedTask"]

META_RELATED_TASK = "io.modelcontextprotocol/related-task"

_TASKS_KEPT_MAX = 256
_TASK_TTL_DEFAULT_MS = 3_600_000
_TASK_TTL_MAX_MS = 86_400_000
_POLL_INTERVAL_MS = 500

_TERMINAL: frozenset[types.TaskStatus] = frozenset({"completed", "failed", "cancelled"})


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class TrackedTask:
    """One task: its call's control, its status and, once it ended, its ``CallToolResult`` (JSON fields)."""

    task_id: str
    conversation: str
    ttl_ms: int
    control: CallControl
    created_at: str = field(default_factory=_now_iso)
    created_s: float = field(default_factory=time.monotonic)
    status: types.TaskStatus = "working"
    status_message: str | None = None
    last_updated_at: str = ""
    result: dict[str, Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.last_updated_at = self.created_at

    def view(self) -> types.Task:
        return types.Task(
            task_id=self.task_id,
            status=self.status,
            status_message=self.status_message,
            created_at=self.created_at,
            last_updated_at=self.last_updated_at,
            ttl=self.ttl_ms,
            poll_interval=_POLL_INTERVAL_MS,
        )

    def payload(self) -> dict[str, Any]:
        """The call's result with ``_meta`` naming this task (only once :attr:`done` is set)."""
        result = self.result or {}
        meta = {**(result.get("_meta") or {}), META_RELATED_TASK: {"taskId": self.task_id}}
        return {**result, "_meta": meta}


class TaskStore:
    """The tasks of one server, by conversation (see the module text). Safe to use from any thread."""

    def __init__(self, kept_max: int = _TASKS_KEPT_MAX) -> None:
        self._kept_max = kept_max
        self._lock = threading.Lock()
        self._tasks: dict[str, TrackedTask] = {}  # in creation order

    def start(
        self,
        conversation: str,
        ttl_ms: int | None,
        control: CallControl,
        work: Callable[[], types.CallToolResult],
    ) -> TrackedTask:
        """Run ``work`` in a thread of its own as a new task of ``conversation``, and return the task."""
        ttl = _TASK_TTL_DEFAULT_MS if ttl_ms is None else max(0, min(ttl_ms, _TASK_TTL_MAX_MS))
        task = TrackedTask(task_id=uuid.uuid4().hex, conversation=conversation, ttl_ms=ttl, control=control)
        with self._lock:
            self._purge()
            if len(self._tasks) >= self._kept_max:
                raise MCPError(
                    code=types.INTERNAL_ERROR, message=f"{self._kept_max} tasks are still running; try again later"
                )
            self._tasks[task.task_id] = task
        threading.Thread(target=self._run, args=(task, work), name=f"task-{task.task_id}", daemon=True).start()
        return task

    def _run(self, task: TrackedTask, work: Callable[[], types.CallToolResult]) -> None:
        try:
            result = work()
        except Exception as exc:  # the call's own failures are results already: this is a bug, said as a result
            text = f"The task's call failed: {type(exc).__name__}: {exc}"
            result = types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
        with self._lock:
            task.result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            if task.status not in _TERMINAL:
                task.status = "failed" if result.is_error else "completed"
                task.last_updated_at = _now_iso()
            task.done.set()

    def get(self, conversation: str, task_id: str) -> TrackedTask:
        with self._lock:
            self._purge()
            task = self._tasks.get(task_id)
        if task is None or task.conversation != conversation:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Failed to retrieve task: Task not found: {task_id}")
        return task

    def cancel(self, conversation: str, task_id: str) -> TrackedTask:
        """Cancel the task's call (its run ends every process it started); the task is ``cancelled`` at once."""
        task = self.get(conversation, task_id)
        with self._lock:
            if task.status in _TERMINAL:
                raise MCPError(
                    code=types.INVALID_PARAMS, message=f"Cannot cancel task: already in terminal status {task.status}"
                )
            task.status = "cancelled"
            task.status_message = "Cancelled by the client."
            task.last_updated_at = _now_iso()
        task.control.cancel()
        return task

    def listed(self, conversation: str) -> list[TrackedTask]:
        with self._lock:
            self._purge()
            return [t for t in self._tasks.values() if t.conversation == conversation]

    def _purge(self) -> None:
        """Drop ended tasks past their ttl, then the oldest ended ones over the bound (the lock is held)."""
        now = time.monotonic()
        ended = [t for t in self._tasks.values() if t.done.is_set()]
        for task in ended:
            if now - task.created_s > task.ttl_ms / 1000:
                del self._tasks[task.task_id]
        for task in ended:
            if len(self._tasks) < self._kept_max:
                break
            self._tasks.pop(task.task_id, None)


class TaskServer(Server[Any]):
    """The SDK's low-level server, with the tasks capability (``tasks/list``, ``tasks/cancel``, task-augmented
    ``tools/call``) in what it advertises."""

    def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(*args, **kwargs)
        tasks = types.ServerTasksCapability(
            list=types.TasksListCapability(),
            cancel=types.TasksCancelCapability(),
            requests=types.ServerTasksRequestsCapability(
                tools=types.TasksToolsCapability(call=types.TasksCallCapability())
            ),
        )
        return capabilities.model_copy(update={"tasks": tasks})
