"""How a ``run_python`` run ended, as one status, from what its runner, its command and the engine say.

The runner inside the sandbox ends every run it sees through with a verdict record (read by
:func:`~sandbox_runtime.sandbox.profile.read_runner_verdict`): the script exited (its exit code is its own),
the runner stopped it at the time limit or at an output cap, could not confine it, or could not end all it
started. The script cannot forge that record (the runner's docstring says why), so an exit code alone never
means a time limit or a cap: without a record every exit code is the script's own (``ok`` for 0, else
``error``), unless memory explains it. The kernel's OOM counter of the container's cgroup rising during the
run means ``memory_limit``. gVisor ends its whole sandbox when the code exhausts memory or processes; the engine
then records whether its OOM killer did it. A run whose sandbox was removed from outside (``sandbox-runtime
gc``, or by hand) is ``error`` with ``removed`` set. :func:`describe_end` words the end for the model.
"""

from __future__ import annotations

import time
from typing import Literal, NamedTuple

from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import ExecResult, SandboxBackend
from sandbox_runtime.sandbox.profile import RunnerVerdict
from sandbox_runtime.store.quota import QuotaUsage

__all__ = ["RunOutcome", "RunStatus", "describe_end", "run_outcome"]

RunStatus = Literal["ok", "error", "timeout", "memory_limit", "output_limit", "quota_exceeded", "cancelled"]
_SIGKILL = 9
# where the engine records no OOM kill, a sandbox that ended with memory use sampled this close to the limit
# ran out of it
_MEMORY_NEAR_LIMIT = 0.75
# a run ended by a signal: how long the engine is asked whether the container is being removed (docker marks
# the removal before it kills, but shows it only once the kill is recorded)
_REMOVAL_SETTLE_S = 1.0
# a sandbox that ended during a run: how long the engine is given to record its exit (and an OOM kill)
_SANDBOX_END_SETTLE_S = 3.0
_REMOVAL_POLL_S = 0.02
_GONE_STATES = frozenset({"removing", "dead"})


class RunOutcome(NamedTuple):
    status: RunStatus  # never quota_exceeded: only the results store can tell that
    removed: bool  # the sandbox was removed from outside during the run


class _End(NamedTuple):
    removed: bool  # the container is gone or being removed (``gc``, or by hand)
    oom_killed: bool  # the engine recorded the kernel's OOM kill (gVisor's sandbox at its memory limit)


def run_outcome(
    backend: SandboxBackend,
    policy: Policy,
    container_id: str,
    result: ExecResult,
    verdict: RunnerVerdict | None,
    oom_before: int | None,
) -> RunOutcome:
    """The status of a finished command (its result with the runner's record taken off, and the runner's
    verdict); ``oom_before`` is the container's OOM kill count before it ran."""
    if result.cancelled:
        return RunOutcome("cancelled", removed=False)
    if verdict is not None:
        # the runner saw the run through: the sandbox lasted until its end, whatever the script printed (a line
        # like gVisor's word that its sandbox went away is then the script's own text)
        oom_after = backend.oom_kill_count(container_id)
        return RunOutcome(_judged(result, verdict, _rose(oom_before, oom_after), oom_after is None), removed=False)
    return _without_verdict(backend, policy, container_id, result, oom_before)


def _without_verdict(
    backend: SandboxBackend, policy: Policy, container_id: str, result: ExecResult, oom_before: int | None
) -> RunOutcome:
    """A run the runner did not see through (no record): the sandbox was removed or ended, the runner was ended
    by a signal (the script may send one), or the host's own deadline or cap came first."""
    oom_after = None if result.container_died else backend.oom_kill_count(container_id)
    oom_rose = _rose(oom_before, oom_after)
    end = _how_it_ended(backend, container_id, result) if _ended_abruptly(result, oom_rose) else None
    if end is not None and end.removed:
        return RunOutcome("error", removed=True)
    if result.container_died:
        seen = result.memory_bytes_seen or 0
        near_limit = seen >= _MEMORY_NEAR_LIMIT * policy.sandbox.limits.memory_bytes
        return RunOutcome("memory_limit" if (end is not None and end.oom_killed) or near_limit else "error", False)
    return RunOutcome(_by_the_host(result, oom_rose), removed=False)


def _by_the_host(result: ExecResult, oom_rose: bool) -> RunStatus:
    """What the host itself saw of a run without a verdict: every exit code is the script's own."""
    if result.over_cap is not None:
        return "output_limit"  # the host's own backstop cut the stream
    if oom_rose:
        return "memory_limit"
    if result.deadline_hit:
        return "timeout"  # the host's own deadline: the runner never answered
    return "ok" if result.exit_code == 0 else "error"


def _rose(oom_before: int | None, oom_after: int | None) -> bool:
    return oom_before is not None and oom_after is not None and oom_after > oom_before


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


def _ended_abruptly(result: ExecResult, oom_rose: bool) -> bool:
    """Whether the run's end may have been the sandbox's removal: the container died, the stream ended without
    an exit code, or a signal ended the runner with no out-of-memory kill to explain it."""
    if result.cancelled:
        return False
    if result.container_died:
        return True
    if result.exit_code is None:
        return not result.deadline_hit and result.over_cap is None
    return result.exit_code > 128 and not oom_rose


def _how_it_ended(backend: SandboxBackend, container_id: str, result: ExecResult) -> _End:
    """What the engine says of a run's abrupt end: removed from outside, or ended in place (gVisor ends its
    sandbox at memory or pids exhaustion, the container stays, and the engine records an OOM kill). Bounded:
    the engine records the removal's kill, or the sandbox's exit, a moment after the run's stream ended."""
    deadline = time.monotonic() + (_SANDBOX_END_SETTLE_S if result.container_died else _REMOVAL_SETTLE_S)
    while True:
        info = backend.inspect(container_id)
        if info is None or info.status in _GONE_STATES:
            return _End(removed=True, oom_killed=False)
        if not info.running or time.monotonic() >= deadline:
            return _End(removed=False, oom_killed=info.oom_killed)
        time.sleep(_REMOVAL_POLL_S)


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
