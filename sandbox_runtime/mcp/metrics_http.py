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
from collections.abc import Callable, Collection, Iterable
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


def _exposition(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


def _authorized(given: str | None, token: str | None) -> bool:
    if token is None:
        return True
    return given is not None and hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


class MetricsEndpoint:
    """ASGI middleware around the whole HTTP app: answers ``GET /metrics`` (see the module text) and counts the
    app's 401 and 403 answers."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: RuntimeMetrics,
        registry: CollectorRegistry,
        *,
        token: str | None,
        served: bool,
        allowed_hosts: Collection[str] | None = None,
    ) -> None:
        self._app, self._metrics, self._registry = app, metrics, registry
        self._token, self._served, self._hosts = token, served, allowed_hosts

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
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        if not self._served:
            await _reply(send, 404, b"metrics are served on their own port here (serve --metrics HOST:PORT)\n")
            return
        if self._hosts is not None and headers.get("host") not in self._hosts:
            await _reply(send, 421, _MISDIRECTED)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _reply(send, 405, b"GET /metrics\n", [(b"allow", b"GET, HEAD")])
            return
        if not _authorized(headers.get("authorization"), self._token):
            self._metrics.auth_failures.labels("401").inc()
            await _reply(send, 401, b"a bearer token is required\n", [(b"www-authenticate", b"Bearer")])
            return
        body, content_type = await anyio.to_thread.run_sync(_exposition, self._registry, headers.get("accept", ""))
        await _reply(send, 200, body if scope["method"] == "GET" else b"", [(b"content-type", content_type.encode())])


async def _reply(send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    start: dict[str, Any] = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-length", str(len(body)).encode()), *headers],
    }
    if status != 200:
        start["headers"].append((b"content-type", b"text/plain; charset=utf-8"))
    await send(start)
    await send({"type": "http.response.body", "body": body})


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
    reached without a token is the caller's to check (:func:`~sandbox_runtime.mcp.transports.check_exposure`)."""

    def __init__(self, host: str, port: int, token: str | None) -> None:
        self._token = token
        self._served: tuple[CollectorRegistry, RuntimeMetrics, Collection[str] | None] | None = None
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
        self._served = exposition_registry(metrics), metrics, allowed_hosts
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        assert self._served is not None  # noqa: S101  (requests are served after start only)
        registry, metrics, hosts = self._served
        if hosts is not None and environ.get("HTTP_HOST") not in hosts:
            start_response("421 Misdirected Request", [("Content-Type", "text/plain; charset=utf-8")])
            return [_MISDIRECTED]
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"only /metrics is served here\n"]
        if not _authorized(environ.get("HTTP_AUTHORIZATION"), self._token):
            metrics.auth_failures.labels("401").inc()
            start_response("401 Unauthorized", [("WWW-Authenticate", "Bearer")])
            return [b"a bearer token is required\n"]
        body, content_type = _exposition(registry, environ.get("HTTP_ACCEPT", ""))
        start_response("200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body)))])
        return [body]
