"""``sandbox-runtime state migrate``: move a state directory's SQLite state to a PostgreSQL server, so that
several replicas can serve its conversations (:mod:`~sandbox_runtime.state.migration`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from sandbox_runtime.api.runtime import default_state_dir
from sandbox_runtime.errors import PolicyError
from sandbox_runtime.policy import load_policy
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.state.location import STATE_FILE, STATE_URL_VARIABLE, mark_state_dir, open_engine, state_url
from sandbox_runtime.state.migration import copy_state
from sandbox_runtime.state.sqlite import SqliteEngine

__all__ = ["add_state_parser"]


def add_state_parser(sub: Any) -> None:
    state = sub.add_parser("state", help="where the state lives: move it to a PostgreSQL server")
    state_sub = state.add_subparsers(dest="state_command", required=True)
    migrate = state_sub.add_parser(
        "migrate",
        help="copy the state directory's SQLite state to a PostgreSQL database, and use it there from now on",
        description="Copy every conversation, decision, execution record, attachment record and task of the "
        "state directory's SQLite state to an empty PostgreSQL database, in one transaction, check that the "
        "decisions read back the same, then set the SQLite file aside (renamed, kept) and name the server in the "
        "state directory. Stop every runtime using the state first.",
    )
    migrate.add_argument(
        "--to",
        metavar="URL",
        help=f"postgresql://user@host:port/database (default: ${STATE_URL_VARIABLE}, else the policy's state.url); "
        "a password is better given by the variable, $PGPASSWORD or ~/.pgpass than on a command line others can "
        "read",
    )
    migrate.add_argument("--json", action="store_true")
    migrate.set_defaults(func=cmd_state_migrate)


def cmd_state_migrate(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or default_state_dir()
    settings = load_policy(args.policy).state
    url = state_url(args.to, settings)
    if url is None:
        raise PolicyError(f"state migrate needs the server: --to postgresql://... or ${STATE_URL_VARIABLE}")
    sqlite_file = state_dir / STATE_FILE
    if not sqlite_file.is_file():
        raise PolicyError(f"{state_dir} has no SQLite state ({STATE_FILE}) to migrate")
    source = StateDB(SqliteEngine(sqlite_file))  # brought up to this version's schema first
    try:
        target = StateDB(open_engine(state_dir, url, settings, mark=False))
        try:
            report = copy_state(source, target, sqlite_file)
            mark_state_dir(state_dir, target.engine)
        finally:
            target.close()
    finally:
        source.close()
    if args.json:
        print(json.dumps(report.model_dump(mode="json"), indent=2))
        return 0
    copied = ", ".join(f"{count:,} {table}" for table, count in report.rows.items())
    print(f"copied {report.source} to {report.target}: {copied}")
    print(f"decisions read back the same (sha256 {report.decisions_sha256[:16]}...)")
    print(f"the SQLite file is kept as {report.kept_as}; from now on give runtimes on {state_dir} the server's URL")
    return 0
