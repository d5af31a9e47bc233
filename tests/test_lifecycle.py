"""One sandbox per conversation: started on demand, reaped when idle or old, orphans swept, fail closed."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import InvalidConversationId, SelfCheckFailed
from sandbox_runtime.policy import MiB, Policy, load_policy, policy_from_mapping
from sandbox_runtime.sandbox import canary
from sandbox_runtime.sandbox.backend import SandboxBackend
from sandbox_runtime.sandbox.docker.backend import DockerBackend
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION, LABEL_RUNTIME, LABEL_STATE_DIR
from sandbox_runtime.sandbox.manager import Removal
from sandbox_runtime.sandbox.selfcheck import SelfCheckReport, run_self_check
from sandbox_runtime.store.quota import attached_loop_images, loop_quota_unavailable_reason
from tests.conftest import SESSION, TEST_LABEL, RuntimeFactory, mounts_under

LOOP_STORE = {"quota_mode": "loop", "quota_bytes": 16 * 1024 * 1024}
needs_loop = pytest.mark.skipif(
    loop_quota_unavailable_reason() is not None and not os.environ.get("CI"),
    reason=f"kernel-enforced quotas unavailable: {loop_quota_unavailable_reason()}",
)


def _ids(removals: list[Removal]) -> set[str]:
    return {r.container_id for r in removals}


def _ours(backend: SandboxBackend, conversation: str) -> list[str]:
    return [c.id for c in backend.list_containers({TEST_LABEL: SESSION, LABEL_CONVERSATION: conversation})]


def test_each_conversation_gets_its_own_labelled_sandbox(runtime: Runtime) -> None:
    a = runtime.conversation("lifecycle-a").sandbox()
    b = runtime.conversation("lifecycle-b").sandbox()
    assert a.container_id != b.container_id
    assert _ours(runtime.backend, "lifecycle-a") == [a.container_id]
    info = runtime.backend.inspect(a.container_id)
    assert info is not None
    assert info.labels[LABEL_RUNTIME] == "1"
    assert {"io.sandbox-runtime.created-at", "io.sandbox-runtime.policy-hash"} <= set(info.labels)


def test_closing_a_conversation_removes_its_sandbox_and_keeps_its_files(runtime: Runtime) -> None:
    conversation = runtime.conversation("closing")
    conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')")
    assert conversation.close() is True
    assert _ours(runtime.backend, "closing") == []
    assert (conversation.folders.results / "kept.txt").read_text() == "kept"
    assert conversation.run_python("print(open('/mnt/results/kept.txt').read())").stdout == "kept\n"


def test_an_idle_sandbox_is_reaped_and_its_results_folder_stays(runtime: Runtime) -> None:
    conversation = runtime.conversation("idle")
    conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')")
    container = conversation.sandbox().container_id
    real_clock = runtime.manager.clock
    runtime.manager.clock = lambda: real_clock() + runtime.policy.sandbox.idle_timeout_s - 60
    assert runtime.conversations.reap() == []
    runtime.manager.clock = lambda: real_clock() + runtime.policy.sandbox.idle_timeout_s + 60
    removed = runtime.conversations.reap()
    assert [r.container_id for r in removed] == [container]
    assert "idle" in removed[0].reason
    assert runtime.backend.inspect(container) is None
    assert (conversation.folders.results / "kept.txt").exists()


def test_a_sandbox_past_its_maximum_lifetime_is_replaced_on_next_use(runtime: Runtime) -> None:
    conversation = runtime.conversation("old")
    container = conversation.sandbox().container_id
    real_clock = runtime.manager.clock
    runtime.manager.clock = lambda: real_clock() + runtime.policy.sandbox.max_lifetime_s + 60
    fresh = conversation.sandbox().container_id
    assert fresh != container
    assert runtime.backend.inspect(container) is None


def test_orphans_are_swept_at_start_up_and_by_gc(runtime_factory: RuntimeFactory, tmp_path: Path) -> None:
    def orphan(name: str) -> str:
        state = tmp_path / name
        container = runtime_factory(state_dir=state).conversation("orphan").sandbox().container_id
        (state / "state.sqlite3").unlink()  # its state directory is gone: nothing owns the container
        return container

    before_start = orphan("gone-before-start")
    survivor = runtime_factory()
    assert survivor.backend.inspect(before_start) is None  # swept at start-up
    kept = survivor.conversation("kept").sandbox().container_id
    after_start = orphan("gone-after-start")
    removed = {r.container_id: r.reason for r in survivor.gc()}
    # every runtime on the engine sweeps such orphans: a parallel worker's may have been first (or be removing it
    # still, when this gc found it too)
    assert after_start not in removed or "state directory is gone" in removed[after_start]
    assert kept not in removed
    left = survivor.backend.inspect(after_start)
    assert left is None or left.status == "removing", left  # the engine may still be finishing a removal


def test_a_container_of_an_unknown_conversation_is_an_orphan(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory()
    container = runtime.conversation("forgotten").sandbox().container_id
    runtime.state.forget_conversation("forgotten")
    removed = {r.container_id for r in runtime_factory(state_dir=runtime.state_dir, sweep_on_start=True).gc()}
    assert container in removed or runtime.backend.inspect(container) is None


@pytest.mark.parametrize("bad_id", ["", "a" * 65, "../etc", "with space", "-leading-dash", "é", "a/b", "a\x00b", 42])
def test_a_bad_conversation_id_is_a_clear_error(runtime: Runtime, bad_id: object) -> None:
    with pytest.raises(InvalidConversationId):
        runtime.conversation(bad_id)  # type: ignore[arg-type]  # 42: a wrong type on purpose, the run-time check is under test


def test_a_conversation_id_of_64_characters_is_accepted(runtime: Runtime) -> None:
    assert runtime.conversation("a" * 64).run_python("print(1)").status == "ok"


def test_no_sandbox_starts_when_the_self_check_fails(
    runtime_factory: RuntimeFactory,
    docker_backend: DockerBackend,
    executor_image: str,
    tmp_path: Path,
    canary_runs: list[str],
) -> None:
    leaky = f"sandbox-runtime-test-leaky:{SESSION}"
    (tmp_path / "Dockerfile").write_text(f"FROM {executor_image}\nENV HOST_SECRET=leaked\n")
    docker_backend.build_image(str(tmp_path), leaky, {}, {TEST_LABEL: SESSION}, lambda _line: None)
    try:
        runtime = runtime_factory(load_policy("default"), image=leaky)
        with pytest.raises(SelfCheckFailed, match="environment") as raised:
            runtime.conversation("fail-closed").run_python("print(1)")
        assert "HOST_SECRET" in str(raised.value)
        assert _ours(docker_backend, "fail-closed") == []
        with pytest.raises(SelfCheckFailed):
            runtime.conversation("fail-closed-2").sandbox()
        assert len(canary_runs) == 2  # a check that failed is never kept: each start checks again
    finally:
        docker_backend._api.remove_image(leaky, force=True)


@pytest.fixture
def canary_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The canary checks this process runs from now on (each the real check, counted): the shape's memory limit."""
    runs: list[str] = []

    def counted(backend: SandboxBackend, policy: Policy, *args: Any, **kwargs: Any) -> SelfCheckReport:
        runs.append(str(policy.sandbox.limits.memory_bytes))
        return run_self_check(backend, policy, *args, **kwargs)

    monkeypatch.setattr(canary, "run_self_check", counted)
    return runs


