"""``sandbox-runtime``: doctor, image build, serve, demo, gc, ls, kube manifests, state migrate.

Exit codes: :data:`EXIT_CODES` (2 also for serve's flags and for serve without the mcp extra; 3 for Docker and
Podman alike). ``python -m sandbox_runtime`` is the same command.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sandbox_runtime.api.runtime import Conversation, Runtime, default_state_dir
from sandbox_runtime.cli.audit import add_audit_parser
from sandbox_runtime.cli.common import (
    EXIT_CODES,
    EXIT_ENGINE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_log_format,
    configure_logging,
    open_runtime,
    progress,
    table,
)
from sandbox_runtime.cli.doctor import cmd_doctor
from sandbox_runtime.cli.kube import add_kube_parser
from sandbox_runtime.cli.serve import add_serve_parser, key_value
from sandbox_runtime.cli.state import add_state_parser
from sandbox_runtime.errors import (
    EngineUnavailable,
    ImageError,
    PolicyError,
    SandboxRuntimeError,
    SelfCheckFailed,
)
from sandbox_runtime.mcp.client_process import WATCH_COMMAND, ClientProcess, release_when_client_exits
from sandbox_runtime.policy import load_policy
from sandbox_runtime.tenancy import DEFAULT_TENANT, conversation_key, validate_conversation_key

__all__ = ["main"]


def cmd_image_build(args: argparse.Namespace) -> int:
    from sandbox_runtime.sandbox.backend import ImageBuilder  # noqa: PLC0415  (only this command builds)
    from sandbox_runtime.sandbox.engines import make_backend  # noqa: PLC0415  (an engine's client loads only when used)
    from sandbox_runtime.sandbox.image import build_executor_image  # noqa: PLC0415  (only this command builds)

    started = time.monotonic()
    policy = load_policy(args.policy)
    backend = make_backend(policy.sandbox)
    try:
        if not isinstance(backend, ImageBuilder):
            print(f"the {backend.name} backend runs no executor image: nothing to build")
            return EXIT_OK
        report = build_executor_image(backend, source=args.source, force=args.force, progress=progress)
    finally:
        backend.close()
    verb = "built" if report.built else "already present"
    print(
        f"{report.tag} {verb} ({report.source}, base {report.base_image or '-'}) in {time.monotonic() - started:.1f} s"
    )
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from sandbox_runtime.cli.demo import run_demo  # noqa: PLC0415  (the demo's sample data load only for it)

    return run_demo(args.state_dir, args.policy, out=sys.stdout, extra_labels=dict(args.label))


def cmd_gc(args: argparse.Namespace) -> int:
    with open_runtime(args, sweep=False) as runtime:
        removals = runtime.gc()
        expired = runtime.expire_files()
        if args.json:
            print(
                json.dumps(
                    {"sandboxes": [r.model_dump() for r in removals], "files": [r.model_dump() for r in expired]},
                    indent=2,
                )
            )
            return EXIT_OK if all(r.complete and not r.errors for r in expired) else EXIT_FAILED
        rows = [[r.container_id[:12], r.conversation_id or "-", r.reason] for r in removals]
        print(table(rows, ["container", "conversation", "reason"]) if rows else "no sandbox to remove")
        days = runtime.policy.spill.retention_s / 86400
        files = [
            [r.conversation_id, f"{r.removed_files:,}", f"{r.removed_bytes:,}", f"{r.kept_files:,}"]
            for r in expired
            if r.removed_files or r.errors
        ]
        print(
            table(files, ["conversation", "expired files", "bytes freed", "files kept"])
            if files
            else f"no spill, error or argument file older than {days:g} days"
        )
        for r in expired:
            for error in r.errors:
                print(f"warning: {r.conversation_id}: {error}", file=sys.stderr)
    return EXIT_OK if all(r.complete and not r.errors for r in expired) else EXIT_FAILED


def _ls_conversation(runtime: Runtime, args: argparse.Namespace) -> int:
    """The execution record (--calls) or the attachments (--attachments) of one conversation."""
    named: str = args.conversation  # an id of --tenant, or a key as `ls` shows it
    key = validate_conversation_key(named) if "." in named else conversation_key(args.tenant, named)
    if runtime.state.conversation(key) is None:
        print(f"error: no conversation {named!r} of tenant {args.tenant!r} in {runtime.state_dir}", file=sys.stderr)
        return EXIT_USAGE
    conversation = runtime.conversation_by_key(key)
    if args.attachments:
        cards = conversation.attachments()
        if args.json:
            print(json.dumps([c.model_dump() for c in cards], indent=2))
            return EXIT_OK
        rows = [[c.attachment_id, c.filename, f"{c.bytes:,}", c.mime_type, c.source] for c in cards]
        print(table(rows, ["attachment", "filename", "bytes", "type", "copied from"]) if rows else "no attachments")
        used = runtime.store.outputs_usage(runtime.store.folders(key))
        print(
            f"\noutputs/: {used.attachments:,} of at most {used.files_max:,} attachments (tools.outputs_files_max); "
            f"{used.bytes:,} of {used.max_bytes:,} bytes (tools.outputs_max_bytes) in {used.contents:,} distinct "
            f"contents"
        )
        return EXIT_OK
    if args.spills:
        return _ls_spills(conversation, args)
    calls = conversation.calls()
    if args.json:
        print(json.dumps([c.model_dump() for c in calls], indent=2))
        return EXIT_OK
    listed = []
    for c in calls:
        tool = c.tool if c.tool == c.target else f"{c.tool} → {c.target}"
        sizes = f"{len(c.arguments or ''):,}" + (f" / {len(c.expanded):,}" if c.expanded is not None else "")
        path = c.descriptor.path if c.descriptor else (c.error_path or "-")
        listed.append([c.call_id, tool, c.status, f"{c.finished_at - c.started_at:.2f}", sizes, path])
    header = ["call", "tool", "status", "seconds", "argument chars (short / expanded)", "result file"]
    print(table(listed, header) if listed else "no calls")
    return EXIT_OK


def _ls_spills(conversation: Conversation, args: argparse.Namespace) -> int:
    """The files results were saved to (spills, exports), oldest first, with their shape and expiry."""
    saved = conversation.spills()
    if args.json:
        print(json.dumps([s.model_dump(mode="json") for s in saved], indent=2))
        return EXIT_OK
    rows = [
        [
            s.call_id,
            s.tool,
            s.descriptor.path,
            s.descriptor.format,
            f"{s.descriptor.bytes:,}",
            "-" if s.descriptor.rows is None else f"{s.descriptor.rows:,}",
            s.descriptor.expires_at or "kept",
        ]
        for s in saved
    ]
    header = ["call", "tool", "path", "format", "bytes", "rows", "expires"]
    print(table(rows, header) if rows else "no saved results")
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    with open_runtime(args, sweep=False) as runtime:
        if args.conversation is not None:
            return _ls_conversation(runtime, args)
        live = {s.conversation_id: s for s in runtime.state.live_sandboxes()}
        rows: list[dict[str, object]] = []
        for record in runtime.state.conversations():
            usage = runtime.conversation_by_key(record.id).usage()
            outputs = runtime.store.outputs_usage(runtime.store.folders(record.id))
            sandbox = live.get(record.id)
            rows.append(
                {
                    "conversation": record.id,
                    "tenant": runtime.state.tenants.of_key(record.id),
                    "sandbox": sandbox.container_id[:12] if sandbox else None,
                    "runs": record.runs,
                    "used_bytes": usage.used_bytes,
                    "limit_bytes": usage.limit_bytes,
                    "quota_mode": usage.mode,
                    "outputs_files": outputs.attachments,
                    "outputs_files_max": outputs.files_max,
                    "outputs_bytes": outputs.bytes,
                    "outputs_max_bytes": outputs.max_bytes,
                }
            )
        if args.json:
            print(json.dumps(rows, indent=2))
        elif not rows:
            print("no conversations")
        else:
            print(
                table(
                    [
                        [
                            str(r["conversation"]),
                            str(r["tenant"]),
                            str(r["sandbox"] or "-"),
                            str(r["runs"]),
                            f"{r['used_bytes']:,} / {r['limit_bytes']:,}",
                            str(r["quota_mode"]),
                            f"{r['outputs_files']:,} / {r['outputs_files_max']:,}",
                            f"{r['outputs_bytes']:,} / {r['outputs_max_bytes']:,}",
                        ]
                        for r in rows
                    ],
                    [
                        "conversation",
                        "tenant",
                        "sandbox",
                        "runs",
                        "disk used / quota (bytes)",
                        "quota mode",
                        "attachments / max",
                        "attachment bytes / quota",
                    ],
                )
            )
    return EXIT_OK


def version() -> str:
    """The installed distribution's version (``unknown`` when run from a source tree that is not installed)."""
    try:
        return importlib.metadata.version("sandbox-runtime")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandbox-runtime",
        description="Hardened sandboxes for AI agents' code, and a data path that bypasses model output.",
        epilog=EXIT_CODES,
    )
    parser.add_argument("--version", action="version", version=f"sandbox-runtime {version()}")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"state directory (default: $SANDBOX_RUNTIME_STATE_DIR or {default_state_dir()})",
    )
    parser.add_argument(
        "--policy", default="default", help="a shipped policy (default, strict, gvisor, podman) or a TOML file path"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens (to stderr)")
    add_log_format(parser, default="text")
    parser.add_argument(
        "--label",
        metavar="KEY=VALUE",
        type=functools.partial(key_value, value_required=False),
        action="append",
        default=[],
        help="a container label added to every sandbox this command starts (e.g. for your own monitoring)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="start a canary sandbox and show that every protection is in force")
    doctor.add_argument("--json", action="store_true")
    doctor.set_defaults(func=cmd_doctor)
    image = sub.add_parser("image", help="the executor image")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    build = image_sub.add_parser("build", help="build the executor image (offline when no registry answers)")
    build.add_argument("--source", choices=["auto", "registry", "offline"], default="auto")
    build.add_argument("--force", action="store_true", help="rebuild even when the tag exists")
    build.set_defaults(func=cmd_image_build)
    add_serve_parser(sub)
    demo = sub.add_parser(
        "demo", help="play a scripted conversation: query, spill, export, report, failure, delegate, attach"
    )
    demo.set_defaults(func=cmd_demo)
    gc = sub.add_parser(
        "gc", help="remove orphaned, idle and expired sandboxes, and spill, error and argument files past retention"
    )
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(func=cmd_gc)
    ls = sub.add_parser(
        "ls",
        help="conversations, their sandboxes, disk use and attachments quota; with a conversation id: its calls or "
        "attachments",
    )
    ls.add_argument("conversation", nargs="?", help="list this conversation's execution record")
    shown = ls.add_mutually_exclusive_group()
    shown.add_argument("--attachments", action="store_true", help="its attachments instead of its calls")
    shown.add_argument("--spills", action="store_true", help="its saved results (spills and exports) instead")
    ls.add_argument("--json", action="store_true")
    ls.add_argument(
        "--tenant", default=DEFAULT_TENANT, help="whose conversation id it is (default: the default tenant)"
    )
    ls.set_defaults(func=cmd_ls)
    add_kube_parser(sub)
    add_state_parser(sub)
    add_audit_parser(sub)
    sub.metavar = "{" + ",".join(sub.choices) + "}"  # the commands a user runs; the one below is serve's own
    watch = sub.add_parser(  # started by serve over stdio: ends a conversation's sandbox once its client exits
        WATCH_COMMAND, description="(started by serve over stdio) end a conversation's sandbox once its client exits"
    )
    watch.add_argument("--pid", type=int, required=True, help="the client process")
    watch.add_argument("--start", default="", help="its boot id and start time, as the server read them")
    watch.add_argument("--conversation", required=True)
    watch.set_defaults(func=cmd_release_when_client_exits)
    return parser


def cmd_release_when_client_exits(args: argparse.Namespace) -> int:
    client = ClientProcess(args.pid, args.start or None)
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
    policy = load_policy(args.policy)  # its lifetime bounds the wait: an older sandbox is reaped anyway
    released = release_when_client_exits(
        state_dir, args.policy, client, args.conversation, max_wait_s=policy.sandbox.max_lifetime_s
    )
    return EXIT_OK if released else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_format, args.verbose)
    try:
        return int(args.func(args))
    except (PolicyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (EngineUnavailable, ImageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ENGINE
    except SelfCheckFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except SandboxRuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
