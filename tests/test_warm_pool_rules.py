"""The warm pool's rules, on the fake backend (no engine): what is kept ready, what is handed out and to whom, how
the pool follows the demand of new conversations within its bounds, when a sandbox is replaced, what happens after
a failed start, which runtimes keep a pool, and what the sweep removes. The same pool on Docker, under runc and
gVisor, is in ``test_warm_pool.py``."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import PolicyError, SandboxError
from sandbox_runtime.policy import Policy, load_policy, policy_from_mapping
from sandbox_runtime.sandbox.backend import ContainerInfo, ContainerSpec
from sandbox_runtime.sandbox.fake.backend import FakeBackend
from sandbox_runtime.sandbox.labels import LABEL_POOL_SLOT
from sandbox_runtime.sandbox.pool import WarmPool
from sandbox_runtime.sandbox.run_protocol import PYTHON, run_request
from tests.conftest import RuntimeFactory

READY_WITHIN_S = 30.0
GiB = 1024**3


@pytest.fixture
def runtime_factory(fake_runtime_factory: RuntimeFactory) -> RuntimeFactory:
    return fake_runtime_factory


def _pool_policy(**pool: object) -> Policy:
    return load_policy("default").changed({"pool": pool}, "a pool for the test")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pool_of(
    runtime: Runtime,
    clock: _Clock,
    memory_available_bytes: int = 8 * GiB,
    cold_starts: list[int] | None = None,
    **pool: object,
) -> WarmPool:
    """A pool tended by the test itself (no job thread), on the runtime's manager and slots, with a test clock, the
    host's available memory, and the conversations' sandboxes starting (``cold_starts[0]``) as the test says."""
    cold = [0] if cold_starts is None else cold_starts
    policy = runtime.policy.pool.model_copy(update=pool)
    request = run_request(runtime.policy, 10.0, (PYTHON, "-c", "pass"))
    return WarmPool(
        runtime.manager,
        policy,
        runtime.conversations.slots,
        request,
        clock=clock,
        memory_available=lambda: memory_available_bytes,
        cold_starts=lambda: cold[0],
    )


def _tended(pool: WarmPool) -> WarmPool:
    """One round of the pool's job, and its starts ended."""
    pool.tend()
    assert pool.wait_for_starts(timeout_s=READY_WITHIN_S)
    return pool


def _filled(pool: WarmPool) -> int:
    """Rounds of the job until the pool holds its target (each round starts at most ``starts_at_once_max``); how
    many sandboxes then wait."""
    for _ in range(64):
        if pool.ready() == pool.target():
            return pool.ready()
        _tended(pool)
    raise AssertionError(f"the pool did not reach its target: {pool.ready()} of {pool.target()}")


def _pooled_containers(runtime: Runtime) -> list[ContainerInfo]:
    return [c for c in runtime.backend.list_containers(runtime.manager.base_labels) if LABEL_POOL_SLOT in c.labels]


def _hands_out_then_ends(pool: WarmPool, container_id: str) -> None:
    taken = pool.take()
    assert taken is not None
    assert taken.container_id == container_id
    pool.discard(taken)
    pool.close()


def test_only_serve_keeps_a_pool_by_default_and_keep_in_decides_for_the_rest(runtime_factory: RuntimeFactory) -> None:
    assert runtime_factory().pool is None  # the Python API by default
    assert runtime_factory(warm_pool=True).pool is not None  # as serve asks for it
    assert runtime_factory(_pool_policy(keep_in="all")).pool is not None
    assert runtime_factory(_pool_policy(keep_in="all"), warm_pool=False).pool is None
    assert runtime_factory(_pool_policy(keep_in="none"), warm_pool=True).pool is None
    assert runtime_factory(_pool_policy(max_ready_count=0, ready_count=0), warm_pool=True).pool is None


