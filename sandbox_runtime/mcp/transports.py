"""Serving an :class:`~sandbox_runtime.mcp.server.McpService`: stdio, or streamable HTTP behind a bearer token.

HTTP binds to 127.0.0.1 by default. On any loopback address (127.0.0.0/8, ::1, ``localhost``) the Host and
Origin headers are checked against DNS rebinding: only the served address (and ``localhost``) with the served
port is accepted (421 for another Host, 403 for another Origin). Bound to any other address it refuses to start
without a token; with a token, every request must carry ``Authorization: Bearer <token>`` (compared in constant
time) or gets 401.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hmac
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import uvicorn
from mcp.server.auth.settings import AuthSettings
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from sandbox_runtime.errors import PolicyError
from sandbox_runtime.mcp.auth import AuthRefusalAudit, JwtVerifier
from sandbox_runtime.mcp.metrics_http import METRICS_TOKEN_VARIABLE, MetricsEndpoint
from sandbox_runtime.mcp.server import McpService
from sandbox_runtime.mcp.shutdown import RefuseWhileStopping, serve_until_signalled
from sandbox_runtime.policy import McpPolicy

__all__ = [
    "BearerTokenAuth",
    "check_exposure",
    "http_app",
    "is_loopback",
    "listen",
    "rebinding_protection",
    "serve_http",
    "serve_stdio",
]

logger = logging.getLogger(__name__)

MCP_HTTP_PATH = "/mcp"
_LAST_ANSWERS_S = 1.0  # when a stop ends the transport: how long the answers already given have to be sent


class BearerTokenAuth:
    """ASGI middleware: a request without ``Authorization: Bearer <token>`` gets 401 and goes no further."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = b'{"error":"invalid_token","error_description":"a bearer token is required"}'
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer error="invalid_token"'),
                ]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_stdio(service: McpService, *, signalled_before: Callable[[], bool] = lambda: False) -> None:
    """Serve one client on stdin/stdout until it disconnects (or a stop signal: ``signalled_before`` says whether
    one came during start-up, after it last looked).

    Only the handshake era (2025-06-18 … 2025-11-25) is served, so a client that probes for the stateless
    2026-07-28 protocol falls back to ``initialize`` — and approvals can be asked by elicitation.
    """
    server = service.server
    grace_s = service.runtime.policy.mcp.shutdown_grace_s

    async def main() -> None:
        with _wire() as (wire_in, wire_out), anyio.CancelScope() as serving:  # a stop cancels it all, reader too
            lines = _WireLines(wire_in)
            try:
                async with (
                    stdio_server(lines, anyio.wrap_file(wire_out)) as (read_stream, write_stream),
                    server.lifespan(server) as state,
                ):
                    options = server.create_initialization_options()

                    async def serve() -> None:
                        await serve_loop(server, read_stream, write_stream, lifespan_state=state, init_options=options)

                    async def stop() -> None:
                        await anyio.sleep(_LAST_ANSWERS_S)  # the answers of the calls that just ended reach stdout
                        serving.cancel()

                    await serve_until_signalled(
                        serve, stop, service.calls, grace_s=grace_s, signalled_before=signalled_before
                    )
            finally:
                lines.close_streams()

    anyio.run(main)


class _WireLines(anyio.AsyncFile[str]):
    """The wire's input, line by line, read by a daemon thread of its own: a stop does not wait for a read of a
    pipe the client keeps open (it cannot be interrupted), and the process exits without joining it. Made inside
    the event loop."""

    def __init__(self, fp: IO[str]) -> None:
        super().__init__(fp)
        self._send, self._receive = anyio.create_memory_object_stream[str](0)
        self._token = anyio.lowlevel.current_token()
        threading.Thread(target=self._pump, name="sandbox-runtime-stdin", daemon=True).start()

    def _pump(self) -> None:
        try:
            while True:
                line = self.wrapped.readline()
                anyio.from_thread.run(self._send.send, line, token=self._token)
                if not line:
                    return
        except Exception:  # the loop ended (a stop): nobody reads any more
            return

    async def readline(self) -> str:
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            return ""

    def close_streams(self) -> None:
        self._send.close()
        self._receive.close()


