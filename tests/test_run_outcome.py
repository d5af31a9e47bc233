"""How a run ended is a pure function of what the command did, the runner's verdict and the engine's word on the
end: every status below is judged from data alone, with no engine in reach; and the engine's word is settled by
asking only as far as needed."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_runtime.policy import load_policy
from sandbox_runtime.sandbox.runs import ExecResult, RunEnd, RunnerOutput, RunnerVerdict, settle_end
from sandbox_runtime.tools.run_outcome import RunOutcome, run_outcome

POLICY = load_policy("default")
MEMORY = POLICY.sandbox.limits.memory_bytes


def _result(**fields: Any) -> ExecResult:
    base: dict[str, Any] = {
        "exit_code": 0,
        "stdout": b"",
        "stderr": b"",
        "stdout_bytes_total": 0,
        "stderr_bytes_total": 0,
        "duration_s": 0.1,
    }
    return ExecResult(**{**base, **fields})


EXITED = RunnerVerdict("exited", None, None)
KILLED = RunnerVerdict("exited", 9, None)
COUNTED = RunEnd(oom_kills=0)

CASES: list[tuple[str, ExecResult, RunnerVerdict | None, RunEnd, RunOutcome]] = [
    ("a script that exits 0", _result(), EXITED, COUNTED, RunOutcome("ok", False)),
    ("a script that exits 3", _result(exit_code=3), EXITED, COUNTED, RunOutcome("error", False)),
    ("the runner's time limit", _result(exit_code=None), RunnerVerdict("timeout", None, None), COUNTED,
     RunOutcome("timeout", False)),
    ("the runner's output cap", _result(exit_code=None), RunnerVerdict("output_limit", None, "stdout"), COUNTED,
     RunOutcome("output_limit", False)),
    ("an OOM kill while the parent exits 0", _result(), EXITED, RunEnd(oom_kills=1), RunOutcome("memory_limit", False)),
    ("SIGKILL with no counter to ask", _result(exit_code=137), KILLED, RunEnd(oom_kills=None),
     RunOutcome("memory_limit", False)),
    ("SIGKILL with a counter that did not rise", _result(exit_code=137), KILLED, COUNTED, RunOutcome("error", False)),
    ("a cancel", _result(exit_code=None, cancelled=True), None, RunEnd(oom_kills=None), RunOutcome("cancelled", False)),
    ("removed from outside", _result(exit_code=None), None, RunEnd(oom_kills=0, removed=True),
     RunOutcome("error", True)),
    ("gVisor's sandbox ended by its OOM killer", _result(exit_code=None, container_died=True), None,
     RunEnd(oom_kills=None, oom_killed=True), RunOutcome("memory_limit", False)),
    ("a sandbox that ended near its memory limit", _result(exit_code=None, container_died=True,
     memory_bytes_seen=MEMORY), None, RunEnd(oom_kills=None), RunOutcome("memory_limit", False)),
    ("a sandbox that ended otherwise", _result(exit_code=None, container_died=True), None, RunEnd(oom_kills=None),
     RunOutcome("error", False)),
    ("the host's own deadline", _result(exit_code=None, deadline_hit=True), None, COUNTED,
     RunOutcome("timeout", False)),
    ("the host's own cap", _result(exit_code=None, over_cap="stderr"), None, COUNTED,
     RunOutcome("output_limit", False)),
    ("no record, exit 0", _result(), None, COUNTED, RunOutcome("ok", False)),
]  # fmt: skip


@pytest.mark.parametrize(("result", "verdict", "end", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_runs_status_is_judged_from_data_alone(
    result: ExecResult, verdict: RunnerVerdict | None, end: RunEnd, expected: RunOutcome
) -> None:
    assert run_outcome(POLICY, result, verdict, end) == expected


class _Engine:
    """An engine's answers, and how often it was asked."""

    def __init__(self, count: int | None, states: list[str | None]) -> None:
        self.count = count
        self.states = states
        self.asked = 0

    def oom_kill_count(self, container_id: str) -> int | None:
        return self.count

    def inspect(self, container_id: str) -> Any:
        self.asked += 1
        status = self.states[min(self.asked, len(self.states)) - 1]
        if status is None:
            return None
        return type("Info", (), {"status": status, "running": status == "running", "oom_killed": status == "oom"})()


def _settled(engine: _Engine, result: ExecResult, verdict: RunnerVerdict | None, before: int | None = 0) -> RunEnd:
    return settle_end(engine, "c", RunnerOutput(result, verdict), before, removal_settle_s=5, sandbox_end_settle_s=5)


def test_a_run_the_runner_saw_through_asks_only_the_counter() -> None:
    engine = _Engine(2, ["running"])
    assert _settled(engine, _result(), EXITED, before=1) == RunEnd(oom_kills=1)
    assert engine.asked == 0


def test_an_abrupt_end_asks_the_engine_until_it_says_how() -> None:
    removed = _Engine(0, ["running", "removing"])
    assert _settled(removed, _result(exit_code=137), None) == RunEnd(oom_kills=0, removed=True)
    assert removed.asked == 2
    gone = _Engine(None, [None])
    assert _settled(gone, _result(exit_code=None, container_died=True), None) == RunEnd(None, removed=True)
    ended = _Engine(None, ["oom"])
    assert _settled(ended, _result(exit_code=None, container_died=True), None) == RunEnd(None, oom_killed=True)


def test_an_engine_that_stops_before_it_removes_is_watched_past_the_stop() -> None:
    removed = _Engine(0, ["exited", "exited", None])
    end = settle_end(
        removed,
        "c",
        RunnerOutput(_result(exit_code=137), None),
        0,
        removal_settle_s=5,
        sandbox_end_settle_s=5,
        stops_before_removal=True,
    )
    assert end == RunEnd(oom_kills=0, removed=True)
    assert removed.asked == 3
    killed = _Engine(None, ["oom"])  # an OOM kill explains the stop at once
    end = settle_end(
        killed,
        "c",
        RunnerOutput(_result(exit_code=None, container_died=True), None),
        0,
        removal_settle_s=5,
        sandbox_end_settle_s=5,
        stops_before_removal=True,
    )
    assert end == RunEnd(None, oom_killed=True)
    assert killed.asked == 1


def test_a_cancelled_run_or_a_plain_exit_asks_the_engine_nothing_more() -> None:
    engine = _Engine(0, ["running"])
    assert _settled(engine, _result(exit_code=None, cancelled=True), None) == RunEnd(oom_kills=None)
    assert _settled(engine, _result(exit_code=1), None) == RunEnd(oom_kills=0)
    assert engine.asked == 0