def test_a_new_conversation_takes_a_ready_sandbox_whole_and_the_pool_starts_another(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(warm_pool=True)
    assert runtime.pool is not None
    assert runtime.pool.wait_until_ready(timeout_s=READY_WITHIN_S)
    waiting = {c.id for c in _pooled_containers(runtime)}
    assert len(waiting) == runtime.policy.pool.ready_count == 1

    conversation = runtime.conversation("first")
    outcome = conversation.call("run_python", {"code": "open('made-here.txt', 'w').write('x')"})
    assert not outcome.is_error, outcome.text

    sandbox = conversation.sandbox()
    assert sandbox.pooled
    assert sandbox.container_id in waiting
    assert (conversation.folders.results / "made-here.txt").read_text() == "x"  # the slot became its folder
    assert runtime.state.sandbox(sandbox.container_id).conversation_id == "first"  # type: ignore[union-attr]
    assert runtime.pool.wait_until_ready(timeout_s=READY_WITHIN_S)
    assert len({c.id for c in _pooled_containers(runtime)} - {sandbox.container_id} - waiting) == 1

    conversation.close()
    assert runtime.backend.inspect(sandbox.container_id) is None  # ended like any sandbox, never given back
    assert runtime.pool.ready() == 1


def test_a_conversation_with_folders_from_before_never_takes_from_the_pool(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory(warm_pool=True)
    assert runtime.pool is not None
    assert runtime.pool.wait_until_ready(timeout_s=READY_WITHIN_S)
    waiting = {c.id for c in _pooled_containers(runtime)}
    folders = runtime.store.folders("restored")  # folders with no record: restored from a backup, say
    runtime.store.prepare(folders)
    (folders.results / "kept.txt").write_text("kept")

    conversation = runtime.conversation("restored")
    assert conversation.run_python("print(open('kept.txt').read())").stdout.strip() == "kept"
    assert conversation.sandbox().container_id not in waiting
    assert runtime.pool.ready() == 1
    assert runtime.pool.target() == 1  # it never asked the pool


def test_a_pooled_sandbox_that_waited_past_max_wait_s_is_never_handed_out_and_is_replaced(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory()
    clock = _Clock()
    pool = _tended(_pool_of(runtime, clock, ready_count=1, max_wait_s=600))
    (old,) = _pooled_containers(runtime)

    clock.now += 601
    assert pool.take() is None  # stale: not handed out
    clock.now += 1
    _tended(pool)
    (new,) = _pooled_containers(runtime)
    assert new.id != old.id
    assert runtime.backend.inspect(old.id) is None
    _hands_out_then_ends(pool, new.id)


def test_after_a_failed_start_the_pool_waits_retry_after_s_before_it_tries_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Refusing(FakeBackend):
        refuse = True
        starts = 0

        def create_and_start(self, spec: ContainerSpec) -> ContainerInfo:
            self.starts += 1
            if self.refuse:
                raise SandboxError("the engine refused (a test)")
            return super().create_and_start(spec)

    backend = Refusing()
    with Runtime(tmp_path / "state", backend=backend, image="fake", reap_interval_s=None) as runtime:
        clock = _Clock()
        pool = _tended(_pool_of(runtime, clock, ready_count=2, retry_after_s=30.0))
        assert backend.starts == 2  # side by side
        assert pool.ready() == 0
        assert "trying again in 30 s" in caplog.text
        backend.refuse = False
        clock.now += 29
        _tended(pool)
        assert backend.starts == 2  # not yet
        clock.now += 2
        _tended(pool)
        assert backend.starts == 4
        assert pool.ready() == 2
        pool.close()
        assert pool.ready() == 0
        assert _pooled_containers(runtime) == []
        assert not (runtime.state_dir / "pool" / runtime.manager.lease.id).exists()  # slots and their folder gone


def test_a_pooled_sandbox_that_stopped_is_replaced(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory()
    pool = _tended(_pool_of(runtime, _Clock(), ready_count=1))
    (stopped,) = _pooled_containers(runtime)
    runtime.backend.remove(stopped.id)  # as if it died
    _tended(pool)
    (fresh,) = _pooled_containers(runtime)
    assert fresh.id != stopped.id
    _hands_out_then_ends(pool, fresh.id)


def test_the_pool_grows_with_the_new_conversations_of_its_window_up_to_its_ceiling_and_shrinks_back_when_quiet(
    runtime_factory: RuntimeFactory, fake_backend: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = runtime_factory()
    clock, cold = _Clock(), [0]
    pool = _pool_of(
        runtime, clock, cold_starts=cold, ready_count=1, max_ready_count=5, demand_window_s=60, starts_at_once_max=2
    )
    assert _filled(pool) == 1  # quiet: the floor

    taken = [pool.take() for _ in range(4)]  # a burst of four new conversations: one hit, three misses
    assert sum(t is not None for t in taken) == 1
    assert pool.target() == 4
    assert _tended(pool).ready() == 0  # while new conversations ask, the pool starts nothing: the burst goes first
    clock.now += 0.25
    assert _tended(pool).ready() == 1  # a moment later, back to its floor
    clock.now += 0.75  # the asks settled ...
    cold[0] = 3
    assert _tended(pool).ready() == 1  # ... but the three that found none ready are still starting theirs
    cold[0] = 0
    meeting, start = threading.Barrier(2, timeout=READY_WITHIN_S), fake_backend.create_and_start

    def side_by_side(spec: ContainerSpec) -> ContainerInfo:
        meeting.wait()  # broken (the start fails) unless two starts are under way at once
        return start(spec)

    monkeypatch.setattr(fake_backend, "create_and_start", side_by_side)
    assert _tended(pool).ready() == 3  # it grows: two more, side by side (starts_at_once_max)
    monkeypatch.undo()
    assert _filled(pool) == 4  # the next burst of four finds them ready

    clock.now += 29
    for _ in range(4):
        pool.take()
    assert pool.target() == 5  # eight asks in the window: the ceiling
    clock.now += 1
    assert _filled(pool) == 5
    assert len(_pooled_containers(runtime)) == 5 + 5  # the five waiting, and the five taken (never given back)

    clock.now += 31  # the first burst's asks left the window: four remain
    assert pool.target() == 4
    assert _filled(pool) == 4
    clock.now += 60  # quiet for a whole window
    assert pool.target() == 1
    _tended(pool)
    assert pool.ready() == 1
    waiting = [c for c in _pooled_containers(runtime) if not any(t and t.container_id == c.id for t in taken)]
    assert len(waiting) == 1 + 4  # the one the pool keeps, and the second burst's four (taken)
    pool.close()


def test_the_pool_grows_past_its_floor_only_while_the_host_has_memory_available(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory()
    clock = _Clock()
    short = _pool_of(runtime, clock, memory_available_bytes=GiB // 2, ready_count=1, max_ready_count=8)
    for _ in range(6):
        short.take()
    assert short.target() == 1  # under host_memory_available_min_bytes (1 GiB): the floor only
    clock.now += 1
    assert _filled(short) == 1
    short.close()

    plenty = _pool_of(runtime, clock, memory_available_bytes=4 * GiB, ready_count=1, max_ready_count=8)
    for _ in range(6):
        plenty.take()
    assert plenty.target() == 6
    plenty.close()


def test_a_pool_for_one_new_conversation_starts_none_after_its_take(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory()
    assert runtime.start_warm_pool(1, refill=False) is runtime.pool  # serve over stdio
    assert runtime.pool is not None
    assert runtime.pool.wait_until_ready(timeout_s=READY_WITHIN_S)
    assert runtime.conversation("only").run_python("print(1)").stdout == "1\n"
    assert runtime.conversation("only").sandbox().pooled
    runtime.pool.tend()
    assert runtime.pool.wait_for_starts(timeout_s=READY_WITHIN_S)
    assert runtime.pool.target() == runtime.pool.ready() == 0
    assert [c.id for c in _pooled_containers(runtime)] == [runtime.conversation("only").sandbox().container_id]


def test_a_ceiling_under_the_floor_is_refused_naming_both() -> None:
    with pytest.raises(PolicyError, match=r"max_ready_count \(2\) is below ready_count \(3\)"):
        policy_from_mapping({"pool": {"ready_count": 3, "max_ready_count": 2}})


def test_pooled_sandboxes_of_a_process_that_ended_are_swept_and_a_live_processes_pool_is_left_alone(
    runtime_factory: RuntimeFactory, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    owner = runtime_factory(state_dir=state, warm_pool=True)
    assert owner.pool is not None
    assert owner.pool.wait_until_ready(timeout_s=READY_WITHIN_S)
    pooled = {c.id for c in _pooled_containers(owner)}
    slots = state / "pool" / owner.manager.lease.id

    other = runtime_factory(state_dir=state)  # its start-up sweep ran: the owner lives
    other.gc()
    assert {c.id for c in _pooled_containers(owner)} == pooled
    assert len(list(slots.glob("*.ext4"))) + len([p for p in slots.iterdir() if p.is_dir()]) >= 2

    # the owner "dies": its lease is no longer live (as when its process is killed), its pool stays behind
    owner.state.leases.close(owner.manager.lease.id)
    removals = other.gc()
    assert pooled <= {r.container_id for r in removals}
    assert all(r.pool_slot for r in removals if r.container_id in pooled)
    assert not slots.exists()
    assert not any(os.path.ismount(p) for p in (state / "pool").rglob("results"))