@contextlib.contextmanager
def _wire() -> Iterator[tuple[IO[str], IO[str]]]:
    """The protocol's stdin and stdout, on descriptors of their own: while serving, fd 0 reads the null device and
    fd 1 writes to stderr, so a handler's or a child's stray read or print never touches the wire; both are
    restored afterwards."""
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
    finally:
        os.close(null)
    reader = open(wire_in, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115  (its fd stays open for a reader left behind)
    writer = open(wire_out, "w", encoding="utf-8", closefd=True)  # noqa: SIM115  (closed below, after the restore)
    try:
        yield reader, writer
    finally:
        with contextlib.suppress(OSError):
            writer.flush()
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        writer.close()


def check_exposure(host: str, token: str | None, mcp: McpPolicy) -> None:
    """Refuse to serve HTTP off loopback without a bearer token or OAuth, and with both (:class:`PolicyError`)."""
    if mcp.auth.enabled and token is not None:
        raise PolicyError(
            f"mcp.auth is set and ${mcp.token_variable} too: a server takes OAuth access tokens or the static "
            "token, not both; unset one"
        )
    if token is None and not mcp.auth.enabled and not is_loopback(host):
        raise PolicyError(
            f"serving MCP over HTTP on {host} (not a loopback address) needs OAuth (mcp.auth) or a bearer token: "
            f"set ${mcp.token_variable}"
        )


def check_metrics_exposure(host: str, token: str | None) -> None:
    """Refuse to serve ``/metrics`` on a port of its own off loopback without a bearer token (:class:`PolicyError`)."""
    if token is None and not is_loopback(host):
        raise PolicyError(
            f"serving metrics on {host} (not a loopback address) needs a bearer token: set ${METRICS_TOKEN_VARIABLE}"
        )


def rebinding_protection(host: str, port: int, *, bound_address: str | None = None) -> TransportSecuritySettings:
    """The Host/Origin checks for a server at ``host:port``: on for every loopback address, where only that
    address (also as ``bound_address``, the address the socket got) and ``localhost`` are accepted, with the port.

    Off elsewhere: such a server has a bearer token (see :func:`check_exposure`), and the names it is reached by
    (a proxy's, a DNS name's) are not known here.
    """
    if not is_loopback(host):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    names: list[str] = []
    for name in (host, bound_address, "localhost"):
        if name is None:
            continue
        shown = f"[{name.strip('[]')}]" if ":" in name else name
        if shown not in names:
            names.append(shown)
    hosts = [f"{name}:{port}" for name in names] + (names if port == 80 else [])
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{host}" for host in hosts],
    )


def http_app(service: McpService, host: str, token: str | None, *, port: int, bound_address: str | None = None) -> Any:
    """The ASGI app: the SDK's streamable HTTP endpoint at ``/mcp`` with the Host/Origin checks of
    :func:`rebinding_protection`, behind the token when one is given."""
    mcp = service.runtime.policy.mcp
    check_exposure(host, token, mcp)
    security = rebinding_protection(host, port, bound_address=bound_address)
    if mcp.auth.enabled:
        shown = f"[{host.strip('[]')}]" if ":" in host else host
        audience = mcp.auth.audience or f"http://{shown}:{port}{MCP_HTTP_PATH}"
        settings = AuthSettings.model_validate(  # the URLs as given: RFC 8414 compares an issuer exactly
            {
                "issuer_url": mcp.auth.issuer,
                "resource_server_url": audience,
                "required_scopes": mcp.auth.required_scopes or None,
                "validate_token_resource": False,  # the verifier checks `aud` itself
            }
        )
        guarded = service.server.streamable_http_app(
            streamable_http_path=MCP_HTTP_PATH,
            host=host,
            transport_security=security,
            auth=settings,
            token_verifier=JwtVerifier(mcp.auth, audience),
        )
        return _with_metrics(
            AuthRefusalAudit(guarded, service.runtime.state.audit), service, None, security, served=False
        )
    app: ASGIApp = service.server.streamable_http_app(
        streamable_http_path=MCP_HTTP_PATH, host=host, transport_security=security
    )
    return _with_metrics(app if token is None else BearerTokenAuth(app, token), service, token, security, served=True)