def test_the_self_check_runs_once_per_process_for_each_sandbox_shape_and_doctor_runs_it_again(
    runtime_factory: RuntimeFactory, canary_runs: list[str]
) -> None:
    shape = {"sandbox": {"limits": {"memory_bytes": 300 * MiB}}}  # a shape no other test uses: new to the process
    policy = load_policy("default").changed(shape, "a shape of this test's own")
    first = runtime_factory(policy)
    assert first.conversation("c1").run_python("print(1)").status == "ok"
    assert canary_runs == [str(policy.sandbox.limits.memory_bytes)]
    second = runtime_factory(policy.changed({"mcp": {"http_port": 8802}}, "another port"))  # the same shape
    assert second.conversation("c2").run_python("print(2)").status == "ok"
    assert len(canary_runs) == 1  # the check that passed in this process stands for it
    other = runtime_factory(policy.changed({"sandbox": {"limits": {"pids_max": 300}}}, "another shape"))
    assert other.conversation("c3").run_python("print(3)").status == "ok"
    assert len(canary_runs) == 2
    assert second.doctor().ok
    assert len(canary_runs) == 3  # doctor always checks


def test_a_run_waits_for_the_one_before_it_in_the_same_conversation(runtime: Runtime) -> None:
    conversation = runtime.conversation("serial")
    conversation.run_python("pass")
    results: list[str] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(conversation.run_python("import time; time.sleep(0.3); print('done')").stdout)
        )
        for _ in range(3)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == ["done\n"] * 3
    assert time.monotonic() - started >= 0.9  # serialised: the runner of one run never ends another's processes


def test_a_sandbox_removed_behind_the_runtimes_back_is_replaced_on_the_next_run(
    runtime: Runtime, docker_backend: DockerBackend
) -> None:
    conversation = runtime.conversation("removed-outside")
    conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')")
    first = conversation.sandbox().container_id
    docker_backend.remove(first)
    result = conversation.run_python("print(open('/mnt/results/kept.txt').read())")
    assert result.stdout == "kept\n"
    assert conversation.sandbox().container_id != first


