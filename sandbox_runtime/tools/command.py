"""A command in the conversation's sandbox, for a host's own program (``Conversation.exec``: the framework adapters'
shell and file operations), not a model's tool: its words, input and output are bytes the caller handles.

A command runs as a ``run_python`` script does, with the same confinement, limits and end: through the sandbox's
resident executor (a fresh fork, confined, then the program found on the sandbox's ``PATH`` in its place), its
time limit and kill grace from ``[run]``, every process of it ended when it ends, one run at a time per
conversation. What differs:

* the program: any in the image (a shell's 127 when there is none, 126 when it cannot be run, 128 + N when
  signal N ended it);
* ``stdin``: the caller's bytes, streamed as the command reads them (never held whole); without it the command
  reads nothing; its ``stdout`` may go to the caller's sink as it comes, in place of the result's;
* ``env``: variables laid over the sandbox's allow-listed environment for this command alone. No variable carries
  a protection (the kernel's confinement does), so any name may be set, ``PATH`` included; names must be names;
* the output: bytes, each stream capped at ``stdout_max_bytes`` / ``stderr_max_bytes`` (at most
  ``[run] command_output_max_bytes``, also their default); past a cap the command is ended and the status says
  ``output_limit`` (``truncated``);
* nothing is saved in the results folder: no script file, no error file.

Statuses are ``run_python``'s: ``ok`` (exit 0), ``error`` (any other exit), ``timeout``, ``memory_limit``,
``output_limit``, ``quota_exceeded``, ``cancelled``.
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.control import CallControl
from sandbox_runtime.conversations.handle import SandboxHandle
from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.models import RunStatus
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.run_protocol import run_request
from sandbox_runtime.sandbox.runs import CommandStreams
from sandbox_runtime.telemetry.tracing import failed, span
from sandbox_runtime.tools.run_outcome import run_outcome
from sandbox_runtime.tools.run_upkeep import acquire_run_lock, exec_control, quota_breach, tend_sandbox

__all__ = ["CommandArgs", "CommandResult", "check_command", "in_sandbox", "run_command"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class CommandArgs(BaseModel):
    """One command: its words, where it runs, its own variables, its limits, and whether it reads input."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    argv: list[str] = Field(min_length=1, description="The program (found on PATH) and its arguments.")
    cwd: str | None = Field(None, description="Where it runs: an absolute path, or one relative to the results folder.")
    env: dict[str, str] = Field(default_factory=dict, description="Variables laid over the sandbox's environment.")
    timeout_s: float | None = Field(None, gt=0, description="Wall-clock limit in seconds ([run] default).")
    stdout_max_bytes: int | None = Field(None, gt=0, description="Cap of stdout ([run] command_output_max_bytes).")
    stderr_max_bytes: int | None = Field(None, gt=0, description="Cap of stderr ([run] command_output_max_bytes).")
    with_input: bool = Field(False, description="Whether the caller gives the command input on its stdin.")


