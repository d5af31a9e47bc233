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
from mcp_types.methods import serialize_server_result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from sandbox_runtime.control import CallControl
from sandbox_runtime.policy import McpPolicy

__all__ = ["META_RELATED_TASK", "TASKS_EXTENSION", "TaskServer", "TaskStore", "TrackedTask"]

META_RELATED_TASK = "io.modelcontextprotocol/related-task"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

_POLL_INTERVAL_MS = 500

_TERMINAL: frozenset[types.TaskStatus] = frozenset({"completed", "failed", "cancelled"})


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class TrackedTask:
    """One task: its call's control, its status and, once it ended, its ``CallToolResult`` (JSON fields) or the
    protocol error that ended it."""

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
    error: dict[str, Any] | None = None  # a JSON-RPC error object: the call failed as a protocol error
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.last_updated_at = self.created_at

    def view(self) -> types.Task:
        """The task as 2025-11-25 shows it."""
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

    def detailed(self, protocol_version: str) -> dict[str, Any]:
        """The task as the Tasks extension shows it: a ``DetailedTask``, its result (shaped for the request's
        ``protocol_version``) or error inlined."""
        status = self.status
        if status == "failed" and self.error is None:
            status = "completed"  # a tool error is a result (isError), not a failed task, in this generation
        shown: dict[str, Any] = {
            "taskId": self.task_id,
            "status": status,
            "createdAt": self.created_at,
            "lastUpdatedAt": self.last_updated_at,
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


class TaskStore:
    """The tasks of one server, by conversation (see the module text). Safe to use from any thread."""

    def __init__(self, policy: McpPolicy, run: Callable[[Callable[[], None]], object]) -> None:
        self._run_in_pool = run  # the runtime's workers (``Workers.submit``)
        self._kept_max = policy.tasks_kept_max
        self._ttl_default_ms = policy.task_ttl_default_s * 1000
        self._ttl_max_ms = policy.task_ttl_max_s * 1000
        self._lock = threading.Lock()
        self._tasks: dict[str, TrackedTask] = {}  # in creation order

    def start(
        self,
        conversation: str,
        ttl_ms: int | None,
        control: CallControl,
        work: Callable[[], types.CallToolResult],
    ) -> TrackedTask:
        """Run ``work`` in the runtime's pool as a new task of ``conversation``, and return the task."""
        ttl = self._ttl_default_ms if ttl_ms is None else max(0, min(ttl_ms, self._ttl_max_ms))
        task = TrackedTask(task_id=uuid.uuid4().hex, conversation=conversation, ttl_ms=ttl, control=control)
        with self._lock:
            self._purge()
            if len(self._tasks) >= self._kept_max:
                raise MCPError(
                    code=types.INTERNAL_ERROR, message=f"{self._kept_max} tasks are still running; try again later"
                )
            self._tasks[task.task_id] = task
        self._run_in_pool(lambda: self._run(task, work))
        return task

    def _run(self, task: TrackedTask, work: Callable[[], types.CallToolResult]) -> None:
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
                task.last_updated_at = _now_iso()
            task.done.set()

    def get(self, conversation: str, task_id: str) -> TrackedTask:
        with self._lock:
            self._purge()
            task = self._tasks.get(task_id)
        if task is None or task.conversation != conversation:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Failed to retrieve task: Task not found: {task_id}")
        return task

    def cancel(self, conversation: str, task_id: str, *, ended_ok: bool = False) -> TrackedTask:
        """Cancel the task's call (its run ends every process it started); the task is ``cancelled`` at once.
        A task that already ended is refused, unless ``ended_ok`` (then it stays as it ended)."""
        task = self.get(conversation, task_id)
        with self._lock:
            if task.status in _TERMINAL:
                if ended_ok:
                    return task
                raise MCPError(
                    code=types.INVALID_PARAMS, message=f"Cannot cancel task: already in terminal status {task.status}"
                )
            task.status = "cancelled"
            task.status_message = "Cancelled by the client."
            task.last_updated_at = _now_iso()
        task.control.cancel()
        return task

    def forget(self, task_id: str) -> None:
        """Drop a task its client was never told of (its call was answered with the result itself)."""
        with self._lock:
            self._tasks.pop(task_id, None)

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
