"""One owner of concurrency: every parallel call of a runtime runs in its one pool (never more at once than the
policy's ``tools.parallel_calls_max``), its background jobs and pool stop when it closes, and each conversation
has its own locks: one conversation's volume being made holds up no other, and many conversations can start at
once."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime import CallControl, ToolCall
from sandbox_runtime.policy import policy_from_mapping
from sandbox_runtime.store.quota import attached_loop_images
from tests.conftest import SESSION, TEST_LABEL, RuntimeFactory

WAIT_S = 60.0
OBJECT: dict[str, Any] = {"type": "object"}


class Gate:
    """A host tool that waits until released and counts how many of its calls are in flight at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.guard = threading.Condition()
        self.running = 0
        self.most = 0
        self.threads: set[str] = set()

    def __call__(self, arguments: dict[str, Any]) -> str:
        with self.guard:
            self.running += 1
            self.most = max(self.most, self.running)
            self.threads.add(threading.current_thread().name)
            self.guard.notify_all()
        assert self.release.wait(WAIT_S)
        with self.guard:
            self.running -= 1
        return "through"

    def wait_until_running(self, count: int) -> bool:
        with self.guard:
            return self.guard.wait_for(lambda: self.running >= count, timeout=WAIT_S)


def _turn(conversation: str, calls: int) -> list[ToolCall]:
    return [ToolCall(tool="gate", call_id=f"{conversation}-{i}") for i in range(calls)]


def test_every_turns_parallel_calls_share_one_pool_that_never_runs_more_than_its_cap(
    fake_runtime_factory: RuntimeFactory,
) -> None:
    runtime = fake_runtime_factory(policy_from_mapping({"tools": {"parallel_calls_max": 3}}))
    gate = Gate()
    runtime.register_tool("gate", gate, description="Wait for the gate.", input_schema=OBJECT)
    turns = [
        threading.Thread(target=lambda c=c: runtime.conversation(c).run_turn(_turn(c, 2))) for c in ("a", "b", "c", "d")
    ]
    for turn in turns:
        turn.start()
    assert gate.wait_until_running(3), "the pool never ran three calls at once"
    gate.release.set()
    for turn in turns:
        turn.join(WAIT_S)
    assert not any(turn.is_alive() for turn in turns)
    assert gate.most == 3  # eight calls of four turns, never more than the cap at once
    assert all(name.startswith(runtime.workers.thread_prefix) for name in gate.threads)
    assert len(gate.threads) <= 3
    for conversation in ("a", "b", "c", "d"):
        assert all(d.text == "through" for d in runtime.conversation(conversation).decisions())


def test_closing_a_runtime_ends_its_jobs_and_its_pool(fake_runtime_factory: RuntimeFactory) -> None:
    runtime = fake_runtime_factory(reap_interval_s=0.05, retention_interval_s=0.05)
    gate = Gate()
    gate.release.set()
    runtime.register_tool("gate", gate, description="Pass.", input_schema=OBJECT)
    runtime.conversation("jobs").run_turn(_turn("jobs", 3))
    prefix = runtime.workers.thread_prefix
    assert any(t.name.startswith(prefix) for t in threading.enumerate())
    runtime.close()
    left = [t for t in threading.enumerate() if t.name.startswith(prefix)]
    for thread in left:
        thread.join(WAIT_S)  # idle pool workers end as soon as they see the shutdown
    assert [t.name for t in left if t.is_alive()] == []


