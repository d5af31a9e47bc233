"""Several runtimes on one state directory: none removes a sandbox (or unmounts a volume) that another live one
holds, whatever options it started with; once that one closes or dies, the others clean up as before. The stories
with sandboxes run on both state stores (SQLite, and PostgreSQL as replicas share it)."""

from __future__ import annotations

import os
import select
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.policy import Policy, load_policy
from sandbox_runtime.processes import process_start
from sandbox_runtime.sandbox.manager import Removal
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.state.leases import LEASE_TTL_S, LeaseRecord, lease_is_alive
from sandbox_runtime.state.location import STATE_URL_VARIABLE
from sandbox_runtime.store.quota import loop_devices
from tests.conftest import SESSION, TEST_LABEL, RuntimeFactory

CHILD_START_TIMEOUT_S = 180  # a fresh process runs the canary self-check before its first sandbox
MiB = 1024 * 1024

# A runtime in a process of its own: it holds a sandbox of one conversation until it is killed.
HOLDER = """
import sys
from sandbox_runtime.api.runtime import Runtime
state_dir, image, label, session, conversation = sys.argv[1:6]
runtime = Runtime(state_dir, "default", image=image, extra_labels={label: session}, reap_interval_s=None,
                  retention_interval_s=None)  # its state: $SANDBOX_RUNTIME_STATE_URL's, or SQLite
result = runtime.conversation(conversation).run_python("open('/mnt/results/kept.txt', 'w').write('kept')")
print(result.status, runtime.conversation(conversation).sandbox().container_id, flush=True)
sys.stdin.read()  # held until the test kills this process
"""


def _smaller_memory() -> Policy:
    return load_policy("default").changed({"sandbox": {"limits": {"memory_bytes": 256 * MiB}}}, "smaller memory")


def _ids(removals: list[Removal]) -> set[str]:
    return {r.container_id for r in removals}


def _released(runtime: Runtime, conversation: str) -> bool:
    folders = runtime.store.folders(conversation)
    return not os.path.ismount(folders.results) and not loop_devices(folders.volume)


@pytest.fixture
def holder(executor_image: str, tmp_path: Path, state_url: str | None) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A ``.venv/bin/python -c`` process holding a sandbox of conversation "held" in ``tmp_path/state`` (its state
    on the test's store); it is killed (SIGKILL, by its own pid) at the end if the test did not kill it."""
    state = tmp_path / "state"
    environment = {k: v for k, v in os.environ.items() if k != STATE_URL_VARIABLE}
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(state), executor_image, TEST_LABEL, SESSION, "held"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment | ({STATE_URL_VARIABLE: state_url} if state_url else {}),
    )
    try:
        yield process, state
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def _first_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    if not ready:
        os.kill(process.pid, signal.SIGKILL)
        pytest.fail(f"the holder printed nothing within {timeout_s} s")
    line = process.stdout.readline()
    if not line:
        assert process.stderr is not None
        process.wait(timeout=30)
        pytest.fail(f"the holder ended: {process.stderr.read()[-4000:]}")
    return line


