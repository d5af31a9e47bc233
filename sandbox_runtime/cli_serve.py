"""``sandbox-runtime serve``: the MCP server over stdio (default) or streamable HTTP, optionally a gateway.

Flags add to the policy: ``--database`` sets ``sql.database_path`` (offering ``sql_query``), ``--upstream
NAME=COMMAND`` and ``--upstream-url NAME=URL`` add upstream MCP servers whose tools appear as ``NAME__tool``.
Everything the server says goes to stderr; stdout belongs to the stdio protocol.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from sandbox_runtime.policy import Policy, load_policy

__all__ = ["add_serve_parser", "cmd_serve", "key_value", "serve_policy"]


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


def cmd_serve(args: argparse.Namespace) -> int:
    from sandbox_runtime.mcp.gateway import Gateway  # noqa: PLC0415  (the MCP SDK loads only for serve)
    from sandbox_runtime.mcp.server import McpService  # noqa: PLC0415
    from sandbox_runtime.mcp.transports import (  # noqa: PLC0415
        check_exposure,
        serve_http,
        serve_stdio,
    )
    from sandbox_runtime.runtime import Runtime  # noqa: PLC0415

    policy = serve_policy(args)
    token = os.environ.get(policy.mcp.token_variable) or None
    if args.http is not None:
        check_exposure(policy.mcp.http_host, token, policy.mcp.token_variable)  # before anything starts
    with Runtime(args.state_dir, policy, extra_labels=dict(args.label)) as runtime, Gateway(policy.mcp) as gateway:
        for status in gateway.status():
            state = f"{len(status.tools)} tools" if status.running else f"DOWN ({status.error})"
            print(f"upstream {status.name}: {state}", file=sys.stderr, flush=True)
        gateway.register(runtime)
        service = McpService(runtime, transport="stdio" if args.http is None else "http")
        print(f"{len(runtime.tools)} tools: {', '.join(runtime.tools)}", file=sys.stderr, flush=True)
        if args.http is None:
            serve_stdio(service)
        else:
            serve_http(
                service,
                host=policy.mcp.http_host,
                port=policy.mcp.http_port,
                token=token,
                on_ready=lambda url: print(f"serving MCP at {url}", file=sys.stderr, flush=True),
            )
    return 0


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
    serve.add_argument("--database", metavar="PATH", help="a SQLite file for sql_query (opened read-only)")
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
    serve.set_defaults(func=cmd_serve)
