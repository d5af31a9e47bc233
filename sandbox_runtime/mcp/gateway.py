"""The gateway: upstream MCP servers whose tools are re-exposed as ``<upstream>__<tool>`` through the pipeline.

Each upstream (a stdio command or a streamable HTTP URL, from ``[mcp.upstreams.<name>]`` or the command line) is
kept connected by a supervisor task on the gateway's own event loop thread, so calls work from any thread of
the runtime. Its tools are registered as host tools of the runtime, with their title, annotations and output
schema (the Python SDK's ``{"result": ...}`` wrapper schema is not one of their own and is left out). Every
result goes through the spill as its content blocks say — the SDK's wrapper unwrapped, an upstream's own
``structuredContent`` kept as the value (tables recognised) — with images, audio and embedded resources saved
as files in the results folder and linked (:mod:`~sandbox_runtime.mcp.upstream_results`); an upstream
``isError`` stays an error with its full text saved, and ``delegate_call`` can target them like any tool.

A call's progress reports reach the caller's :class:`~sandbox_runtime.control.CallControl` in order; a call the
caller cancels is cancelled upstream too (the SDK sends ``notifications/cancelled``) and is a tool error saying so.

An upstream that dies is noticed at the next call: that call is a tool error saying so, and the upstream is
started again. A call without an answer within ``mcp.upstream_call_timeout_s`` is a tool error too, and the
upstream is restarted (a hung server is not trusted again). An HTTP upstream whose ``token_variable`` is unset
or empty is not started (no request goes out without its token); it is down with an error naming the variable.
The gateway itself keeps serving throughout.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import httpx2
import mcp_types as types
from anyio.from_thread import BlockingPortal
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from opentelemetry import context as otel_context

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import UpstreamError
from sandbox_runtime.mcp.upstream_results import own_output_schema, save_blocks
from sandbox_runtime.policy import McpPolicy, UpstreamServer
from sandbox_runtime.telemetry.metrics import Metric, RuntimeMetrics, gauge
from sandbox_runtime.telemetry.tracing import ATTR_TOOL, span
from sandbox_runtime.tools.host import HostCall

__all__ = ["Gateway", "UpstreamStatus"]

logger = logging.getLogger(__name__)

SEPARATOR = "__"
_RESTART_BACKOFF_MAX_S = 30.0
_CANCEL_POLL_S = 0.05  # how soon a caller's cancel reaches the upstream call
_PROGRESS_DRAIN_S = 5.0  # the longest an answer waits while the reports that came before it are passed on
_Progress = tuple[float, float | None, str | None]


@dataclass
class UpstreamStatus:
    """What ``serve`` reports about one upstream."""

    name: str
    running: bool
    tools: list[str]
    error: str | None
    starts: int


@dataclass
class _Upstream:
    name: str
    config: UpstreamServer
    start_timeout_s: float
    call_timeout_s: float
    session: ClientSession | None = None
    tools: list[types.Tool] = field(default_factory=list)
    error: str | None = None
    starts: int = 0
    stopping: bool = False
    _settled: anyio.Event | None = None  # set once the latest start is up or failed; fresh after a session
    _tried: anyio.Event | None = None  # set after each start attempt
    _wake: anyio.Event | None = None  # cuts a restart's back-off short
    _restart: anyio.Event | None = None  # ends the current session

    @asynccontextmanager
    async def _connect(self) -> AsyncIterator[ClientSession]:
        async with AsyncExitStack() as stack:
            if self.config.command is not None:
                params = StdioServerParameters(
                    command=self.config.command[0], args=self.config.command[1:], env=dict(self.config.env) or None
                )
                streams = await stack.enter_async_context(stdio_client(params))
            else:
                assert self.config.url is not None  # noqa: S101  (the policy allows exactly one)
                headers = {}
                if self.config.token_variable:
                    token = os.environ.get(self.config.token_variable, "")
                    if not token:  # never a request with an empty token: the upstream stays down, saying why
                        raise UpstreamError(
                            f"the token variable {self.config.token_variable} (mcp.upstreams.{self.name}."
                            "token_variable) is not set or empty: the upstream is not started without its token"
                        )
                    headers["Authorization"] = f"Bearer {token}"
                timeout = httpx2.Timeout(30.0, read=self.call_timeout_s + 30.0)  # a call's answer may take long
                client = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=timeout))
                streams = await stack.enter_async_context(streamable_http_client(self.config.url, http_client=client))
            session = await stack.enter_async_context(ClientSession(*streams))
            yield session

    async def supervise(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._settled, self._tried, self._wake = anyio.Event(), anyio.Event(), anyio.Event()
        task_status.started()
        failures = 0
        while not self.stopping:
            self._restart = anyio.Event()
            self.starts += 1
            up = False
            try:
                async with self._connect() as session:
                    with anyio.fail_after(self.start_timeout_s):
                        await session.initialize()
                        listed = await session.list_tools()
                    self.session, self.tools, self.error, failures = session, list(listed.tools), None, 0
                    up = True
                    self._settled.set()
                    self._tried.set()
                    logger.info("upstream %s is up with %d tools", self.name, len(self.tools))
                    await self._restart.wait()
            except Exception as exc:  # a failed start or a broken session: reported, then tried again
                self.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                failures += 1
                logger.warning("upstream %s: %s", self.name, self.error)
                if not up:
                    self._settled.set()  # a call waiting for this start hears at once that it failed
            finally:
                self._mark_down()
            self._tried.set()
            self._tried = anyio.Event()
            if failures and not self.stopping:
                with anyio.move_on_after(min(2.0 ** (failures - 1), _RESTART_BACKOFF_MAX_S)):
                    await self._wake.wait()
                self._wake = anyio.Event()

    async def wait_tried(self) -> None:
        assert self._tried is not None  # noqa: S101  (set by supervise)
        with anyio.move_on_after(self.start_timeout_s):
            await self._tried.wait()

    async def call(
        self, tool: str, arguments: dict[str, Any], control: CallControl | None, caller: otel_context.Context
    ) -> dict[str, Any]:
        token = otel_context.attach(caller)
        try:
            return await self._call(tool, arguments, control)
        finally:
            otel_context.detach(token)

    async def _call(self, tool: str, arguments: dict[str, Any], control: CallControl | None) -> dict[str, Any]:
        if self.session is None and self._wake is not None and self._settled is not None:
            self._wake.set()  # a start now, not after the back-off
            with anyio.move_on_after(self.start_timeout_s):
                await self._settled.wait()
        session = self.session
        if session is None:
            raise UpstreamError(f"the upstream MCP server {self.name!r} is not running: {self.error or 'starting'}")
        try:
            result = await self._watched_call(session, tool, arguments, control)
        except MCPError as exc:
            broken = {
                types.REQUEST_TIMEOUT: f"did not answer {tool} within {self.call_timeout_s:g} s; it is being restarted",
                types.CONNECTION_CLOSED: f"stopped during the call of {tool} ({exc.message}); it is being restarted: "
                "call again if the call is safe to repeat",
            }.get(exc.code)
            if broken is None:
                raise UpstreamError(f"the upstream MCP server {self.name!r} refused {tool}: {exc.message}") from exc
            self._end_session()  # a hung or dead server is not trusted again
            raise UpstreamError(f"the upstream MCP server {self.name!r} {broken}") from exc
        if result is None:
            raise UpstreamError(f"the call of {tool} on the upstream MCP server {self.name!r} was cancelled")
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)

    async def _watched_call(
        self, session: ClientSession, tool: str, arguments: dict[str, Any], control: CallControl | None
    ) -> types.CallToolResult | None:
        """The upstream's answer, with its progress passed on to ``control`` in order; None when the caller
        cancelled (the call is cancelled upstream: the SDK sends ``notifications/cancelled``)."""
        reports, pending = anyio.create_memory_object_stream[_Progress](math.inf)
        listening = control is not None and control.progress is not None

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                reports.send_nowait((progress, total, message))  # a report after the answer is dropped

        result: types.CallToolResult | None = None
        failure: Exception | None = None
        async with reports, pending, anyio.create_task_group() as forwarding:
            if listening and control is not None:
                forwarding.start_soon(_pass_progress_on, control, pending)
            async with anyio.create_task_group() as calling:
                if control is not None:
                    calling.start_soon(_cancel_when_asked, control, calling.cancel_scope)
                try:
                    result = await session.call_tool(
                        tool,
                        arguments,
                        read_timeout_seconds=self.call_timeout_s,
                        progress_callback=on_progress if listening else None,
                    )
                except Exception as exc:  # raised once the group is done (not inside an exception group)
                    failure = exc
                calling.cancel_scope.cancel()
            reports.close()  # the reports that came before the answer are passed on, then the forwarder ends
            forwarding.cancel_scope.deadline = anyio.current_time() + _PROGRESS_DRAIN_S
        if failure is not None:
            raise failure
        return result

    def _mark_down(self) -> None:
        """No session from now on; callers wait on a fresh event for the next start (once per session)."""
        self.session = None
        if self._settled is not None and self._settled.is_set():
            self._settled = anyio.Event()

    def _end_session(self) -> None:
        self._mark_down()  # at once: the next call must not reach the broken session
        if self._restart is not None:
            self._restart.set()
        if self._wake is not None:
            self._wake.set()

    def stop(self) -> None:
        self.stopping = True
        self._end_session()


class Gateway:
    """Upstream MCP servers, connected on a private event-loop thread; use as a context manager."""

    def __init__(self, policy: McpPolicy, upstreams: Mapping[str, UpstreamServer] | None = None) -> None:
        configured = dict(policy.upstreams if upstreams is None else upstreams)
        self._upstreams = {
            name: _Upstream(name, config, policy.upstream_start_timeout_s, policy.upstream_call_timeout_s)
            for name, config in configured.items()
        }
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._metrics: RuntimeMetrics | None = None

    def start(self) -> list[UpstreamStatus]:
        """Start every upstream and wait (at most ``upstream_start_timeout_s``) for each to list its tools."""
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        for upstream in self._upstreams.values():
            self._portal.start_task(upstream.supervise)
        for upstream in self._upstreams.values():
            self._portal.call(upstream.wait_tried)
        return self.status()

    def status(self) -> list[UpstreamStatus]:
        return [
            UpstreamStatus(u.name, u.session is not None, [t.name for t in u.tools], u.error, u.starts)
            for u in self._upstreams.values()
        ]

    def call(
        self, upstream: str, tool: str, arguments: dict[str, Any], control: CallControl | None = None
    ) -> dict[str, Any]:
        """Call one upstream tool; its ``CallToolResult`` as JSON fields, or :class:`UpstreamError` (also when
        ``control`` was cancelled). Its progress reports reach ``control``."""
        if self._portal is None:
            raise UpstreamError("the gateway is not started")
        with span("upstream.call", {"sandbox_runtime.upstream": upstream, ATTR_TOOL: tool}):
            caller = otel_context.get_current()  # the event loop's task runs in it: the SDK's span is a child
            try:
                return self._portal.call(self._upstreams[upstream].call, tool, arguments, control, caller)
            except UpstreamError:
                if self._metrics is not None:
                    self._metrics.upstream_call_errors.labels(upstream).inc()
                raise

    def gauges(self) -> Iterator[Metric]:
        """Whether each upstream is connected, for a scrape."""
        yield gauge(
            "upstream_up",
            "Whether an upstream MCP server is connected (1) or down (0).",
            [((u.name,), float(u.session is not None)) for u in self._upstreams.values()],
            ["upstream"],
        )

    def register(self, runtime: Runtime) -> list[str]:
        """Register every listed upstream tool in ``runtime`` as ``<upstream>__<tool>``; return the names. The
        runtime then owns the gateway: closing it closes the gateway (its upstreams and its event loop) too."""
        runtime.workers.own(self)
        self._metrics = runtime.metrics
        runtime.metrics.add_gauges("upstreams", self.gauges)
        names = []
        for upstream in self._upstreams.values():
            for tool in upstream.tools:
                name = f"{upstream.name}{SEPARATOR}{tool.name}"
                hints = tool.annotations
                try:
                    runtime.register_tool(
                        name,
                        _forward(self, upstream.name, tool.name),
                        description=f"[{upstream.name}] {tool.description or tool.name}",
                        input_schema=dict(tool.input_schema),
                        pass_call=True,
                        title=tool.title,
                        annotations=None if hints is None else hints.model_dump(by_alias=True, exclude_none=True),
                        output_schema=own_output_schema(tool.output_schema),
                    )
                except ValueError as exc:  # a name past the rules, or a schema that is not one: left out, said
                    logger.warning("upstream tool %r of %s is not offered: %s", tool.name, upstream.name, exc)
                    continue
                names.append(name)
        return names

    def close(self) -> None:
        """Stop every upstream (their processes end) and the event-loop thread."""
        if self._portal is None or self._portal_cm is None:
            return
        for upstream in self._upstreams.values():
            with contextlib.suppress(Exception):
                self._portal.call(_stop, upstream)
        self._portal_cm.__exit__(None, None, None)
        self._portal = self._portal_cm = None

    def __enter__(self) -> Gateway:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _stop(upstream: _Upstream) -> None:
    upstream.stop()


async def _cancel_when_asked(control: CallControl, scope: anyio.CancelScope) -> None:
    while not control.is_cancelled:  # a threading.Event: looked at, never waited on, from the event loop
        await anyio.sleep(_CANCEL_POLL_S)
    scope.cancel()


async def _pass_progress_on(control: CallControl, pending: anyio.abc.ObjectReceiveStream[_Progress]) -> None:
    async for progress, total, message in pending:  # one at a time, in order; off the loop (the sender blocks)
        await anyio.to_thread.run_sync(control.report, progress, total, message)


def _forward(gateway: Gateway, upstream: str, tool: str) -> Callable[[dict[str, Any], HostCall], dict[str, Any]]:
    name = f"{upstream}{SEPARATOR}{tool}"

    def call(arguments: dict[str, Any], host: HostCall) -> dict[str, Any]:
        result = gateway.call(upstream, tool, arguments, host.control)
        return save_blocks(result, host.root, conversation_id=host.conversation_id, call_id=host.call_id, tool=name)

    return call
