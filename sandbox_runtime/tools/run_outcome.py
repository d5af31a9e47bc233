"""How a ``run_python`` run ended, as one status, from what its command and the engine say.

The runner inside the sandbox exits 124 at the time limit and 125 at an output cap; the kernel's OOM counter of
the container's cgroup rising during the run means ``memory_limit``. gVisor ends its whole sandbox when the code
exhausts memory or processes; the engine then records whether its OOM killer did it. A run whose sandbox was
removed from outside (``sandbox-runtime gc``, or by hand) is ``error`` with ``removed`` set.
"""

from __future__ import annotations

import time
from typing import Literal, NamedTuple

from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import ExecResult, SandboxBackend

__all__ = ["RunOutcome", "RunStatus", "run_outcome"]

RunStatus = Literal["ok", "error", "timeout", "memory_limit", "output_limit", "quota_exceeded", "cancelled"]
_RUNNER_TIMEOUT_EXIT = 124
_RUNNER_OUTPUT_LIMIT_EXIT = 125
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
    timeout_s: float,
    oom_before: int | None,
) -> RunOutcome:
    """The status of a finished command; ``oom_before`` is the container's OOM kill count before it ran."""
    oom_after = None if result.container_died else backend.oom_kill_count(container_id)
    oom_rose = oom_before is not None and oom_after is not None and oom_after > oom_before
    end = _how_it_ended(backend, container_id, result) if _ended_abruptly(result, oom_rose) else None
    if result.cancelled:
        return RunOutcome("cancelled", removed=False)
    if end is not None and end.removed:
        return RunOutcome("error", removed=True)
    if result.container_died:
        seen = result.memory_bytes_seen or 0
        near_limit = seen >= _MEMORY_NEAR_LIMIT * policy.sandbox.limits.memory_bytes
        return RunOutcome("memory_limit" if (end is not None and end.oom_killed) or near_limit else "error", False)
    return RunOutcome(_classify(result, timeout_s, oom_before, oom_after), removed=False)


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


def _classify(result: ExecResult, timeout_s: float, oom_before: int | None, oom_after: int | None) -> RunStatus:
    if result.over_cap is not None or result.exit_code == _RUNNER_OUTPUT_LIMIT_EXIT:
        return "output_limit"
    if oom_before is not None and oom_after is not None and oom_after > oom_before:
        return "memory_limit"
    if result.deadline_hit or (result.exit_code == _RUNNER_TIMEOUT_EXIT and result.duration_s >= timeout_s):
        return "timeout"
    if oom_after is None and result.exit_code == 137:
        return "memory_limit"  # no cgroup counter to ask (e.g. some gVisor set-ups): SIGKILL is the best sign
    return "ok" if result.exit_code == 0 else "error"
