"""``sandbox-runtime audit verify`` and ``audit export``: the state's audit trail for a reviewer
(:mod:`~sandbox_runtime.state.audit`).

``verify`` walks the hash chain and names the first entry that breaks it (exit 1), or prints how many entries it
checked and the head hash (exit 0) — note the head hash somewhere else and pass it back with ``--head`` later to
show the log was not rewritten since. ``export`` prints entries as JSON lines (``--since`` an ISO date or time,
``--tenant``), each with its hashes, for a reviewer's own tools.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

from sandbox_runtime.api.runtime import default_state_dir
from sandbox_runtime.errors import PolicyError
from sandbox_runtime.policy import load_policy
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.state.location import open_engine, state_url

__all__ = ["add_audit_parser"]


def add_audit_parser(sub: Any) -> None:
    audit = sub.add_parser("audit", help="the audit trail: check its hash chain, export it")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_sub.add_parser(
        "verify",
        help="check that no entry was edited, removed, inserted or moved; name the first that was",
        description="Walk the audit trail's hash chain from its first entry to its head. Exit 0 with the number "
        "of entries and the head hash when it is whole; exit 1 naming the first entry that breaks it.",
    )
    verify.add_argument("--head", metavar="SHA256", help="a head hash noted earlier: it must still be in the chain")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(func=cmd_audit_verify)
    export = audit_sub.add_parser("export", help="print entries as JSON lines, oldest first")
    export.add_argument("--since", metavar="DATE", help="only entries written at or after this ISO date or time (UTC)")
    export.add_argument("--tenant", help="only this tenant's entries")
    export.set_defaults(func=cmd_audit_export)


def _state(args: argparse.Namespace) -> StateDB:
    settings = load_policy(args.policy).state
    state_dir = args.state_dir or default_state_dir()
    return StateDB(open_engine(state_dir, state_url(None, settings), settings))


def cmd_audit_verify(args: argparse.Namespace) -> int:
    state = _state(args)
    try:
        check = state.audit.verify(head=args.head)
    finally:
        state.close()
    if args.json:
        print(json.dumps({**check.model_dump(), "ok": check.ok}, indent=2))
    elif check.ok:
        print(f"the audit trail is whole: {check.entries:,} entries; head {check.head_hash}")
    else:
        print(f"the audit trail is broken at entry {check.first_bad}: {check.problem}", file=sys.stderr)
        print(f"({check.entries:,} entries before it are whole; the last of them has hash {check.head_hash})")
    return 0 if check.ok else 1


def _moment(text: str) -> float:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError as exc:
        raise PolicyError(f"--since {text!r} is not an ISO date or time (2026-12-01, 2026-12-01T08:00)") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def cmd_audit_export(args: argparse.Namespace) -> int:
    since = None if args.since is None else _moment(args.since)
    state = _state(args)
    try:
        for entry in state.audit.entries(since=since, tenant=args.tenant):
            shown = entry.shown()
            shown["at_iso"] = datetime.datetime.fromtimestamp(entry.at, datetime.UTC).isoformat()
            sys.stdout.write(json.dumps(shown, ensure_ascii=False, sort_keys=True) + "\n")
    except BrokenPipeError:  # the reader had enough (`| head`): no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    finally:
        state.close()
    return 0
