"""Turns of calls that arrive one by one: overlapping calls share one budget; one id never runs twice."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime import Runtime, ToolCall, ToolOutcome
from sandbox_runtime.errors import ImageError, InvalidToolArguments
from sandbox_runtime.pipeline.turns import TurnGate
from tests.conftest import RuntimeFactory

WAIT_S = 30.0
OBJECT: dict[str, Any] = {"type": "object"}


class Holder:
    """A host tool that stays in flight until released, so other calls can overlap it."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, arguments: dict[str, Any]) -> str:
        self.calls += 1
        self.inside.set()
        assert self.release.wait(WAIT_S)
        return "held"


class Big:
    """A host tool with a 150,000-character result that counts its calls (a call has joined its turn by then)."""

    def __init__(self) -> None:
        self.called = threading.Semaphore(0)

    def __call__(self, arguments: dict[str, Any]) -> str:
        self.called.release()
        return "b" * 150_000


@pytest.fixture
def runtime(fake_runtime_factory: RuntimeFactory) -> tuple[Runtime, Holder, Big]:
    """A runtime with two host tools; they start no sandbox, so the fake backend serves (no engine needed)."""
    runtime = fake_runtime_factory()
    holder, big = Holder(), Big()
    runtime.register_tool("hold", holder, description="Wait.", input_schema=OBJECT)
    runtime.register_tool("big", big, description="A large result.", input_schema=OBJECT)
    return runtime, holder, big


def run(pool: ThreadPoolExecutor, gate: TurnGate, tool: str, call_id: str) -> Future[tuple[ToolOutcome, Any]]:
    return pool.submit(gate.run, "turns", ToolCall(tool=tool, call_id=call_id))


def while_held(gate: TurnGate, holder: Holder, call_id: str, meanwhile: Callable[[], None]) -> tuple[ToolOutcome, Any]:
    """Run ``hold`` as ``call_id``; while it is in flight run ``meanwhile``; then let it finish."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        held = run(pool, gate, "hold", call_id)
        assert holder.inside.wait(WAIT_S)
        try:
            meanwhile()
        finally:
            holder.release.set()
        return held.result(timeout=WAIT_S)


def test_calls_that_overlap_in_time_share_one_budget(runtime: tuple[Runtime, Holder, Big]) -> None:
    rt, holder, big = runtime
    gate = TurnGate(rt.dispatcher, wait_s=WAIT_S)
    with ThreadPoolExecutor(max_workers=4) as pool:
        held = run(pool, gate, "hold", "h1")
        assert holder.inside.wait(WAIT_S)
        bigs = [run(pool, gate, "big", f"b{n}") for n in range(2)]  # 300,000 characters join the open turn
        assert all(big.called.acquire(timeout=WAIT_S) for _ in bigs)
        holder.release.set()
        outcomes = [f.result(timeout=WAIT_S)[0] for f in (held, *bigs)]
    assert [o.replaced for o in outcomes].count(True) == 1  # one of the two large results gives way
    assert sum(len(o.text) for o in outcomes) <= 200_000
    turns = {d.call_id: d.turn_id for d in rt.conversation("turns").decisions()}
    assert turns["h1"] == turns["b0"] == turns["b1"]

    alone, _report = gate.run("turns", ToolCall(tool="big", call_id="b2"))  # nothing in flight: a turn of its own
    assert not alone.replaced
    assert rt.conversation("turns").decisions()[-1].turn_id != turns["h1"]


def test_the_same_call_id_sent_again_while_it_runs_gets_its_decision_without_running_again(
    runtime: tuple[Runtime, Holder, Big],
) -> None:
    rt, holder, _big = runtime
    gate = TurnGate(rt.dispatcher, wait_s=WAIT_S)
    with ThreadPoolExecutor(1) as pool:
        second: Future[tuple[ToolOutcome, Any]] | None = None

        def send_again() -> None:
            nonlocal second
            second = run(pool, gate, "hold", "same")  # waits for the first one's decision (it holds the claim)
            assert not second.done()

        first, _report = while_held(gate, holder, "same", send_again)
        assert second is not None
        again, _report = second.result(timeout=WAIT_S)
    assert first.text.startswith("held")
    assert again.replayed
    assert again.text == first.text
    assert holder.calls == 1  # the tool ran once
    latest, _report = gate.run("turns", ToolCall(tool="hold", call_id="same"))
    assert latest.replayed
    assert holder.calls == 1


def test_a_call_that_fails_to_start_does_not_hold_up_its_turn(runtime: tuple[Runtime, Holder, Big]) -> None:
    rt, holder, _big = runtime
    gate = TurnGate(rt.dispatcher, wait_s=WAIT_S)

    def bad() -> None:
        with pytest.raises(InvalidToolArguments, match="call id"):
            gate.run("turns", ToolCall(tool="big", call_id="bad\x00id"))

    outcome, report = while_held(gate, holder, "h2", bad)
    assert outcome.text.startswith("held")
    assert [o.call_id for o in report.outcomes] == ["h2"]


def test_a_call_that_fails_in_the_infrastructure_raises_alone_and_its_turn_keeps_the_others(
    runtime_factory: RuntimeFactory,
) -> None:
    rt = runtime_factory(image="sandbox-runtime-test-missing:never-built")  # run_python cannot start a sandbox
    holder = Holder()
    rt.register_tool("hold", holder, description="Wait.", input_schema=OBJECT)
    gate = TurnGate(rt.dispatcher, wait_s=WAIT_S)

    def failing() -> None:
        with pytest.raises(ImageError):
            gate.run("turns", ToolCall(tool="run_python", arguments={"code": "print(1)"}, call_id="py"))

    held, report = while_held(gate, holder, "h3", failing)  # the failure joined h3's turn and raised on its own
    assert held.text.startswith("held")
    assert [o.call_id for o in report.outcomes] == ["h3"]
    assert [d.call_id for d in rt.conversation("turns").decisions()] == ["h3"]
    holder.inside.clear()
    again, _report = gate.run("turns", ToolCall(tool="hold", call_id="h3"))
    assert again.replayed  # decided once: a retry of the turn does not run it again
    assert not holder.inside.is_set()


def test_a_turn_whose_calls_reach_two_replicas_stays_within_one_budget(
    fake_runtime_factory: RuntimeFactory, tmp_path: Path
) -> None:
    """Two runtimes on one state (replicas behind a load balancer): what one showed of a turn counts in the other."""
    gates = []
    for _ in range(2):
        replica = fake_runtime_factory(state_dir=tmp_path / "shared")
        replica.register_tool("big", Big(), description="A large result.", input_schema=OBJECT)
        gates.append(TurnGate(replica.dispatcher, wait_s=WAIT_S))
    first, _report = gates[0].run("turns", ToolCall(tool="big", call_id="b0"), turn_id="T")
    second, report = gates[1].run("turns", ToolCall(tool="big", call_id="b1"), turn_id="T")
    assert not first.replaced
    assert second.replaced  # 150,000 shown on the first replica + 150,000 here is past the 200,000 budget
    assert report.total_before_chars > 200_000
    other, _report = gates[1].run("turns", ToolCall(tool="big", call_id="b2"), turn_id="another")
    assert not other.replaced  # another turn has a budget of its own
