"""The MCP server: the runtime's tools (and a gateway's upstream tools) over stdio or streamable HTTP.

Built on the official SDK's low-level server. Every ``tools/call`` goes through the one dispatch pipeline (spill,
turn budget, stored decision), in a worker thread; what the answer carries is :mod:`~sandbox_runtime.mcp.results`.

**Which conversation a call belongs to** — a conversation outlives MCP sessions, so that paths a model was given
stay valid whatever the client does with sessions:

1. ``_meta["sandbox-runtime/conversation"]`` names it, when the request carries it;
2. else the server's default: ``serve --conversation NAME`` when given; over stdio one conversation per *client
   process* (the server's parent process: a client that starts a new server process for every call, as
   LangChain's adapter does by default, keeps one conversation); over HTTP one per bearer token, or one per
   server when it has no token — across sessions, reconnects and stateless (2026-07-28) requests alike.

Whichever it is, the conversation is the **request's tenant's** (:mod:`~sandbox_runtime.tenancy`): an OAuth access
token's tenant claim (:mod:`~sandbox_runtime.mcp.auth`), else the default tenant. The id is scoped to it on every
method — ``tools/call``, ``resources/read`` and ``list``, ``tasks/*`` — so another tenant's conversation, file,
attachment or task is never found. Every result's ``_meta["sandbox-runtime/quota"]`` says what the tenant uses of
its share and may use, and how long the call waited for its turn (:mod:`~sandbox_runtime.pipeline.admission`).

Other ``_meta`` keys a request may carry: ``sandbox-runtime/turn`` — the turn the call belongs to (the per-turn
budget is shared by its calls; without it, calls of a conversation that overlap in time form a turn, see
:mod:`~sandbox_runtime.pipeline.turns`); ``sandbox-runtime/call-id`` — the model's own tool-call id: the decision is
stored under it, so the host can rebuild its history byte for byte, and the same id is never run twice.

**Tasks**: a long tool (``execution.taskSupport`` in ``tools/list``) may be called as a task (2025-11-25), or
becomes one when the client declares the Tasks extension and the call outlasts ``mcp.task_after_s``
(2026-07-28); see :mod:`~sandbox_runtime.mcp.tasks`.

**Cancel and progress.** A cancelled request (``notifications/cancelled``, or a stateless HTTP request whose
connection went away) cancels the call: a run ends every process it started and is recorded ``cancelled``. With a
``progressToken``, a long call sends ``notifications/progress`` (a run: seconds elapsed of its time limit, and
its output so far; a gateway call: the upstream's own progress).

Tool failures are results with ``isError: true``; an unknown tool is a protocol error (invalid params). When the
policy says ``ask``, the server asks the client's user by elicitation (a form with one yes/no field) showing the
expanded arguments; a client that cannot be asked gets ``approval.rule_without_approver``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Mapping
from typing import Any, Literal

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.control import CallControl, ProgressReport
from sandbox_runtime.errors import (
    AdmissionRefused,
    InvalidConversationId,
    InvalidTenant,
    InvalidToolArguments,
    SandboxRuntimeError,
)
from sandbox_runtime.mcp.auth import tenant_of
from sandbox_runtime.mcp.client_process import ClientProcess
from sandbox_runtime.mcp.resources import SCHEME, mime_type, read_resource, result_uri
from sandbox_runtime.mcp.results import (
    META_CALL_ID,
    META_CONVERSATION,
    META_QUOTA,
    META_TURN,
    ToolResult,
    call_result,
    tool_listing,
)
from sandbox_runtime.mcp.shutdown import STOPPING_CODE, STOPPING_MESSAGE, CallsInFlight
from sandbox_runtime.mcp.task_methods import TaskMethods, TaskWork
from sandbox_runtime.mcp.tasks import CANCEL_LOOK_S, TaskServer, TaskStore
from sandbox_runtime.pipeline.admission import TenantQuota
from sandbox_runtime.pipeline.approval import ApprovalRequest, Approver
from sandbox_runtime.pipeline.dispatch import ToolCall
from sandbox_runtime.pipeline.turns import TurnGate
from sandbox_runtime.policy import Policy
from sandbox_runtime.tenancy import DEFAULT_TENANT, conversation_key, key_id, validate_conversation_id

__all__ = ["META_CALL_ID", "META_CONVERSATION", "META_TURN", "McpService", "default_conversation"]

logger = logging.getLogger(__name__)

_TURN_WAIT_S = 3600.0  # a finished call waits at most this long for the other calls of its turn
_RESOURCES_LISTED_MAX = 500


def instructions(policy: Policy) -> str:
    """What the server tells the model of its tools as a whole, with the policy's spill threshold and results
    folder."""
    return (
        f"Tools of sandbox-runtime. Any result over {policy.spill.threshold_chars:,} characters is saved to a file in "
        f"{policy.sandbox.results_mount_path} and you get its path, size, and for tables the row count and column "
        "names. Work with paths, not copied data: export a result with export_table(source=<path>), draw it with "
        "render_table, read it in a run_python script, attach a file for the user with attach_file. To filter or "
        "aggregate query results, change the query (sql_query) rather than reading rows. To send a large value to a "
        "tool, write it to a file (write_file or a script), then call delegate_call(tool, args_file=<path>) — two "
        "steps, the value is never retyped."
    )


Transport = Literal["stdio", "http"]


class McpService:
    """One runtime served over MCP: its tools, its results as resources, approvals by elicitation."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        transport: Transport,
        name: str = "sandbox-runtime",
        conversation: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.runtime = runtime
        self.transport = transport
        env = os.environ if environ is None else environ
        token = env.get(runtime.policy.mcp.token_variable) or None
        # the conversation of every request that names none (see the module text)
        self.default_conversation = validate_conversation_id(conversation or default_conversation(transport, token))
        self.gate = TurnGate(runtime.dispatcher, wait_s=_TURN_WAIT_S)
        self.tasks = TaskStore(runtime.policy.mcp, runtime.state, runtime.manager.lease.id, runtime.workers.submit)
        runtime.workers.every(CANCEL_LOOK_S, "task-cancels", self.tasks.look_for_cancels)
        self.calls = CallsInFlight()  # what a stop waits for, then cancels (see mcp.shutdown)
        self.server: Server[Any] = TaskServer(
            name,
            version=_version(),
            instructions=instructions(runtime.policy),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
        )
        TaskMethods(self.server, self.tasks, self, task_after_s=runtime.policy.mcp.task_after_s)

    # ------------------------------------------------------------------------------------------ tools
    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [types.Tool.model_validate(tool_listing(spec)) for spec in self.runtime.tools.values()]
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        self._known_tool(params.name)
        self._taking_calls()
        meta = dict(ctx.meta or {})
        try:
            conversation = self.conversation_of(meta, tenant_of(ctx))
        except (InvalidToolArguments, InvalidConversationId, InvalidTenant) as exc:  # the model reads why
            return _error_result(f"{type(exc).__name__}: {exc}")
        control = CallControl(progress=_progress_sender(ctx))
        run = functools.partial(self._execute, conversation, params, meta, control, self._approver(ctx))
        try:
            return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            control.cancel()  # the worker ends the run's processes and records it as cancelled
            logger.info("tools/call %s in %s was cancelled by the client", params.name, conversation)
            raise

    def _taking_calls(self) -> None:
        if self.calls.stopping:
            raise MCPError(code=STOPPING_CODE, message=STOPPING_MESSAGE)

    def _known_tool(self, name: str) -> None:
        if name not in self.runtime.tools:
            known = ", ".join(self.runtime.tools)
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {name}; the tools are: {known}")

    def _execute(
        self,
        conversation: str,
        params: types.CallToolRequestParams,
        meta: dict[str, Any],
        control: CallControl,
        approver: Approver | None,
    ) -> types.CallToolResult:
        """One call through the dispatch pipeline, in a worker thread: the ``CallToolResult`` it answers. While it
        runs it is in flight (a stop waits for it, then cancels it)."""
        with self.calls.running(control):
            try:
                call_id = meta.get(META_CALL_ID)
                turn = meta.get(META_TURN)
                item = ToolCall(
                    tool=params.name,
                    arguments=dict(params.arguments or {}),
                    call_id=None if call_id is None else str(call_id),
                )
                outcome, report = self.gate.run(
                    conversation,
                    item,
                    turn_id=None if turn is None else str(turn),
                    approver=approver,
                    control=control,
                )
            except (
                InvalidToolArguments,
                InvalidConversationId,
            ) as exc:  # the request's own values: the model reads why
                return _error_result(f"{type(exc).__name__}: {exc}")
            except AdmissionRefused as exc:  # over its tenant's share: the caller may retry later
                logger.info("tools/call %s in %s refused: %s", params.name, conversation, exc)
                refused = _error_result(f"The runtime could not run {params.name}: {type(exc).__name__}: {exc}")
                quota = self._quota(conversation, exc.waited_s).model_dump() | {"retry_after_s": exc.retry_after_s}
                return refused.model_copy(update={"meta": {META_QUOTA: quota}})
            except SandboxRuntimeError as exc:
                logger.warning("tools/call %s failed in the runtime: %s", params.name, exc)
                return _error_result(f"The runtime could not run {params.name}: {type(exc).__name__}: {exc}")
            mount = self.runtime.policy.sandbox.results_mount_path
            answer = call_result(outcome, key_id(conversation), mount, turn_id=report.turn_id)
            answer["_meta"][META_QUOTA] = self._quota(conversation, outcome.queued_s).model_dump()
            return types.CallToolResult.model_validate(answer)

    def _quota(self, conversation: str, waited_s: float = 0.0) -> TenantQuota:
        """What the conversation's tenant uses of its share now, and may use."""
        return self.runtime.quota(self.runtime.state.tenants.of_key(conversation), waited_s=waited_s)

    # ------------------------------------------------------------------------------------------ tasks
    def may_be_task(self, tool: str) -> bool:
        spec = self.runtime.tools.get(tool)
        return spec is not None and spec.long_running

    def task_work(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> TaskWork:
        self._known_tool(params.name)
        self._taking_calls()
        if not self.may_be_task(params.name):
            raise MCPError(code=types.METHOD_NOT_FOUND, message=f"{params.name} cannot be called as a task")
        meta = dict(ctx.meta or {})
        conversation = self.task_conversation(ctx)
        control = CallControl()  # no progress and no elicitation: the request is answered at once
        run = functools.partial(self._execute, conversation, params, meta, control, None)
        return TaskWork(conversation, control, run)

    def conversation_of(self, meta: dict[str, Any], tenant: str = DEFAULT_TENANT) -> str:
        """The key of the conversation a request of ``tenant`` belongs to (see the module text): the id it names,
        scoped to its tenant (:mod:`~sandbox_runtime.tenancy`)."""
        named = meta.get(META_CONVERSATION)
        if tenant != DEFAULT_TENANT:
            self.runtime.state.tenants.register(tenant)
        return conversation_key(tenant, self.default_conversation if named is None else named)

    def task_conversation(self, ctx: ServerRequestContext[Any]) -> str:
        """The conversation of a task request: a bad name is invalid params (there is no model to tell)."""
        try:
            return self.conversation_of(dict(ctx.meta or {}), tenant_of(ctx))
        except (InvalidToolArguments, InvalidConversationId, InvalidTenant) as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=f"{type(exc).__name__}: {exc}") from exc

    def _approver(self, ctx: ServerRequestContext[Any]) -> Approver | None:
        capabilities = ctx.session.client_capabilities
        if capabilities is None or capabilities.elicitation is None:
            return None  # the policy's rule_without_approver decides
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None  # the 2026-07-28 protocol has no server-to-client requests
        fallback = self.runtime.policy.approval.rule_without_approver

        def ask(request: ApprovalRequest) -> bool | str:
            elicit = functools.partial(
                ctx.session.elicit_form, related_request_id=ctx.request_id
            )  # the question travels on this call's own stream (needed over HTTP)
            try:
                answer = anyio.from_thread.run(elicit, _approval_message(request), _APPROVAL_SCHEMA)
            except MCPError as exc:
                logger.info("elicitation failed (%s); approval.rule_without_approver = %s", exc, fallback)
                return True if fallback == "allow" else f"the client could not be asked for approval ({exc})"
            if answer.action == "accept" and (answer.content or {}).get("approve") is True:
                return True
            if answer.action == "cancel":
                return "the user cancelled the approval"
            return "the user declined the call"

        return ask

    # ------------------------------------------------------------------------------------------ resources
    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        try:
            conversation = self.conversation_of(dict(ctx.meta or {}), tenant_of(ctx))
        except (InvalidToolArguments, InvalidConversationId, InvalidTenant):
            return types.ListResourcesResult(resources=[])
        return types.ListResourcesResult(resources=await anyio.to_thread.run_sync(self._resources, conversation))

    def _resources(self, conversation: str) -> list[types.Resource]:
        """The files a conversation (by its key) saved, newest first."""
        if self.runtime.state.conversation(conversation) is None:
            return []
        mount = self.runtime.policy.sandbox.results_mount_path
        saved = self.runtime.conversation_by_key(conversation).spills()[-_RESOURCES_LISTED_MAX:]
        return [
            types.Resource(
                uri=result_uri(key_id(conversation), s.descriptor.path, mount),
                name=s.descriptor.path.rsplit("/", 1)[-1],
                mime_type=mime_type(s.descriptor.path, s.descriptor.format),
                size=s.descriptor.bytes,
                description=f"{s.tool} result of call {s.call_id}",
            )
            for s in reversed(saved)
        ]

    async def _list_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        templates = [
            types.ResourceTemplate(
                uri_template=f"{SCHEME}://conversations/{{conversation}}/results/{{+path}}",
                name="results-file",
                description="A file of a conversation's results folder (path relative to "
                f"{self.runtime.policy.sandbox.results_mount_path}).",
            ),
            types.ResourceTemplate(
                uri_template=f"{SCHEME}://conversations/{{conversation}}/attachments/{{attachment_id}}",
                name="attachment",
                description="A file attach_file gave the user.",
            ),
        ]
        return types.ListResourceTemplatesResult(resource_templates=templates)

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        try:
            found = await anyio.to_thread.run_sync(read_resource, self.runtime, uri, tenant_of(ctx))
        except (SandboxRuntimeError, OSError) as exc:
            raise MCPError(
                code=types.INVALID_PARAMS, message=f"{type(exc).__name__}: {exc}", data={"uri": uri}
            ) from exc
        return types.ReadResourceResult.model_validate({"contents": [found.contents()]})


_APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Run this call?", "description": "Yes runs it exactly as shown."}
    },
    "required": ["approve"],
}


def _approval_message(request: ApprovalRequest) -> str:
    shown = request.arguments_json
    from_file = request.source is not None and request.via != "run_python"  # a script's call: its source is code
    if not request.complete:
        shown += (
            f"\n… (cut: {request.arguments_chars:,} characters in all; the whole is in {request.source})"
            if from_file
            else f"\n… (cut: {request.arguments_chars:,} characters in all)"
        )
    through = f" (through {request.via})" if request.via else ""
    if request.via == "run_python" and request.source:
        through = f" (made by the script {request.source})"
    return f"Approve a call of {request.tool}{through}? {request.summary}\nArguments that will be sent:\n{shown}"


def default_conversation(transport: Transport, token: str | None) -> str:
    """The conversation of requests that name none: per client process over stdio, per token (or per server
    without one) over HTTP. Stable for as long as its owner lives, and the same string every time."""
    if transport == "http":
        return "mcp-http" if token is None else f"mcp-http-{hashlib.sha256(token.encode()).hexdigest()[:16]}"
    client = ClientProcess.parent()  # a pid with its boot and start time: a reused pid is another client
    identity = f"{client.pid}:{client.start or ''}"
    return f"mcp-stdio-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def _progress_sender(ctx: ServerRequestContext[Any]) -> ProgressReport:
    """A callback any thread may call with (progress, total, message): it reaches the client as
    ``notifications/progress`` for this request's token (nothing is sent when the request carries none)."""
    token = anyio.lowlevel.current_token()

    def send(progress: float, total: float | None, message: str | None) -> None:
        anyio.from_thread.run(ctx.session.report_progress, progress, total, message, token=token)

    return send


def _error_result(text: str) -> types.CallToolResult:
    structured = ToolResult(text=text, is_error=True).model_dump(mode="json")
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=structured, is_error=True)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415  (read once, at start)

    try:
        return version("sandbox-runtime")
    except PackageNotFoundError:
        return "0"
