"""What a ``run_python`` run gives back: the result model, and the words and files made for the model.

A failure's full stderr is saved as ``errors/run-NNNN.txt`` and summarised in ``message`` (the exception line
and the innermost frame of the model's own script are always kept); an output cap saves what was captured of
the stream as ``errors/run-NNNN.<stream>.txt``. A name already taken (the sandbox made a file there, or a run
number came round again after a power cut) gets a random suffix: ``errors/run-NNNN-1a2b3c4d.txt``. A file the
quota refuses is left out, with a warning, never an exception.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.errors import PathExists
from sandbox_runtime.models import RunStatus
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.runs import ExecResult, RunnerVerdict
from sandbox_runtime.store.quota import QuotaUsage
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tools.error_summary import FailureSummary, summarize_failure
from sandbox_runtime.tools.run_outcome import describe_end

__all__ = ["RunPythonResult", "ScriptError", "create_numbered", "decode", "finish", "not_saved", "not_started"]

logger = logging.getLogger(__name__)

_NOT_STARTED = "Cancelled by the caller before it started: nothing ran."


class ScriptError(BaseModel):
    """How a failed run ended, as fields: the exception and where the user's own script raised it (the result's
    ``message`` says the same in words, and the error file has the whole traceback)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str | None = Field(
        description="The exception's class as Python printed it (ZeroDivisionError, json.decoder.JSONDecodeError); "
        "None when no Python exception ended the run (a signal, a fatal error, an exit code)."
    )
    message: str = Field(
        description="The exception's message, without its class (cut in its middle when long); without an "
        "exception, the line that says how the run ended."
    )
    file: str | None = Field(None, description="The user's own script the exception was raised in (its path).")
    line: int | None = Field(None, description="The line of that script (its innermost frame in the traceback).")
    signal: int | None = Field(None, description="The signal that ended the script, when one did.")

    @classmethod
    def of(cls, summary: FailureSummary, max_chars: int) -> ScriptError | None:
        """The fields of a failure's summary; None when the run left nothing more to say than its exit code (no
        stderr, no signal)."""
        if not summary.exception_line:
            return None
        frame = summary.user_frame
        return cls(
            type=summary.exception_type,
            message=summary.exception_message(max_chars),
            file=None if frame is None else frame.file,
            line=None if frame is None else frame.line,
            signal=summary.signal_number,
        )