def _with_metrics(
    app: ASGIApp, service: McpService, token: str | None, security: TransportSecuritySettings, *, served: bool
) -> MetricsEndpoint:
    """``/metrics`` in front of ``app``, with the same Host check as the MCP endpoint's."""
    hosts = _hosts_of(security)
    return MetricsEndpoint(app, service.runtime.metrics, token=token, served=served, allowed_hosts=hosts)


def allowed_hosts(host: str, port: int, *, bound_address: str | None = None) -> list[str] | None:
    """The Host names a server at ``host:port`` answers to: :func:`rebinding_protection`'s on loopback; None (any)
    elsewhere."""
    return _hosts_of(rebinding_protection(host, port, bound_address=bound_address))


def _hosts_of(security: TransportSecuritySettings) -> list[str] | None:
    return security.allowed_hosts if security.enable_dns_rebinding_protection else None


def listen(host: str, port: int) -> socket.socket:
    """A socket listening at ``host:port`` (port 0: a free one), its connections with ``TCP_NODELAY``. Bind it
    before anything else starts, so a port in use fails at once (:class:`OSError`), and the port's number is
    known."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # Linux: still refuses a port listened on
        # every connection accepted from it sends at once: without this, an answer written in two parts (headers,
        # body) on a kept-alive connection waits for the client's delayed ACK, ~40 ms per request
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listener.bind((host.strip("[]"), port))
        listener.listen(socket.SOMAXCONN)
    except BaseException:
        listener.close()
        raise
    return listener


def serve_http(
    service: McpService,
    *,
    host: str,
    port: int,
    token: str | None,
    on_ready: Callable[[str], None] | None = None,
    listener: socket.socket | None = None,
    signalled_before: Callable[[], bool] = lambda: False,
) -> None:
    """Serve streamable HTTP until interrupted; ``on_ready`` gets the endpoint URL once the port listens and a stop
    signal is heard (``signalled_before`` says whether one came during start-up, after it last looked: the stop
    then begins at once).

    ``listener`` is a socket from :func:`listen` (bound earlier, e.g. before the runtime started); without one
    the socket is bound here first. Either way port 0 gives a free port and its number is known at once. The
    socket is closed on return.
    """
    with listener if listener is not None else listen(host, port) as bound:
        bound_host, bound_port = bound.getsockname()[:2]
        app = http_app(service, host, token, port=bound_port, bound_address=bound_host)
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        url = f"http://{shown}:{bound_port}{MCP_HTTP_PATH}"
        mcp = service.runtime.policy.mcp
        app = RefuseWhileStopping(app, service.calls, mcp.shutdown_retry_after_s)
        config = uvicorn.Config(  # its records go to the root logger: in the format the command chose (JSON, say)
            app,
            log_config=None,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=int(_LAST_ANSWERS_S) + 1,
        )
        server = _Server(config)

        async def serve() -> None:
            await server.serve(sockets=[bound])

        async def stop() -> None:
            server.should_exit = True  # uvicorn sends what is being answered (bounded), then ends

        anyio.run(
            functools.partial(
                serve_until_signalled,
                serve,
                stop,
                service.calls,
                grace_s=mcp.shutdown_grace_s,
                signalled_before=signalled_before,
                on_ready=None if on_ready is None else functools.partial(on_ready, url),
            )
        )


class _Server(uvicorn.Server):
    """uvicorn's server, its signals left to :func:`serve_until_signalled` (which drains before stopping)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