def _losetup_lists(image: Path) -> str:
    return subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True, timeout=30, check=True).stdout


@needs_loop
def test_an_idle_sandbox_reaped_releases_its_volume_and_the_next_run_mounts_it_again(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(policy_from_mapping({"sandbox": {"idle_timeout_s": 1}, "store": LOOP_STORE}))
    conversation = runtime.conversation("released")
    conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')")
    folders = runtime.store.folders("released")  # the paths only: nothing is mounted by asking
    assert os.path.ismount(folders.results)
    assert _losetup_lists(folders.volume)
    container = conversation.sandbox().container_id
    real_clock = runtime.manager.clock
    runtime.manager.clock = lambda: real_clock() + 5  # 5 s on: idle longer than idle_timeout_s = 1
    assert _ids(runtime.conversations.reap()) == {container}
    assert not os.path.ismount(folders.results)
    assert _losetup_lists(folders.volume) == ""
    runtime.manager.clock = real_clock
    again = conversation.run_python("print(open('/mnt/results/kept.txt').read())")
    assert (again.status, again.stdout) == ("ok", "kept\n")
    assert os.path.ismount(folders.results)


@needs_loop
def test_closing_a_conversation_releases_its_volume_but_never_one_in_use(
    runtime_factory: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = runtime_factory(policy_from_mapping({"store": LOOP_STORE}))
    conversation = runtime.conversation("busy-volume")
    conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')")
    folders = runtime.store.folders("busy-volume")
    with open(folders.results / "kept.txt") as handle, caplog.at_level(logging.WARNING):  # a host reader
        assert conversation.close() is True
        assert os.path.ismount(folders.results)  # busy: left mounted, and said so
        assert any("in use" in r.getMessage() for r in caplog.records)
        assert handle.read() == "kept"
    runtime.gc()
    assert not os.path.ismount(folders.results)
    assert _losetup_lists(folders.volume) == ""
    assert conversation.close() is False
    assert conversation.usage().used_bytes > 0  # a look mounts it for the look only
    assert not os.path.ismount(folders.results)
    assert (conversation.folders.results / "kept.txt").read_text() == "kept"  # a use mounts it again


@needs_loop
def test_a_runtime_on_a_temporary_directory_is_closed_and_the_directory_removed_at_once(
    docker_backend: DockerBackend, executor_image: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    policy = policy_from_mapping({"store": LOOP_STORE, "pool": {"ready_count": 1}})
    labels = {TEST_LABEL: SESSION}
    try:
        with Runtime(state, policy, image=executor_image, extra_labels=labels, warm_pool=True) as runtime:
            assert runtime.pool is not None
            assert runtime.pool.wait_until_ready(timeout_s=120)  # a pool slot's volume is mounted too
            result = runtime.conversation("temporary").run_python("open('/mnt/results/a.txt', 'w').write('a')")
            assert result.status == "ok"
            assert mounts_under(state)
        assert mounts_under(state) == []
        shutil.rmtree(state)  # no "Device or resource busy"
    finally:
        for info in docker_backend.list_containers({**labels, LABEL_STATE_DIR: str(state.resolve())}):
            docker_backend.remove(info.id)
    assert not [image for image in attached_loop_images() if image.startswith(str(tmp_path))]


@needs_loop
def test_a_closed_runtimes_sandbox_runs_on_and_the_next_runtime_shares_its_one_filesystem(
    runtime_factory: RuntimeFactory, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    policy = policy_from_mapping({"store": LOOP_STORE})
    first = runtime_factory(policy, state_dir=state)
    conversation = first.conversation("carried-on")
    assert conversation.run_python("open('/mnt/results/before.txt', 'w').write('before')").status == "ok"
    container = conversation.sandbox().container_id
    folders = first.store.folders("carried-on")
    first.close()
    assert not os.path.ismount(folders.results)  # the host's mount went; the sandbox keeps its own
    assert len(_losetup_lists(folders.volume).splitlines()) == 1
    second = runtime_factory(policy, state_dir=state)
    again = second.conversation("carried-on")
    seen = again.run_python(
        "open('/mnt/results/after.txt', 'w').write('after'); print(open('/mnt/results/before.txt').read())"
    )
    assert (seen.status, seen.stdout) == ("ok", "before\n")
    assert again.sandbox().container_id == container  # re-attached, not replaced
    assert (folders.results / "after.txt").read_text() == "after"  # what the sandbox writes, the host reads
    assert len(_losetup_lists(folders.volume).splitlines()) == 1  # one device, one filesystem: never mounted twice