def _hold_lock_elsewhere(path: Path) -> subprocess.Popen[str]:
    """Another process holding a conversation's host-wide lock, as one making or mounting its volume would."""
    program = (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    ready, _, _ = select.select([holder.stdout], [], [], WAIT_S)
    assert ready, "the other process never took the lock"
    assert holder.stdout.readline() == "held\n"
    return holder


@pytest.mark.process
def test_a_conversation_whose_volume_another_process_is_mounting_holds_up_no_other_conversation(
    fake_runtime_factory: RuntimeFactory,
) -> None:
    runtime = fake_runtime_factory()
    (runtime.state_dir / "locks").mkdir(mode=0o700, exist_ok=True)
    holder = _hold_lock_elsewhere(runtime.state_dir / "locks" / "slow.lock")
    slow_done = threading.Event()

    def open_slow() -> None:
        assert runtime.conversation("slow").folders.results.is_dir()
        slow_done.set()

    try:
        slow = threading.Thread(target=open_slow)
        slow.start()
        quick = runtime.conversation("quick").run_python("print('not held up')")
        assert (quick.status, quick.stdout) == ("ok", "not held up\n")
        assert not slow_done.is_set()  # still waiting for the other process: its lock is the conversation's own
    finally:
        holder.communicate("\n", timeout=WAIT_S)  # lets go of the lock and ends
    assert slow_done.wait(WAIT_S)
    slow.join(WAIT_S)
    assert runtime.conversation("slow").run_python("print('then it ran')").stdout == "then it ran\n"


def test_many_conversations_starting_at_once_each_get_their_own_sandbox_and_one_mount(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory()
    names = [f"crowd-{i:02d}" for i in range(12)]
    start = threading.Barrier(len(names), timeout=WAIT_S)
    outcomes: dict[str, list[str]] = {}

    def first_turn(name: str) -> None:
        conversation = runtime.conversation(name)
        start.wait()
        turn = conversation.run_turn(
            [
                ToolCall(tool="run_python", arguments={"code": f"print('{name}')"}, call_id="run"),
                ToolCall(tool="write_file", arguments={"path": "note.txt", "content": name}, call_id="note"),
            ]
        )
        outcomes[name] = [o.text for o in turn.outcomes if o.is_error]

    threads = [threading.Thread(target=first_turn, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 2)
    assert not any(thread.is_alive() for thread in threads)
    assert outcomes == {name: [] for name in names}
    containers = {name: runtime.conversation(name).sandbox().container_id for name in names}
    assert len(set(containers.values())) == len(names)
    for name in names:
        folders = runtime.conversation(name).folders
        assert (folders.results / "note.txt").read_text() == name
        if folders.quota_mode == "loop":
            assert len(attached_loop_images().get(os.path.realpath(folders.volume), [])) == 1


SPAN_SCRIPT = """
import time
with open('/mnt/results/spans.txt', 'a') as spans:
    spans.write('start\\n')
time.sleep(0.8)
with open('/mnt/results/spans.txt', 'a') as spans:
    spans.write('end\\n')
"""
OTHER_PROCESS = """
import sys
from sandbox_runtime.api.runtime import Runtime
state, image, label, value, script = sys.argv[1:6]
with Runtime(state, image=image, extra_labels={label: value}, reap_interval_s=None, retention_interval_s=None) as rt:
    conversation = rt.conversation("shared")
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(3):
        print(conversation.run_python(script).status, flush=True)
"""


def test_two_processes_run_one_conversations_code_one_run_at_a_time(
    runtime_factory: RuntimeFactory, executor_image: str, tmp_path: Path
) -> None:
    """Two processes on one state folder (two Python API hosts, or two serve replicas) using one conversation:
    its runs never overlap, so neither ends the other's run, and every run finishes."""
    state = tmp_path / "state"
    runtime = runtime_factory(state_dir=state)
    conversation = runtime.conversation("shared")
    assert conversation.run_python("print('started')").status == "ok"
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_PROCESS, str(state), executor_image, TEST_LABEL, SESSION, SPAN_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert other.stdout is not None
    ready, _, _ = select.select([other.stdout], [], [], WAIT_S)
    assert ready, "the other process did not start"
    assert other.stdout.readline() == "ready\n"
    statuses = []
    try:
        assert other.stdin is not None
        other.stdin.write("go\n")
        other.stdin.flush()
        statuses = [conversation.run_python(SPAN_SCRIPT).status for _ in range(3)]
        theirs, _ = other.communicate(timeout=WAIT_S)
    finally:
        if other.poll() is None:
            other.kill()
            other.wait(WAIT_S)
    assert statuses == ["ok"] * 3
    assert theirs.split() == ["ok"] * 3
    spans = (conversation.folders.results / "spans.txt").read_text().split()
    assert spans == ["start", "end"] * 6  # one run at a time: never two starts in a row


@pytest.mark.process
def test_a_run_waits_while_another_process_runs_in_its_conversation_and_a_cancel_ends_the_wait(
    fake_runtime_factory: RuntimeFactory,
) -> None:
    runtime = fake_runtime_factory()
    conversation = runtime.conversation("busy")
    assert conversation.run_python("print('first')").status == "ok"
    holder = _hold_lock_elsewhere(runtime.state_dir / "locks" / "busy.run.lock")  # another process's run
    outcomes = []
    try:
        control = CallControl()
        waiting = threading.Thread(
            target=lambda: outcomes.append(conversation.call("run_python", {"code": "print('late')"}, control=control))
        )
        waiting.start()
        control.cancel()  # it cannot have started: the other process holds the conversation's runs
        waiting.join(WAIT_S)
        assert not waiting.is_alive()
        assert conversation.call("write_file", {"path": "note.txt", "content": "not held up"}).is_error is False
    finally:
        holder.communicate("\n", timeout=WAIT_S)
    [cancelled] = outcomes
    assert "Cancelled by the caller before it started" in cancelled.text
    assert conversation.run_python("print('then it ran')").stdout == "then it ran\n"