class CommandResult(BaseModel):
    """How a command ended and what it wrote."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: RunStatus
    exit_code: int | None = Field(
        description="Its own exit status (128 + N for signal N); None when the runtime "
        "ended it (timeout, output_limit) or it never ran (cancelled before it began)."
    )
    stdout: bytes
    stderr: bytes
    truncated: bool = Field(description="Output was cut at a cap (the status is then output_limit).")
    duration_s: float
    run_number: int

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def check_command(args: CommandArgs, policy: Policy) -> CommandArgs:
    """The command's arguments against the policy's limits (InvalidToolArguments names what is wrong)."""
    run = policy.run
    words = [*args.argv, args.cwd or "", *args.env, *args.env.values()]
    if any("\x00" in word for word in words):
        raise InvalidToolArguments("exec: words, the working directory and variables must not contain NUL")
    if args.argv[0] == "":
        raise InvalidToolArguments("exec: the program (argv[0]) is empty")
    bad = sorted(name for name in args.env if not _NAME.match(name))
    if bad:
        raise InvalidToolArguments(f"exec: not variable names (letters, digits, _; not first a digit): {bad}")
    line = json.dumps({"argv": args.argv, "cwd": args.cwd, "env": args.env})  # as the channel sends it
    if len(line) > run.command_line_max_bytes:
        raise InvalidToolArguments(
            f"exec: the command line is over command_line_max_bytes={run.command_line_max_bytes}; pass data on "
            "stdin or in a file instead"
        )
    if args.timeout_s is not None and args.timeout_s > run.max_timeout_s:
        raise InvalidToolArguments(f"exec: timeout_s is at most {run.max_timeout_s:g} seconds")
    for name in ("stdout_max_bytes", "stderr_max_bytes"):
        asked = getattr(args, name)
        if asked is not None and asked > run.command_output_max_bytes:
            raise InvalidToolArguments(
                f"exec: {name} is at most command_output_max_bytes={run.command_output_max_bytes}"
            )
    return args


def in_sandbox(handle: SandboxHandle, path: str | None) -> str:
    """``path`` as the sandbox names it: absolute as it is, relative (or none) in the results folder."""
    results = handle.policy.sandbox.results_mount_path
    if not path:
        return results
    return path if path.startswith("/") else f"{results.rstrip('/')}/{path}"


def run_command(
    handle: SandboxHandle,
    args: CommandArgs,
    streams: CommandStreams | None = None,
    *,
    control: CallControl | None = None,
) -> CommandResult:
    """Run one command in the conversation's sandbox (see the module docstring; ``args`` as the caller checked
    them: :func:`check_command`); ``control`` cancels it and hears its progress. ``streams.stdin`` is read only
    with ``args.with_input``; ``streams.stdout`` takes the output (no more than its cap) in place of the result's."""
    policy = handle.policy
    timeout_s = args.timeout_s or policy.run.default_timeout_s
    cap = policy.run.command_output_max_bytes
    lock = handle.lock()
    if not acquire_run_lock(lock, control):
        return CommandResult(
            status="cancelled", exit_code=None, stdout=b"", stderr=b"", truncated=False, duration_s=0.0, run_number=0
        )
    try:
        sandbox = handle.start()
        run_number = handle.begin_run(sandbox)
        request = run_request(policy, timeout_s, tuple(args.argv), command=True).model_copy(
            update={
                "command_environment": dict(args.env),
                "with_input": args.with_input,
                "working_dir": in_sandbox(handle, args.cwd),
                "stdout_max_bytes": args.stdout_max_bytes or cap,
                "stderr_max_bytes": args.stderr_max_bytes or cap,
            }
        )
        with span("sandbox.command", {"sandbox_runtime.run.number": run_number}) as running:
            sandbox, (result, verdict, end) = handle.run(
                sandbox,
                request,
                exec_control(control, timeout_s),
                None,
                streams=_capped(streams, request.stdout_max_bytes, args.with_input),
                what=f"command {run_number}",
            )
            outcome = run_outcome(policy, result, verdict, end)
            tend_sandbox(handle, sandbox, result, verdict, run_number, removed=outcome.removed)
            status = outcome.status
            if status in ("ok", "error") and not outcome.removed and quota_breach(handle, result) is not None:
                status = "quota_exceeded"
            if running.is_recording() and status != "ok":
                failed(running, status)
    finally:
        lock.release()
    judged = verdict is not None and verdict.verdict in ("timeout", "output_limit")
    return CommandResult(
        status=status,
        exit_code=None if judged or result.cancelled else result.exit_code,
        stdout=result.stdout[: request.stdout_max_bytes],
        stderr=result.stderr[: request.stderr_max_bytes],
        truncated=status == "output_limit",
        duration_s=result.duration_s,
        run_number=run_number,
    )


def _capped(streams: CommandStreams | None, cap: int, with_input: bool) -> CommandStreams | None:
    """The streams as the channel takes them: the input only for a command that reads it, the sink given no more
    than ``cap`` bytes (the channel's own cap, a backstop, is a little larger)."""
    if streams is None:
        return None
    sink = streams.stdout
    if sink is None:
        return CommandStreams(streams.stdin if with_input else None)
    given = 0

    def take(piece: bytes) -> None:
        nonlocal given
        piece = piece[: cap - given]
        given += len(piece)
        if piece:
            sink(piece)

    return CommandStreams(streams.stdin if with_input else None, take)
