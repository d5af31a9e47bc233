"""``run_python``: run inline code or a script from the results folder in the conversation's sandbox.

Inline code is first saved as ``scripts/run-NNNN.py`` so that tracebacks name a real file the model can read,
edit and run again by path. Every run ends in exactly one ``status``:

=================  ===========================================================================================
ok                 the script exited 0
error              it exited non-zero or raised; the full stderr is in ``errors/run-NNNN.txt``
timeout            the wall-clock limit ended it (SIGTERM, then SIGKILL after ``kill_grace_s``)
memory_limit       the kernel's OOM killer ended a process of the run (even when the parent then exited 0)
output_limit       stdout or stderr passed its byte cap: the run was killed; what was captured is kept in a file
quota_exceeded     the results folder is full (used and limit in bytes are given)
cancelled          the caller cancelled the call: every process of the run was ended (within 2 s), or, cancelled
                   before it started, nothing ran; files written before that stay
=================  ===========================================================================================

``exit_code`` is the script's own exit status (128 + N when signal N ended it), whatever number it is: only the
runner's verdict line, which the script cannot forge, says a run hit its time limit or an output cap, and
then ``exit_code`` is None (as when the script never ran, or the call was cancelled before it started).

A sandbox removed from outside while a script runs (``sandbox-runtime gc``, or by hand) ends the run with
``error`` and a message saying so; the next call starts a fresh sandbox. With a
:class:`~sandbox_runtime.control.CallControl` the caller hears the run's progress about once a second (seconds
elapsed, of the time limit, and the bytes of output so far) and can cancel it; the conversation's lock is given
up as soon as the run has ended.

Bad arguments raise typed errors (:class:`InvalidToolArguments`, :class:`~sandbox_runtime.errors.PathRejected`);
an unreachable engine raises :class:`~sandbox_runtime.errors.EngineUnavailable`. Failures of the code itself
are results with ``is_error`` set.
"""

from __future__ import annotations

import errno
import logging

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandbox_runtime.control import CallControl
from sandbox_runtime.conversations.handle import SandboxHandle
from sandbox_runtime.errors import InvalidToolArguments, PathNotFound, PathRejected
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.run_protocol import PYTHON, run_request
from sandbox_runtime.spill.shown import spill_threshold_chars
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.telemetry.tracing import Span, failed, span
from sandbox_runtime.tools.base import ScriptTools, ToolContext, ToolReturn, model_arguments
from sandbox_runtime.tools.run_outcome import run_outcome
from sandbox_runtime.tools.run_result import (
    RunPythonResult,
    create_numbered,
    finish,
    not_saved,
    not_started,
)
from sandbox_runtime.tools.run_upkeep import acquire_run_lock, exec_control, quota_breach, tend_sandbox
from sandbox_runtime.tools.script_calls import RunScriptCalls

__all__ = [
    "InvalidToolArguments",
    "RunPythonArgs",
    "RunPythonResult",
    "run_python",
    "run_python_description",
    "run_python_tool",
]

logger = logging.getLogger(__name__)


def run_python_description(policy: Policy) -> str:
    """What the model is told of ``run_python``, with the policy's results folder and spill threshold."""
    results, threshold = policy.sandbox.results_mount_path, spill_threshold_chars(policy.spill, "run_python")
    return (
        "Run Python 3 in this conversation's sandbox (standard library plus openpyxl, python-docx and python-pptx; "
        "no network, no pip). Give `code` for a few lines, or `script_path` for a script saved in the results "
        f"folder ({results}) — edit long scripts there and run them by path instead of retyping them. Files "
        f"written under {results} stay for the conversation. Results over {threshold:,} characters are saved to a "
        "file and you get its path: read data from such paths in your script instead of copying values. A failure "
        "returns the exception line and the path of the full error. A script can call tools itself — use that for "
        "many calls, bodies taken from files or query rows, or one tool's result reshaped into another's arguments, "
        "so the data never passes through you: `import sandbox_tools as tools`; `print(tools.list_tools())` names "
        "those it may call; `r = tools.sql_query(query=...)` gives `r.text`, `r.path` (a saved result's file) and "
        "`r.rows()`; `tools.some_tool(arg=value)` for each call; a failed or refused call raises `tools.ToolError`."
    )


class RunPythonArgs(BaseModel):
    """Arguments of ``run_python``: exactly one of ``code`` or ``script_path``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str | None = Field(None, description="Python source to run (saved as scripts/run-NNNN.py first).")
    script_path: str | None = Field(
        None,
        description="A .py file in the results folder, e.g. /mnt/results/scripts/report.py or scripts/report.py.",
    )
    args: list[str] = Field(default_factory=list, description="Command-line arguments (sys.argv[1:]).")
    timeout_s: float | None = Field(None, gt=0, description="Wall-clock limit in seconds (policy default).")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> RunPythonArgs:
        if (self.code is None) == (self.script_path is None):
            raise ValueError("give exactly one of `code` (inline source) or `script_path` (a file in results)")
        return self


def parse_args(raw: dict[str, object] | RunPythonArgs, policy: Policy) -> RunPythonArgs:
    """Validate arguments against the schema and the policy's caps."""
    args = model_arguments(RunPythonArgs, raw, "run_python")
    run = policy.run
    if args.code is not None and len(args.code.encode("utf-8", "surrogatepass")) > run.inline_code_max_bytes:
        raise InvalidToolArguments(
            f"run_python: `code` is larger than inline_code_max_bytes={run.inline_code_max_bytes}; write it "
            "to a file with write_file and pass script_path"
        )
    if len(args.args) > run.script_args_max_count:
        raise InvalidToolArguments(f"run_python: at most {run.script_args_max_count} entries in `args`")
    if any("\x00" in a for a in args.args):
        raise InvalidToolArguments("run_python: `args` entries must not contain NUL characters")
    if args.timeout_s is not None and args.timeout_s > run.max_timeout_s:
        raise InvalidToolArguments(f"run_python: timeout_s is at most {run.max_timeout_s:g} seconds")
    return args