class RunPythonResult(BaseModel):
    """What a run did. ``message`` is the short text for the model; the rest is for the host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: RunStatus
    is_error: bool
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    message: str
    script_path: str
    error_path: str | None = None
    output_path: str | None = None
    stdout_bytes: int
    stderr_bytes: int
    used_bytes: int | None = None
    limit_bytes: int | None = None
    error: ScriptError | None = None  # a failure's exception and where the user's script raised it
    tool_calls: int = 0  # calls the script made with sandbox_tools that reached the pipeline
    tool_calls_failed: int = 0  # of those, the ones that failed or were denied


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def create_numbered(root: ResultsRoot, stem: str, suffix: str, data: bytes, *, durable: bool = True) -> str:
    """Create ``stem + suffix`` (files are never replaced), or ``stem-<8 hex digits> + suffix`` when something
    already holds that name: the sandbox can write there, and a run number lost in a power cut is handed out
    again. Returns the sandbox path."""
    try:
        return root.create_file(stem + suffix, data, durable=durable)
    except PathExists:
        logger.info("%s%s is taken; saving under a fresh name", stem, suffix)
        return root.create_file(f"{stem}-{secrets.token_hex(4)}{suffix}", data, durable=durable)


def save(root: ResultsRoot, stem: str, suffix: str, text: str) -> str | None:
    """Write a file for the model; None (and a warning) when the disk, the quota or the sandbox refuses it."""
    try:
        return create_numbered(root, stem, suffix, text.encode("utf-8", "surrogatepass"))
    except OSError as exc:  # the quota is full, or the sandbox planted a folder at the name
        logger.warning("could not save %s%s: %s", stem, suffix, exc)
        return None


def not_started(script_path: str | None) -> RunPythonResult:
    """A call cancelled before its run started: nothing ran."""
    return RunPythonResult(
        status="cancelled",
        is_error=True,
        exit_code=None,
        stdout="",
        stderr="",
        duration_s=0.0,
        message=_NOT_STARTED,
        script_path=script_path or "(not saved: cancelled before it started)",
        stdout_bytes=0,
        stderr_bytes=0,
    )


def not_saved(used: int, limit: int) -> RunPythonResult:
    """Inline code that could not be saved: the results folder is full."""
    return RunPythonResult(
        status="quota_exceeded",
        is_error=True,
        exit_code=None,
        stdout="",
        stderr="",
        duration_s=0.0,
        message=f"Not run: the code could not be saved because the results folder is full ({used:,} of "
        f"{limit:,} bytes used). Delete files you no longer need (run_python with a short `code` that calls "
        f"os.remove may still fit) and run again.",
        script_path="(not saved: the results folder is full)",
        stdout_bytes=0,
        stderr_bytes=0,
        used_bytes=used,
        limit_bytes=limit,
    )


def finish(
    policy: Policy,
    root: ResultsRoot,
    script: str,
    run_number: int,
    result: ExecResult,
    verdict: RunnerVerdict | None,
    status: RunStatus,
    timeout_s: float,
    breach: QuotaUsage | None,
    *,
    removed: bool = False,
) -> RunPythonResult:
    """The result of a run that ended with ``status``: its output, and for a failure the files and words for the
    model (the full stderr in ``errors/run-NNNN.txt``, the captured stream of an output cap)."""
    stdout = decode(result.stdout[: policy.run.stdout_max_bytes])
    stderr = decode(result.stderr[: policy.run.stderr_max_bytes])
    # the script's own exit status; None when the runner ended the run (or the script never ran)
    exit_code = result.exit_code if verdict is None or verdict.verdict == "exited" else None
    base: dict[str, Any] = dict(
        status=status,
        is_error=status != "ok",
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        duration_s=round(result.duration_s, 3),
        script_path=script,
        stdout_bytes=result.stdout_bytes_total,
        stderr_bytes=result.stderr_bytes_total,
    )
    if status == "ok":
        return RunPythonResult(message=f"Exit code 0 in {result.duration_s:.2f} s.", **base)
    if status == "cancelled":
        error_path = save(root, f"errors/run-{run_number:04d}", ".txt", stderr) if stderr else None
        saved = f" Its stderr so far: {error_path} — read it with read_file." if error_path else ""
        message = (
            f"Cancelled by the caller after {result.duration_s:.1f} s: every process of the run was ended. "
            f"Files it wrote before that stay in {policy.sandbox.results_mount_path}.{saved}"
        )
        return RunPythonResult(message=message, error_path=error_path, **base)
    error_path = save(root, f"errors/run-{run_number:04d}", ".txt", stderr)
    output_path = None
    extra: dict[str, Any] = {}
    summary = summarize_failure(
        stderr,
        exit_code=exit_code,
        by_signal=None if verdict is None else verdict.signal is not None,  # the runner saw how the script ended
        user_path_prefixes=[policy.sandbox.results_mount_path + "/"],
        error_file_path=error_path or "(not saved: the results folder is full)",
        max_chars=policy.run.error_message_max_chars,
    )
    stream = None
    if status == "output_limit":
        stream = result.over_cap or (verdict.stream if verdict is not None else None)
        if stream is None:
            stream = "stdout" if result.stdout_bytes_total > policy.run.stdout_max_bytes else "stderr"
        cap = policy.run.stdout_max_bytes if stream == "stdout" else policy.run.stderr_max_bytes
        output_path = save(
            root,
            f"errors/run-{run_number:04d}",
            f".{stream}.txt",
            decode((result.stdout if stream == "stdout" else result.stderr)[:cap]),
        )
    if breach is not None:
        extra = {"used_bytes": breach.used_bytes, "limit_bytes": breach.limit_bytes}
    message = describe_end(
        policy,
        status,
        result,
        verdict,
        removed=removed,
        timeout_s=timeout_s,
        summary=summary.message,
        error_path=error_path,
        stream=stream,
        output_path=output_path,
        breach=breach,
    )
    return RunPythonResult(
        message=message,
        error_path=error_path,
        output_path=output_path,
        error=ScriptError.of(summary, policy.run.error_message_max_chars),
        **base,
        **extra,
    )
