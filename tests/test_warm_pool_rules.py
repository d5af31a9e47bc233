"""The warm pool's rules, on the fake backend (no engine): what is kept ready, what is handed out and to whom, when
a sandbox is replaced, what happens after a failed start, which runtimes keep a pool, and what the sweep removes.
The same pool on Docker, under runc and gVisor, is in ``test_warm_pool.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import SandboxError
from sandbox_runtime.policy import Policy, load_policy
from sandbox_runtime.sandbox.backend import ContainerInfo, ContainerSpec
from sandbox_runtime.sandbox.fake.backend import FakeBackend
from sandbox_runtime.sandbox.labels import LABEL_POOL_SLOT
from sandbox_runtime.sandbox.pool import WarmPool
from sandbox_runtime.sandbox.run_protocol import PYTHON, run_request
from tests.conftest import RuntimeFactory

READY_WITHIN_S = 30.0


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


def _pool_of(runtime: Runtime, clock: _Clock, **pool: object) -> WarmPool:
    """A pool tended by the test itself (no job thread), on the runtime's manager and slots, with a test clock."""
    policy = runtime.policy.pool.model_copy(update=pool)
    request = run_request(runtime.policy, 10.0, (PYTHON, "-c", "pass"))
    return WarmPool(runtime.manager, policy, runtime.conversations.slots, request, clock=clock)


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
    assert runtime_factory(_pool_policy(ready_count=0), warm_pool=True).pool is None


def test_a_new_conversation_takes_a_ready_sandbox_whole_and_the_pool_starts_another(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(warm_pool=True)
    assert runtime.pool is not None
    assert runtime.pool.wait_until_ready(timeout_s=READY_WITHIN_S)
    waiting = {c.id for c in _pooled_containers(runtime)}
    assert len(waiting) == runtime.policy.pool.ready_count == 2

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
    assert runtime.pool.ready() == 2


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
    assert runtime.pool.ready() == 2


def test_a_pooled_sandbox_that_waited_past_max_wait_s_is_never_handed_out_and_is_replaced(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory()
    clock = _Clock()
    pool = _pool_of(runtime, clock, ready_count=1, max_wait_s=600)
    pool.tend()
    (old,) = _pooled_containers(runtime)

    clock.now += 601
    assert pool.take() is None  # stale: not handed out
    pool.tend()
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
        pool = _pool_of(runtime, clock, ready_count=2, retry_after_s=30.0)
        pool.tend()
        assert backend.starts == 1
        assert pool.ready() == 0
        assert "trying again in 30 s" in caplog.text
        backend.refuse = False
        clock.now += 29
        pool.tend()
        assert backend.starts == 1  # not yet
        clock.now += 2
        pool.tend()
        assert backend.starts == 3
        assert pool.ready() == 2
        pool.close()
        assert pool.ready() == 0
        assert _pooled_containers(runtime) == []
        assert not (runtime.state_dir / "pool" / runtime.manager.lease.id).exists()  # slots and their folder gone


def test_a_pooled_sandbox_that_stopped_is_replaced(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory()
    pool = _pool_of(runtime, _Clock(), ready_count=1)
    pool.tend()
    (stopped,) = _pooled_containers(runtime)
    runtime.backend.remove(stopped.id)  # as if it died
    pool.tend()
    (fresh,) = _pooled_containers(runtime)
    assert fresh.id != stopped.id
    _hands_out_then_ends(pool, fresh.id)


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
