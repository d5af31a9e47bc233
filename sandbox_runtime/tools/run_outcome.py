"""How a ``run_python`` run ended, as one status: a pure function of what its runner, its command and the engine
said (:class:`~sandbox_runtime.sandbox.runs.RunResult`), asked of no engine.

The runner inside the sandbox ends every run it sees through with a verdict line (read by
:func:`~sandbox_runtime.sandbox.run_protocol.read_runner_verdict`): the script exited (its exit code is its own),
the runner stopped it at the time limit or at an output cap, could not confine it, or could not end all it
started. The script cannot forge that record (the runner's docstring says why), so an exit code alone never
means a time limit or a cap: without a record every exit code is the script's own (``ok`` for 0, else
``error``), unless memory explains it. The kernel's OOM counter of the container's cgroup rising during the
run means ``memory_limit``. gVisor ends its whole sandbox when the code exhausts memory or processes; the engine
then records whether its OOM killer did it. A run whose sandbox was removed from outside (``sandbox-runtime
gc``, or by hand) is ``error`` with ``removed`` set. :func:`describe_end` words the end for the model.
"""

from __future__ import annotations

from typing import NamedTuple

from sandbox_runtime.models import RunStatus
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.runs import ExecResult, RunEnd, RunnerVerdict
from sandbox_runtime.store.quota import QuotaUsage

__all__ = ["RunOutcome", "describe_end", "run_outcome"]

_SIGKILL = 9
# where the engine records no OOM kill, a sandbox that ended with memory use sampled this close to the limit
# ran out of it
_MEMORY_NEAR_LIMIT = 0.75


class RunOutcome(NamedTuple):
    status: RunStatus  # never quota_exceeded: only the results store can tell that
    removed: bool  # the sandbox was removed from outside during the run


def run_outcome(policy: Policy, result: ExecResult, verdict: RunnerVerdict | None, end: RunEnd) -> RunOutcome:
    """The status of a finished run: its result with the runner's verdict line taken off, the runner's verdict, and
    the engine's word on its end."""
    if result.cancelled:
        return RunOutcome("cancelled", removed=False)
    if verdict is not None:
        # the runner saw the run through: the sandbox lasted until its end, whatever the script printed (a line
        # like gVisor's word that its sandbox went away is then the script's own text)
        return RunOutcome(_judged(result, verdict, end.oom_rose, end.oom_kills is None), removed=False)
    # the runner did not see the run through (no record): the sandbox was removed or ended, the runner was ended
    # by a signal (the script may send one), or the host's own deadline or cap came first
    if end.removed:
        return RunOutcome("error", removed=True)
    if result.container_died:
        seen = result.memory_bytes_seen or 0
        near_limit = seen >= _MEMORY_NEAR_LIMIT * policy.sandbox.limits.memory_bytes
        return RunOutcome("memory_limit" if end.oom_killed or near_limit else "error", removed=False)
    return RunOutcome(_by_the_host(result, end.oom_rose), removed=False)


def _by_the_host(result: ExecResult, oom_rose: bool) -> RunStatus:
    """What the host itself saw of a run without a verdict: every exit code is the script's own."""
    if result.over_cap is not None:
        return "output_limit"  # the host's own backstop cut the stream
    if oom_rose:
        return "memory_limit"
    if result.deadline_hit:
        return "timeout"  # the host's own deadline: the runner never answered
    return "ok" if result.exit_code == 0 else "error"


def _judged(result: ExecResult, verdict: RunnerVerdict, oom_rose: bool, no_counter: bool) -> RunStatus:
    """The status of a run the runner saw through: its verdict, the host's own backstops, the OOM counter."""
    if verdict.verdict == "output_limit" or result.over_cap is not None:
        return "output_limit"
    if oom_rose:
        return "memory_limit"  # even when the script's parent then exited 0
    if verdict.verdict == "timeout" or result.deadline_hit:
        return "timeout"
    if no_counter and verdict.signal == _SIGKILL:
        # no cgroup counter to ask (e.g. a remote engine): the runner saw SIGKILL end the script, the best sign
        # left (a script that exits 137 itself is not ended by a signal)
        return "memory_limit"
    return "ok" if verdict.verdict == "exited" and result.exit_code == 0 else "error"


def describe_end(
    policy: Policy,
    status: RunStatus,
    result: ExecResult,
    verdict: RunnerVerdict | None,
    *,
    removed: bool,
    timeout_s: float,
    summary: str,
    error_path: str | None,
    stream: str | None,
    output_path: str | None,
    breach: QuotaUsage | None,
) -> str:
    """The model's message for a run that did not end ``ok`` or ``cancelled``: why it ended, and the failure
    ``summary`` of its stderr where the script's own error is the story."""
    results = policy.sandbox.results_mount_path
    saved = error_path or "(not saved)"
    if status == "error" and removed:
        text = (
            f"The sandbox was removed while the script ran (by `sandbox-runtime gc` or by hand), which ended the "
            f"run before it finished. The next call starts a fresh sandbox; files the script wrote before that "
            f"stay in {results}. Output so far: {saved}."
        )
    elif status == "error" and result.container_died:
        limits = policy.sandbox.limits
        text = (
            f"The sandbox ended while the script ran: it reached a resource limit (at most {limits.pids_max:,} "
            f"processes and threads, {limits.memory_bytes:,} bytes of memory). Start fewer processes or use less "
            f"memory. A fresh sandbox starts with the next call; the results folder is unchanged. "
            f"Full output: {saved}."
        )
    elif status == "error" and verdict is not None and verdict.verdict == "not_started":
        said = result.stderr.decode(errors="replace").strip()
        reason = said.splitlines()[-1].removeprefix("sandbox-runtime: ") if said else ""
        text = (
            f"Not run: {reason or 'the sandbox could not confine the script'}. This is a fault of the sandbox, "
            f"not of the script; `sandbox-runtime doctor` checks the sandbox."
        )
    elif status == "error" and verdict is not None and verdict.verdict == "left_running":
        text = (
            f"A process the script started could not be ended after the run (it outlived SIGKILL), so the "
            f"sandbox was restarted, which ended it; files the script wrote stay in {results}. Full output: "
            f"{saved}."
        )
    elif status == "timeout":
        text = (
            f"Stopped at the time limit of {timeout_s:g} s (timeout_s); every process of the run was "
            f"ended. Make the script faster or pass a larger timeout_s (at most "
            f"{policy.run.max_timeout_s:g} s). {summary}"
        )
    elif status == "memory_limit":
        text = (
            f"Killed: the run used more than the memory limit of {policy.sandbox.limits.memory_bytes:,} "
            f"bytes. Process the data in smaller pieces (stream rows instead of loading them all). {summary}"
        )
    elif status == "output_limit":
        cap = policy.run.stdout_max_bytes if stream == "stdout" else policy.run.stderr_max_bytes
        text = (
            f"Killed: the run printed more than {cap:,} bytes on {stream} (the cap). Write large output "
            f"to a file in {results} instead of printing it. The first {cap:,} "
            f"bytes are in {output_path or '(not saved: the results folder is full)'}."
        )
    elif status == "quota_exceeded" and breach is not None:
        text = (
            f"The results folder is full: {breach.used_bytes:,} of {breach.limit_bytes:,} bytes used "
            f"(the conversation's disk quota). Delete files you no longer need and run again. {summary}"
        )
    else:
        text = summary  # the script's own error
    return text
