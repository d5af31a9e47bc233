"""What a command or a run gave back across the backend seam, as data: the records tools read, and how the engine's
word on a run's end is gathered (:func:`settle_end`, used by every backend with its own timings); and the streams a
caller gives a command (:class:`CommandStreams`).

A run's end has three sources, and a tool needs all three to say how it ended
(:func:`~sandbox_runtime.tools.run_outcome.run_outcome`, a pure function of them):

- :class:`ExecResult`: what the command printed and how its stream ended (exit code, caps, deadline, the
  container's first process ending, a cancel);
- :class:`RunnerVerdict`: the in-sandbox runner's own record, which the script cannot forge (None when the runner
  did not see the run through);
- :class:`RunEnd`: what the engine says — OOM kills in the sandbox during the run, the sandbox removed from
  outside, the sandbox itself ended by the OOM killer. Asked of the engine only as far as needed, and settled
  with the engine's own timings (an engine records a removal's kill, or a sandbox's exit, a moment after the
  run's stream ended).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CommandInput",
    "CommandStreams",
    "EndSettling",
    "ExecResult",
    "OutputSink",
    "RunEnd",
    "RunResult",
    "RunnerOutput",
    "RunnerVerdict",
    "VerdictName",
    "settle_end",
]


CommandInput = Iterator[bytes]  # a command's standard input, chunk by chunk (an empty chunk is skipped)
OutputSink = Callable[[bytes], None]  # takes a command's standard output piece by piece, as it comes


class CommandStreams(NamedTuple):
    """A command's streams as the caller gives them: ``stdin`` (read only with the request's ``with_input``, chunk
    by chunk as the command takes it, never held whole) and ``stdout``, a sink that takes the output as it comes
    (up to the cap, which still holds) in place of the result's ``stdout``, then empty."""

    stdin: CommandInput | None = None
    stdout: OutputSink | None = None


_GONE_STATES = frozenset({"removing", "dead"})
_POLL_S = 0.02


class ExecResult(BaseModel):
    """What one command did. ``exit_code`` is None when it was still running at the deadline or cap."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    stdout_bytes_total: int = Field(description="Bytes seen on stdout, including any past the cap.")
    stderr_bytes_total: int
    over_cap: Literal["stdout", "stderr"] | None = None
    deadline_hit: bool = False
    container_died: bool = Field(False, description="The container's first process ended during the command.")
    memory_bytes_seen: int | None = Field(None, description="Highest cgroup memory use sampled during the command.")
    pids_seen: int | None = Field(None, description="Highest cgroup pids count sampled during the command.")
    cancelled: bool = Field(
        False,
        description="The caller cancelled the command: every process of its uid was ended (or, set before it "
        "started, it never ran).",
    )
    duration_s: float

    @classmethod
    def cancelled_before_start(cls) -> ExecResult:
        """The result of a command cancelled before it began: nothing ran."""
        return cls(
            exit_code=None,
            stdout=b"",
            stderr=b"",
            stdout_bytes_total=0,
            stderr_bytes_total=0,
            cancelled=True,
            duration_s=0.0,
        )


VerdictName = Literal["exited", "timeout", "output_limit", "not_started", "left_running"]


class RunnerVerdict(NamedTuple):
    """How the in-sandbox runner says a run ended (see ``_data/images/executor/run.py``)."""

    verdict: VerdictName
    signal: int | None  # ``exited``: the signal that ended the script, if one did
    stream: Literal["stdout", "stderr"] | None  # ``output_limit``: the stream that passed its cap


class RunnerOutput(NamedTuple):
    """What a run's channel gave back: the run as the script made it (the runner's own words taken off), and the
    runner's verdict (None: the runner did not see the run through, or the caller cancelled it)."""

    result: ExecResult
    verdict: RunnerVerdict | None


class RunEnd(NamedTuple):
    """What the engine says of a run's end (see the module text)."""

    oom_kills: int | None  # processes the kernel's OOM killer ended in the sandbox during the run; None: no counter
    removed: bool = False  # the sandbox was removed (or was being removed) from outside during the run
    oom_killed: bool = False  # the sandbox itself ended, and the engine recorded the OOM killer ending it

    @property
    def oom_rose(self) -> bool:
        return (self.oom_kills or 0) > 0


class RunResult(NamedTuple):
    """A whole run: what the script did, the runner's verdict, and the engine's word on its end."""

    result: ExecResult
    verdict: RunnerVerdict | None
    end: RunEnd


class _Container(Protocol):
    @property
    def status(self) -> str: ...

    @property
    def running(self) -> bool: ...

    @property
    def oom_killed(self) -> bool: ...


class EndSettling(Protocol):
    """What :func:`settle_end` asks of an engine (a :class:`~sandbox_runtime.sandbox.backend.SandboxBackend`)."""

    def inspect(self, container_id: str) -> _Container | None: ...

    def oom_kill_count(self, container_id: str) -> int | None: ...


def settle_end(
    engine: EndSettling,
    container_id: str,
    output: RunnerOutput,
    oom_before: int | None,
    *,
    removal_settle_s: float,
    sandbox_end_settle_s: float,
    stops_before_removal: bool = False,
) -> RunEnd:
    """The engine's word on a finished run's end. The OOM counter is read again unless the sandbox itself ended
    (then its own record tells); the engine is asked whether the sandbox was removed or ended only when the run
    ended abruptly (the container died, the stream ended with no exit code, or a signal ended the runner with no
    OOM kill to explain it), for at most ``sandbox_end_settle_s`` (the container died) or ``removal_settle_s``.
    ``stops_before_removal``: the engine shows a removal only once it has stopped the container (Podman), so a
    stopped sandbox that no OOM kill explains is watched until it is gone or the time is up."""
    result, verdict = output
    if result.cancelled:
        return RunEnd(oom_kills=None)
    after = None if verdict is None and result.container_died else engine.oom_kill_count(container_id)
    kills = None if after is None else (after - oom_before if oom_before is not None else 0)
    end = RunEnd(oom_kills=kills)
    if verdict is not None or not _ended_abruptly(result, end.oom_rose):
        return end
    deadline = time.monotonic() + (sandbox_end_settle_s if result.container_died else removal_settle_s)
    while True:
        info = engine.inspect(container_id)
        if info is None or info.status in _GONE_STATES:
            return end._replace(removed=True)
        settled = not info.running and (info.oom_killed or not stops_before_removal)
        if settled or time.monotonic() >= deadline:
            return end._replace(oom_killed=info.oom_killed)
        time.sleep(_POLL_S)


def _ended_abruptly(result: ExecResult, oom_rose: bool) -> bool:
    if result.container_died:
        return True
    if result.exit_code is None:
        return not result.deadline_hit and result.over_cap is None
    return result.exit_code > 128 and not oom_rose
