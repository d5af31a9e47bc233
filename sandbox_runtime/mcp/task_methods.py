"""The server's task methods, for both generations of MCP tasks (see :mod:`~sandbox_runtime.mcp.tasks`).

A middleware sends each request to the handler of its generation: a 2025-11-25 ``tools/call`` with ``task``, and
a 2026-07-28 ``tools/call`` of a long tool from a client that declares the Tasks extension on that request, go
to internal methods (the SDK's ``tools/call`` result check would refuse a task); on the 2026-07-28 wire,
``tasks/get``, ``tasks/update`` and ``tasks/cancel`` go to their 2026 handlers, and the 2025-only
``tasks/result`` and ``tasks/list`` do not exist. A 2026 client that did not declare the extension on its
``tasks/*`` request gets -32021 (missing required client capability).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.methods import serialize_server_result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from sandbox_runtime.control import CallControl
from sandbox_runtime.mcp.tasks import TASKS_EXTENSION, TaskStore, TrackedTask

__all__ = ["TaskHost", "TaskMethods", "TaskWork", "declares_tasks_extension"]

logger = logging.getLogger(__name__)

_TASK_CALL = "sandbox-runtime/tools-call-as-task"  # 2025-11-25: a tools/call with `task`
_MAYBE_TASK_CALL = "sandbox-runtime/tools-call-may-become-task"  # 2026-07-28: the server decides
_MODERN_TASK_METHODS = {
    "tasks/get": "sandbox-runtime/tasks-get",
    "tasks/update": "sandbox-runtime/tasks-update",
    "tasks/cancel": "sandbox-runtime/tasks-cancel",
}
_HANDSHAKE_ONLY = frozenset({"tasks/result", "tasks/list"})


@dataclass(frozen=True)
class TaskWork:
    """A call ready to run as a task: its conversation, its control, and the work (it returns the result)."""

    conversation: str
    control: CallControl
    run: Callable[[], types.CallToolResult]


class TaskHost(Protocol):
    def task_conversation(self, ctx: ServerRequestContext[Any]) -> str:
        """The key of a request's conversation, its tenant's (raises :class:`MCPError` for a bad one)."""
        ...

    def may_be_task(self, tool: str) -> bool:
        """Whether ``tool`` is a known tool that may run as a task."""
        ...

    def task_work(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> TaskWork:
        """The call as a task's work (raises :class:`MCPError` when it cannot be one)."""
        ...


class _UpdateTaskParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any]


def declares_tasks_extension(meta: Mapping[str, Any] | None) -> bool:
    """Whether a 2026-07-28 request's ``_meta`` capabilities declare the Tasks extension."""
    capabilities = (meta or {}).get(types.CLIENT_CAPABILITIES_META_KEY)
    extensions = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
    return isinstance(extensions, Mapping) and isinstance(extensions.get(TASKS_EXTENSION), Mapping)


