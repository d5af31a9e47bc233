"""``sandbox-runtime serve``: the MCP server over stdio (default) or streamable HTTP, optionally a gateway.

Flags add to the policy: ``--database`` sets ``sql.database_path`` (offering ``sql_query``), ``--upstream
NAME=COMMAND`` and ``--upstream-url NAME=URL`` add upstream MCP servers whose tools appear as ``NAME__tool``.
Everything the server says goes to stderr; stdout belongs to the stdio protocol.

Needs the ``mcp`` extra (``pip install 'sandbox-runtime[mcp]'``): the MCP SDK and the HTTP server stack load
only here. Bad configuration — the extra missing, a database that is not a readable SQLite file, an HTTP port
in use, HTTP off loopback without a token — is one line on stderr and exit 2, before anything starts. When a
stdio client process exits, the sandbox of its default conversation is ended (its folders stay; see
:mod:`~sandbox_runtime.mcp.client_process`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import signal
import socket
import sqlite3
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox_runtime.cli.common import add_log_format, say
from sandbox_runtime.errors import PolicyError
from sandbox_runtime.mcp.client_process import ClientProcess, start_watcher
from sandbox_runtime.policy import Policy, load_policy
from sandbox_runtime.telemetry.export import export_traces_from_environment

if TYPE_CHECKING:
    from sandbox_runtime.api.runtime import Runtime
    from sandbox_runtime.mcp.gateway import UpstreamStatus
    from sandbox_runtime.mcp.metrics_http import MetricsServer

__all__ = ["MCP_EXTRA_HINT", "add_serve_parser", "check_database", "cmd_serve", "key_value", "serve_policy"]

logger = logging.getLogger(__name__)

EXIT_USAGE = 2  # as in sandbox_runtime.cli.main: bad usage or configuration
MCP_EXTRA_HINT = "pip install 'sandbox-runtime[mcp]'"
_SQLITE_HEADER = b"SQLite format 3\x00"


def key_value(value: str, *, value_required: bool = True) -> tuple[str, str]:
    """A ``KEY=VALUE`` flag as a pair (an argparse ``type``: a bad one is a usage error, exit 2)."""
    key, sep, rest = value.partition("=")
    if not sep or not key or (value_required and not rest):
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE; got {value!r}")
    return key, rest


def serve_policy(args: argparse.Namespace) -> Policy:
    """The policy named by ``--policy`` with the flags of ``serve`` laid on top (validated again)."""
    mcp: dict[str, Any] = {"upstreams": {}}
    changes: dict[str, Any] = {"mcp": mcp}
    if args.database is not None:
        changes["sql"] = {"database_path": str(os.path.abspath(args.database))}
    if args.http is not None:
        host, _sep, port = args.http.rpartition(":")
        if port:
            mcp["http_port"] = int(port)
        if host.strip("[]"):
            mcp["http_host"] = host.strip("[]")
    for name, command in args.upstream:
        mcp["upstreams"][name] = {"command": shlex.split(command)}
    for name, url in args.upstream_url:
        mcp["upstreams"][name] = {"url": url}
    return load_policy(args.policy).changed(changes, f"{args.policy} with the flags of serve")


def check_database(path: str, source: str) -> None:
    """Refuse a database ``sql_query`` could not read, with one line (:class:`ValueError`); ``source`` names
    where the path came from. An empty file is accepted: SQLite reads it as a database without tables."""
    target = Path(path)
    if not target.exists():
        raise ValueError(f"the database {path} ({source}) does not exist")
    if not target.is_file():
        raise ValueError(f"the database {path} ({source}) is not a file")
    try:
        with target.open("rb") as handle:
            header = handle.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise ValueError(f"the database {path} ({source}) cannot be read: {exc.strerror or exc}") from None
    if header and header != _SQLITE_HEADER:
        raise ValueError(f"the database {path} ({source}) is not a SQLite file")
    uri = f"file:{urllib.parse.quote(str(target.resolve()))}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
            connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        raise ValueError(f"the database {path} ({source}) cannot be read as SQLite: {exc}") from None


def _http_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _say_what_is_served(runtime: Runtime, upstreams: list[UpstreamStatus]) -> None:
    for status in upstreams:
        state = f"{len(status.tools)} tools" if status.running else f"DOWN ({status.error})"
        say(f"upstream {status.name}: {state}")
    say(f"{len(runtime.tools)} tools: {', '.join(runtime.tools)}")
    if runtime.state.engine.kind != "sqlite":  # a shared store: say which (without its password)
        say(f"state on {runtime.state.engine.shown}")
    auth = runtime.policy.mcp.auth
    if auth.enabled:
        keys = auth.jwks_url or auth.jwks_file
        say(f"OAuth: tokens of {auth.issuer} (keys {keys}), tenant claim {auth.tenant_claim!r}")


def cmd_serve(args: argparse.Namespace) -> int:
    from sandbox_runtime.api.runtime import Runtime  # noqa: PLC0415  (the core first: a module missing below is the extra's)

    try:
        from sandbox_runtime.mcp.gateway import Gateway  # noqa: PLC0415  (the MCP SDK loads only for serve)
        from sandbox_runtime.mcp.server import McpService, default_conversation  # noqa: PLC0415  (the MCP extra)
        from sandbox_runtime.mcp.transports import (  # noqa: PLC0415  (the MCP extra)
            check_exposure,
            listen,
            serve_http,
            serve_stdio,
        )
    except ModuleNotFoundError as exc:
        missing = exc.name or str(exc)
        if missing.partition(".")[0] == "sandbox_runtime":
            raise  # our own module, not the extra
        print(f"error: serve needs the mcp extra ({missing} is not installed): {MCP_EXTRA_HINT}", file=sys.stderr)
        return EXIT_USAGE

    client = ClientProcess.parent()  # over stdio: the process whose conversation this server serves
    policy = serve_policy(args)
    token = os.environ.get(policy.mcp.token_variable) or None
    if policy.sql.database_path is not None:  # before anything starts, not at the first call
        source = "--database" if args.database is not None else f"sql.database_path of the policy {args.policy}"
        check_database(policy.sql.database_path, source)
    with _SignalsNoted() as early, contextlib.ExitStack() as stack:
        metrics_server = _telemetry(stack, args.metrics, token)
        listener: socket.socket | None = None
        if args.http is not None:
            host, port = policy.mcp.http_host, policy.mcp.http_port
            check_exposure(host, token, policy.mcp)
            try:  # bound before the runtime and the gateway start, so a port in use fails at once
                listener = stack.enter_context(listen(host, port))
            except OSError as exc:
                print(
                    f"error: cannot serve HTTP at {_http_address(host, port)}: {exc.strerror or exc}", file=sys.stderr
                )
                return EXIT_USAGE
        # over HTTP, many conversations: the policy's warm pool; over stdio one client, whose conversation is new
        # only in its first session: one pooled sandbox then, none after its take, nor in a later session (a client
        # may start a server per call)
        stdio = listener is None
        runtime = stack.enter_context(
            Runtime(args.state_dir, policy, extra_labels=dict(args.label), warm_pool=not stdio)
        )
        conversation = args.conversation or default_conversation("stdio" if stdio else "http", token)
        if stdio and runtime.conversations.is_new(conversation):
            runtime.start_warm_pool(1, refill=False)
        gateway = stack.enter_context(Gateway(policy.mcp))
        gateway.register(runtime)
        service = McpService(runtime, transport="stdio" if stdio else "http", conversation=conversation)
        _say_what_is_served(runtime, gateway.status())
        _serve_metrics(metrics_server, runtime)
        if early.received:
            say("stopped before serving: a stop signal came during start-up")
        elif listener is None:
            serve_stdio(service, signalled_before=lambda: early.received)
            early.again()
            if client.alive():  # the session ended, not (yet) the client: a watcher ends the sandbox after it
                start_watcher(runtime.state_dir, args.policy, client, service.default_conversation)
            else:
                _close_default_conversation(runtime, service.default_conversation)
        else:
            serve_http(
                service,
                host=policy.mcp.http_host,
                port=policy.mcp.http_port,
                token=token,
                on_ready=lambda url: say(f"serving MCP at {url}"),
                listener=listener,
                signalled_before=lambda: early.received,
            )
            early.again()
    return 0


def _telemetry(stack: contextlib.ExitStack, metrics_address: str | None, token: str | None) -> MetricsServer | None:
    """Traces exported as the ``OTEL_*`` variables ask, and ``--metrics`` bound, before anything else starts (a bad
    setting, or a port in use, is refused first); both ended last."""
    exported = export_traces_from_environment()
    if exported is not None:
        stack.callback(exported.shutdown)  # the spans of the whole shutdown are sent too
        say(f"traces: OTLP/HTTP to {exported.endpoint}")
    if metrics_address is None:
        return None
    server = _metrics_server(metrics_address, token)
    stack.callback(server.close)
    return server


def _serve_metrics(server: MetricsServer | None, runtime: Runtime) -> None:
    """Start ``--metrics``, with the Host check of the MCP port (on loopback: a rebound name is refused)."""
    from sandbox_runtime.mcp.transports import allowed_hosts  # noqa: PLC0415  (the MCP extra)

    if server is not None:
        bound_host, port = server.address
        server.start(runtime.metrics, allowed_hosts(server.host, port, bound_address=bound_host))
        say(f"serving metrics at http://{_http_address(bound_host, port)}/metrics")


def _metrics_server(address: str, token: str | None) -> MetricsServer:
    """``--metrics [HOST:]PORT`` bound (a port in use, or off loopback without a token: refused at once)."""
    from sandbox_runtime.mcp.metrics_http import METRICS_TOKEN_VARIABLE, MetricsServer  # noqa: PLC0415  (the MCP extra)
    from sandbox_runtime.mcp.transports import check_metrics_exposure  # noqa: PLC0415  (the MCP extra)

    host, _sep, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    token = os.environ.get(METRICS_TOKEN_VARIABLE) or token
    check_metrics_exposure(host, token)
    try:
        return MetricsServer(host, int(port), token)
    except ValueError:
        raise PolicyError(f"--metrics takes [HOST:]PORT; got {address!r}") from None
    except OSError as exc:
        raise PolicyError(f"cannot serve metrics at {_http_address(host, int(port))}: {exc.strerror or exc}") from None


class _SignalsNoted:
    """SIGTERM and SIGINT outside the serving loop (which drains on them: :mod:`~sandbox_runtime.mcp.shutdown`)
    are noted, never fatal, so that start-up and clean-up finish: nothing started is left behind (pooled
    sandboxes, mounts, a lease). A signal during start-up ends the server before it serves. Main thread only."""

    def __init__(self) -> None:
        self.received = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalsNoted:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._note) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def again(self) -> None:
        """Note them again after the serving loop (its event loop leaves the default handlers behind)."""
        for sig in self._previous:
            signal.signal(sig, self._note)

    def _note(self, signum: int, _frame: object) -> None:
        self.received = True
        logger.warning("%s: stopping once what was started is cleaned up", signal.Signals(signum).name)

    def __exit__(self, *_exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


def _close_default_conversation(runtime: Any, conversation_id: str) -> None:
    """The stdio client has exited: end its default conversation's sandbox (the folders stay for a later start).

    A failure is logged, never raised: the server is on its way out anyway. A client that gives up waiting sends
    SIGTERM (the SDK's does after 2 s); it is ignored while the sandbox is being removed, so no half-removed
    sandbox is left behind (SIGKILL, its next step, cannot be ignored).
    """
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN) if in_main_thread else None
    try:
        runtime.conversation(conversation_id).close()
    except Exception:
        logger.warning("could not end the sandbox of conversation %s", conversation_id, exc_info=True)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def add_serve_parser(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve the tools over MCP (stdio by default, or streamable HTTP), optionally as a gateway",
        description=__doc__,
    )
    serve.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        nargs="?",
        const="",
        default=None,
        help="serve streamable HTTP at http://HOST:PORT/mcp (default 127.0.0.1:8765; another host needs "
        "$SANDBOX_RUNTIME_MCP_TOKEN)",
    )
    serve.add_argument(
        "--metrics",
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default host 127.0.0.1; another host needs "
        "$SANDBOX_RUNTIME_METRICS_TOKEN); with --http they are also at /metrics on its port unless OAuth is on",
    )
    serve.add_argument("--database", metavar="PATH", help="a SQLite file for sql_query (opened read-only)")
    serve.add_argument(
        "--conversation",
        metavar="ID",
        help="the conversation of every call that names none in _meta (default: one per stdio client process, "
        "one per token or server over HTTP)",
    )
    serve.add_argument(
        "--upstream",
        metavar="NAME=COMMAND",
        type=key_value,
        action="append",
        default=[],
        help="an upstream MCP server started over stdio, e.g. time='mcp-server-time'",
    )
    serve.add_argument(
        "--upstream-url",
        metavar="NAME=URL",
        type=key_value,
        action="append",
        default=[],
        help="an upstream MCP server over streamable HTTP",
    )
    add_log_format(serve, default=None)
    serve.set_defaults(func=cmd_serve)