def _script(root: ResultsRoot, args: RunPythonArgs, run_number: int, max_bytes: int) -> str:
    """The in-sandbox path of the script to run: the given file (checked) or the inline code saved."""
    if args.script_path is not None:
        with root.open_regular(args.script_path, max_bytes=max_bytes):
            pass  # a regular file, beneath the root, not a link: the sandbox may swap it later, which only
            # affects what the sandbox itself runs
        return root.sandbox_path(root.parse(args.script_path))
    # not made durable: the call's arguments are in the execution record, and the script is read at once
    code = (args.code or "").encode("utf-8", "surrogatepass")
    return create_numbered(root, f"scripts/run-{run_number:04d}", ".py", code, durable=False)


def run_python(
    sandbox: SandboxHandle,
    raw_args: dict[str, object] | RunPythonArgs,
    *,
    control: CallControl | None = None,
    scripts: ScriptTools | None = None,
) -> RunPythonResult:
    """Run one script in the conversation's sandbox and classify how it ended; ``control`` cancels the run
    (every process of it ends, status ``cancelled``) and hears its progress. ``scripts`` answers the tool calls
    the script makes with ``sandbox_tools`` (without it, none can be made)."""
    policy = sandbox.policy
    args = parse_args(raw_args, policy)
    timeout_s = args.timeout_s or policy.run.default_timeout_s
    lock = sandbox.lock()
    if not acquire_run_lock(lock, control):
        return not_started(args.script_path)
    try:
        return _run_locked(sandbox, args, timeout_s, control, scripts)
    finally:
        lock.release()  # as soon as the run has ended: the conversation's next call starts at once


def _run_locked(
    handle: SandboxHandle,
    args: RunPythonArgs,
    timeout_s: float,
    control: CallControl | None,
    scripts: ScriptTools | None,
) -> RunPythonResult:
    policy = handle.policy
    sandbox = handle.start()
    root = handle.root()
    run_number = handle.begin_run(sandbox)
    try:
        script = _script(root, args, run_number, policy.store.read_max_bytes)
    except (PathRejected, PathNotFound):
        raise
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        logger.info("saving inline code failed: the results folder is full (%s)", exc)
        usage = handle.usage()
        return not_saved(usage.used_bytes, usage.limit_bytes)
    request = run_request(policy, timeout_s, (PYTHON, script, *args.args))
    with span("sandbox.run", {"sandbox_runtime.run.number": run_number}) as running:
        spans = handle.run_spans()
        calls = RunScriptCalls(scripts, policy.script_tools, script, spans)
        run_control = exec_control(control, timeout_s)
        try:
            sandbox, (result, verdict, end) = handle.run(sandbox, request, run_control, calls, what=f"run {run_number}")
        finally:
            spans.close()
        outcome = run_outcome(policy, result, verdict, end)
        removed = outcome.removed
        tend_sandbox(handle, sandbox, result, verdict, run_number, removed=removed)
        status = outcome.status
        breach = quota_breach(handle, result) if status in ("ok", "error") and not removed else None
        if breach is not None:
            status = "quota_exceeded"
        finished = finish(policy, root, script, run_number, result, verdict, status, timeout_s, breach, removed=removed)
        _mark(running, finished)
    said = calls.summary()
    if said is None:
        return finished
    return finished.model_copy(
        update={"message": f"{finished.message} {said}", "tool_calls": calls.made, "tool_calls_failed": calls.failed}
    )


def _mark(running: Span, finished: RunPythonResult) -> None:
    """How the run ended, on its span: its status and exit code (a failure's exception type, never its text)."""
    if not running.is_recording():
        return
    running.set_attribute("sandbox_runtime.run.status", finished.status)
    if finished.exit_code is not None:
        running.set_attribute("sandbox_runtime.run.exit_code", finished.exit_code)
    if finished.status != "ok":
        error_type = finished.error.type if finished.error is not None else None
        failed(running, error_type or finished.status)


def run_python_tool(ctx: ToolContext, args: RunPythonArgs) -> ToolReturn:
    """The ``run_python`` tool as the pipeline calls it: the run, and its result as the model and the host get it."""
    result = run_python(ctx.sandbox, args, control=ctx.control, scripts=ctx.scripts)
    return ToolReturn(
        content=result.stdout,
        is_error=result.is_error,
        cancelled=result.status == "cancelled",
        note=result.message,
        error_path=result.error_path,
        details=result.model_dump(exclude={"stdout", "message"}),
    )