class TaskMethods:
    """Installs the task methods on ``server``; ``host`` runs the calls, ``store`` keeps the tasks."""

    def __init__(self, server: Server[Any], store: TaskStore, host: TaskHost, *, task_after_s: float) -> None:
        self._store = store
        self._host = host
        self._task_after_s = task_after_s
        server.middleware.append(self._route)
        server.add_request_handler(_TASK_CALL, types.CallToolRequestParams, self._start_task)
        server.add_request_handler("tasks/get", types.GetTaskRequestParams, self._get_task)
        server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, self._task_result)
        server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self._cancel_task)
        server.add_request_handler("tasks/list", types.PaginatedRequestParams, self._list_tasks)
        server.add_request_handler(_MAYBE_TASK_CALL, types.CallToolRequestParams, self._call_may_become_task)
        server.add_request_handler(_MODERN_TASK_METHODS["tasks/get"], types.GetTaskRequestParams, self._get)
        server.add_request_handler(_MODERN_TASK_METHODS["tasks/update"], _UpdateTaskParams, self._update)
        server.add_request_handler(_MODERN_TASK_METHODS["tasks/cancel"], types.CancelTaskRequestParams, self._cancel)

    async def _route(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            if ctx.method == "tools/call" and params.get("task") is not None:
                ctx = dataclasses.replace(ctx, method=_TASK_CALL)
            return await call_next(ctx)
        if ctx.method in _HANDSHAKE_ONLY:
            raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found", data=ctx.method)
        if ctx.method in _MODERN_TASK_METHODS:
            if not declares_tasks_extension(ctx.meta):
                raise MCPError(
                    code=types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                    message="Missing required client capability",
                    data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
                )
            ctx = dataclasses.replace(ctx, method=_MODERN_TASK_METHODS[ctx.method])
        elif (
            ctx.method == "tools/call"
            and declares_tasks_extension(ctx.meta)
            and self._host.may_be_task(str(params.get("name")))
        ):
            ctx = dataclasses.replace(ctx, method=_MAYBE_TASK_CALL)
        return await call_next(ctx)

    def _task_of(self, ctx: ServerRequestContext[Any], task_id: str) -> TrackedTask:
        return self._store.get(self._host.task_conversation(ctx), task_id)

    # ------------------------------------------------------------------------------------------ 2025-11-25
    async def _start_task(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CreateTaskResult:
        work = self._host.task_work(ctx, params)
        ttl = None if params.task is None else params.task.ttl
        task = self._store.start(work.conversation, ttl, work.control, work.run)
        logger.info("tools/call %s in %s runs as task %s", params.name, work.conversation, task.task_id)
        return types.CreateTaskResult(task=task.view())

    async def _get_task(self, ctx: ServerRequestContext[Any], params: types.GetTaskRequestParams) -> dict[str, Any]:
        return self._task_of(ctx, params.task_id).view().model_dump(by_alias=True, mode="json", exclude_none=True)

    async def _task_result(
        self, ctx: ServerRequestContext[Any], params: types.GetTaskPayloadRequestParams
    ) -> dict[str, Any]:
        task = self._task_of(ctx, params.task_id)
        await anyio.to_thread.run_sync(self._store.wait, task, abandon_on_cancel=True)
        return self._task_of(ctx, params.task_id).payload()

    async def _cancel_task(
        self, ctx: ServerRequestContext[Any], params: types.CancelTaskRequestParams
    ) -> dict[str, Any]:
        task = self._store.cancel(self._host.task_conversation(ctx), params.task_id)
        return task.view().model_dump(by_alias=True, mode="json", exclude_none=True)

    async def _list_tasks(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams
    ) -> types.ListTasksResult:
        listed = self._store.listed(self._host.task_conversation(ctx))
        return types.ListTasksResult(tasks=[task.view() for task in listed])

    # ------------------------------------------------------------------------------------------ 2026-07-28
    async def _call_may_become_task(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> dict[str, Any]:
        """Run the call; answer with its result if it ends within ``task_after_s``, else with the task."""
        work = self._host.task_work(ctx, params)
        task = self._store.start(work.conversation, None, work.control, work.run, announce=False)
        try:
            ended = await anyio.to_thread.run_sync(self._store.wait, task, self._task_after_s, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            work.control.cancel()  # the client went away before it heard of the task: nothing may keep running
            self._store.forget(task.task_id)
            raise
        if ended:
            self._store.forget(task.task_id)
            return serialize_server_result("tools/call", ctx.protocol_version, task.result or {})
        task = self._store.announce(task)
        logger.info("tools/call %s in %s became task %s", params.name, work.conversation, task.task_id)
        shown = task.detailed(ctx.protocol_version)
        shown.pop("result", None)  # it may have ended since: the client reads the result with tasks/get
        shown.pop("error", None)
        return {**shown, "resultType": "task"}

    async def _get(self, ctx: ServerRequestContext[Any], params: types.GetTaskRequestParams) -> dict[str, Any]:
        return {**self._task_of(ctx, params.task_id).detailed(ctx.protocol_version), "resultType": "complete"}

    async def _update(self, ctx: ServerRequestContext[Any], params: _UpdateTaskParams) -> dict[str, Any]:
        self._task_of(ctx, params.task_id)  # these tasks never ask for input: every response is for no request
        return {"resultType": "complete"}

    async def _cancel(self, ctx: ServerRequestContext[Any], params: types.CancelTaskRequestParams) -> dict[str, Any]:
        self._store.cancel(self._host.task_conversation(ctx), params.task_id, ended_ok=True)
        return {"resultType": "complete"}