def test_gc_under_another_policy_leaves_a_live_runtimes_sandbox_alone_until_it_closes(
    state_url: str | None, runtime_factory: RuntimeFactory, executor_image: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = Runtime(
        state,
        "default",
        image=executor_image,
        extra_labels={TEST_LABEL: SESSION},
        reap_interval_s=None,
        retention_interval_s=None,
        state_url=state_url,
    )
    try:
        conversation = first.conversation("shared")
        assert conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')").status == "ok"
        container = conversation.sandbox().container_id
        # its start-up sweep leaves it alone too
        second = runtime_factory(_smaller_memory(), state_dir=state, state_url=state_url)
        assert second.manager.digest != first.manager.digest  # its sandboxes would be shaped otherwise
        assert container not in _ids(second.gc())
        assert container not in _ids(second.conversations.sweep())
        assert container not in _ids(second.conversations.reap())
        real_clock = second.manager.clock
        second.manager.clock = lambda: real_clock() + second.policy.sandbox.max_lifetime_s + 60
        assert container not in _ids(second.conversations.reap())  # idle and old by its clock: still the holder's call
        second.manager.clock = real_clock
        first.state.leases.unhold_container(first.manager.lease.id, "shared")  # as between its start and its claim
        assert container not in _ids(second.gc())  # the label names the live process that started it
        first.state.leases.hold(
            first.manager.lease.id, "shared", first.manager.digest, real_clock(), container_id=container
        )
        info = second.backend.inspect(container)
        assert info is not None
        assert info.running
        assert not _released(first, "shared") or first.store.quota_mode == "measured"
        again = conversation.run_python("print(open('/mnt/results/kept.txt').read())")
        assert (again.status, again.stdout) == ("ok", "kept\n")
        assert conversation.sandbox().container_id == container
    finally:
        first.close()
    removed = {r.container_id: r.reason for r in second.gc()}
    assert removed[container] == "made under another policy"
    assert second.backend.inspect(container) is None
    assert _released(second, "shared")
    assert (second.conversation("shared").folders.results / "kept.txt").read_text() == "kept"


def test_a_sandbox_held_by_another_process_survives_gc_until_that_process_is_killed(
    state_url: str | None, runtime_factory: RuntimeFactory, holder: tuple[subprocess.Popen[str], Path]
) -> None:
    process, state = holder
    status, container = _first_line(process, CHILD_START_TIMEOUT_S).split()
    assert status == "ok"
    other = runtime_factory(_smaller_memory(), state_dir=state, state_url=state_url)
    assert process.pid in {lease.pid for lease in other.state.leases.live()}
    assert container not in _ids(other.gc())
    assert container not in _ids(other.conversations.sweep())
    info = other.backend.inspect(container)
    assert info is not None
    assert info.running
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    removed = {r.container_id: r.reason for r in other.gc()}
    assert removed[container] == "made under another policy"
    assert other.backend.inspect(container) is None
    assert process.pid not in {lease.pid for lease in other.state.leases.registered()}  # the dead lease is cleaned up
    assert [h.lease_id for h in other.state.leases.holds(conversation_id="held")] == []
    assert _released(other, "held")
    assert other.conversation("held").run_python("print(open('/mnt/results/kept.txt').read())").stdout == "kept\n"


def test_two_runtimes_sharing_a_sandbox_leave_it_to_the_last_one_that_uses_it(
    state_url: str | None, runtime_factory: RuntimeFactory, executor_image: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = runtime_factory(state_dir=state, state_url=state_url)
    second = runtime_factory(state_dir=state, state_url=state_url)
    container = first.conversation("both").sandbox().container_id
    assert second.conversation("both").run_python("print(2)").stdout == "2\n"
    assert second.conversation("both").sandbox().container_id == container  # re-attached, not a second one
    idle = first.policy.sandbox.idle_timeout_s + 60
    real_first, real_second = first.manager.clock, second.manager.clock
    first.manager.clock = lambda: real_first() + idle
    assert first.conversations.reap() == []  # idle here, but the other runtime holds it: this one lets go of its claim
    assert first.backend.inspect(container) is not None
    second.manager.clock = lambda: real_second() + idle
    assert _ids(second.conversations.reap()) == {container}  # the last holder reaps it
    assert _released(second, "both")


@pytest.mark.process
def test_a_lease_is_alive_only_while_its_very_process_runs(tmp_path: Path) -> None:
    state = StateDB(tmp_path / "state.sqlite3")
    mine = state.leases.open("digest")
    assert lease_is_alive(mine, LEASE_TTL_S)
    assert mine.process_start == process_start(os.getpid())
    reused = mine.model_copy(update={"process_start": f"{mine.process_start}0"})
    assert not lease_is_alive(reused, LEASE_TTL_S)  # same pid, another start time: a reused pid is another process
    elsewhere = reused.model_copy(update={"host": "another-host"})  # its pid cannot be checked from here: ...
    assert lease_is_alive(elsewhere, LEASE_TTL_S)
    later = mine.started_at + LEASE_TTL_S + 1  # ... it counts as gone once it was not renewed for the ttl
    assert not lease_is_alive(elsewhere, LEASE_TTL_S, now=later)
    assert lease_is_alive(elsewhere.model_copy(update={"renewed_at": later - 1}), LEASE_TTL_S, now=later)

    zombie = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        lease = state.leases.open("digest", pid=zombie.pid)
        assert lease_is_alive(lease, LEASE_TTL_S)
        os.kill(zombie.pid, signal.SIGKILL)
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet waited for: a zombie
        assert process_start(zombie.pid) is None
        assert not lease_is_alive(lease, LEASE_TTL_S)
    finally:
        zombie.wait(timeout=30)
        assert zombie.stdin is not None
        zombie.stdin.close()
    assert not lease_is_alive(lease, LEASE_TTL_S)

    state.leases.hold(lease.id, "c1", "digest", 1.0, container_id="abc")
    state.leases.hold(mine.id, "c1", "digest", 2.0)
    assert [h.lease_id for h in state.leases.live_holds("c1")] == [mine.id]  # the dead one is cleaned up on the way
    assert lease.id not in {row.id for row in state.leases.registered()}
    assert state.leases.holds(lease_id=lease.id) == []
    state.leases.close(mine.id)
    assert state.leases.registered() == []
    assert state.leases.holds(conversation_id="c1") == []


def test_a_hold_keeps_its_container_and_last_use_across_a_short_look(tmp_path: Path) -> None:
    state = StateDB(tmp_path / "state.sqlite3")
    lease = state.leases.open("digest")
    state.leases.hold(lease.id, "c1", "digest", 10.0, use=False)
    assert state.leases.holds(lease_id=lease.id)[0].used_at == 0.0  # a look alone is no use
    state.leases.hold(lease.id, "c1", "digest", 20.0, container_id="abc")
    state.leases.hold(lease.id, "c1", "digest", 30.0, use=False)
    (held,) = state.leases.holds(lease_id=lease.id)
    assert (held.container_id, held.used_at) == ("abc", 20.0)
    state.ensure_conversation("c1", "measured", 1024)
    state.record_sandbox("abc", "c1", 20.0)
    state.mark_removed("abc", "closed")
    assert state.leases.holds(lease_id=lease.id)[0].container_id is None  # a removed container is nobody's any more
    removed = state.sandbox("abc")
    assert removed is not None
    assert removed.removed_reason == "closed"


def test_a_database_from_before_leases_is_migrated_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    old = StateDB(path)
    old.ensure_conversation("from-before", "measured", 1024)
    old.record_sandbox("c0ffee", "from-before", 1.0)
    old.close()
    with sqlite3.connect(path) as db:  # what a database of the previous version holds: no leases, no holds
        db.executescript("DROP INDEX holds_by_conversation; DROP TABLE holds; DROP TABLE leases;")
    reopened = StateDB(path)
    assert [c.id for c in reopened.conversations()] == ["from-before"]
    assert [s.container_id for s in reopened.live_sandboxes()] == ["c0ffee"]
    lease = reopened.leases.open("digest")
    reopened.leases.hold(lease.id, "from-before", "digest", 5.0, container_id="c0ffee")
    assert [h.container_id for h in reopened.leases.live_holds("from-before")] == ["c0ffee"]
    assert isinstance(reopened.leases.registered()[0], LeaseRecord)
    reopened.forget_conversation("from-before")
    assert reopened.leases.holds(conversation_id="from-before") == []
