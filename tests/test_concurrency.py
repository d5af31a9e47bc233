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

from sandbox_runtime import ToolCall
from sandbox_runtime.policy import policy_from_mapping
from sandbox_runtime.store.quota import attached_loop_images
from tests.conftest import RuntimeFactory

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
