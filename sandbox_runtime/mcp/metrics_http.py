"""``/metrics`` for Prometheus: on the MCP server's own port (``serve --http``), or on a port of its own
(``serve --metrics HOST:PORT``).

What is exposed is the runtime's collector (:mod:`~sandbox_runtime.telemetry.metrics`) and the serving process's
own (CPU, memory, open files, Python's garbage collector), in the text format or OpenMetrics as the scraper asks.

Who may read it: the metrics name tenants (their disk use) and upstreams, so they are guarded like the tools.
On the MCP port, with a static token (``$SANDBOX_RUNTIME_MCP_TOKEN``) a scrape carries it as a bearer token
(Prometheus: ``authorization: {credentials: ...}``); under OAuth (``[mcp.auth]``) the MCP port does not serve
them at all, since any tenant's access token would do: give ``--metrics`` a port of its own for the operator's
network. That port takes ``$SANDBOX_RUNTIME_METRICS_TOKEN`` (else the static MCP token) and, like the MCP
port, refuses to listen off loopback without one. Every 401 and 403 the HTTP server answers is counted
(``sandbox_runtime_auth_failures_total``).
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import anyio.to_thread
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox_runtime.telemetry.metrics import RuntimeMetrics

__all__ = ["METRICS_PATH", "METRICS_TOKEN_VARIABLE", "MetricsEndpoint", "MetricsServer", "exposition_registry"]

logger = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
_MISDIRECTED = b"this server is not reached by that name (Host)\n"
METRICS_TOKEN_VARIABLE = "SANDBOX_RUNTIME_METRICS_TOKEN"  # noqa: S105  (the name of a variable, not a secret)


def exposition_registry(metrics: RuntimeMetrics) -> CollectorRegistry:
    """What a scrape reads: the runtime's metrics and this process's."""
    registry = CollectorRegistry()
    registry.register(metrics)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def _authorized(given: str | None, token: str | None) -> bool:
    if token is None:
        return True
    return given is not None and hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


class _Scrapes:
    """Who may read the metrics and what they read, the same on both ports: a request by another Host name than
    ``allowed_hosts`` (None: any) is misdirected (421), one without the token refused (401, counted)."""

    def __init__(self, metrics: RuntimeMetrics, token: str | None, allowed_hosts: Collection[str] | None) -> None:
        self._metrics, self._token, self._hosts = metrics, token, allowed_hosts
        self._registry = exposition_registry(metrics)

    def answer(self, method: str, path: str, headers: Mapping[str, str]) -> _Answer:
        """The answer to a request (``headers`` by lower-case name)."""
        if self._hosts is not None and headers.get("host") not in self._hosts:
            return _Answer(421, _MISDIRECTED)
        if path != METRICS_PATH:
            return _Answer(404, b"only /metrics is served here\n")
        if method not in ("GET", "HEAD"):
            return _Answer(405, b"GET /metrics\n", [("allow", "GET, HEAD")])
        if not _authorized(headers.get("authorization"), self._token):
            self._metrics.auth_failures.labels("401").inc()
            return _Answer(401, b"a bearer token is required\n", [("www-authenticate", "Bearer")])
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self._registry) if method == "GET" else b""
        return _Answer(200, body, [("content-type", content_type)])


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)

    def header_list(self) -> list[tuple[str, str]]:
        """Its headers, with the body's length (and a text type for a refusal)."""
        plain = [] if self.status == 200 else [("content-type", "text/plain; charset=utf-8")]
        return [("content-length", str(len(self.body))), *self.headers, *plain]


class MetricsEndpoint:
    """ASGI middleware around the whole HTTP app: answers ``/metrics`` (see the module text; ``served`` False:
    404, pointing at ``--metrics``) and counts the app's 401 and 403 answers."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: RuntimeMetrics,
        *,
        token: str | None,
        served: bool,
        allowed_hosts: Collection[str] | None = None,
    ) -> None:
        self._app, self._metrics = app, metrics
        self._scrapes = _Scrapes(metrics, token, allowed_hosts) if served else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if scope["path"] == METRICS_PATH:
            await self._answer(scope, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] in (401, 403):
                self._metrics.auth_failures.labels(str(message["status"])).inc()
            await send(message)

        await self._app(scope, receive, counted)

    async def _answer(self, scope: Scope, send: Send) -> None:
        if self._scrapes is None:
            answer = _Answer(404, b"metrics are served on their own port here (serve --metrics HOST:PORT)\n")
        else:
            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
            answer = await anyio.to_thread.run_sync(self._scrapes.answer, scope["method"], scope["path"], headers)
        encoded = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in answer.header_list()]
        await send({"type": "http.response.start", "status": answer.status, "headers": encoded})
        await send({"type": "http.response.body", "body": answer.body})


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("metrics: " + format, *args)


class MetricsServer:
    """``/metrics`` on a port of its own (port 0: a free one), served by a thread from :meth:`start` until
    :meth:`close`; binding fails at once (:class:`OSError`) when the port is taken. Whether its host may be
    reached without a token is the caller's to check
    (:func:`~sandbox_runtime.mcp.transports.check_metrics_exposure`)."""

    def __init__(self, host: str, port: int, token: str | None) -> None:
        self._token = token
        self._scrapes: _Scrapes | None = None
        self.host = host.strip("[]")
        kind = _ThreadingServer6 if ":" in self.host else _ThreadingServer
        self._server = make_server(self.host, port, self._app, server_class=kind, handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="sandbox-runtime-metrics", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self, metrics: RuntimeMetrics, allowed_hosts: Collection[str] | None) -> None:
        """Serve ``metrics`` (and this process's) from now on, to requests whose Host is one of ``allowed_hosts``
        (None: any; :func:`~sandbox_runtime.mcp.transports.allowed_hosts`)."""
        self._scrapes = _Scrapes(metrics, self._token, allowed_hosts)
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        assert self._scrapes is not None  # noqa: S101  (requests are served after start only)
        headers = {name[5:].lower(): str(value) for name, value in environ.items() if name.startswith("HTTP_")}
        answer = self._scrapes.answer(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""), headers)
        start_response(f"{answer.status} {HTTPStatus(answer.status).phrase}", answer.header_list())
        return [answer.body]
