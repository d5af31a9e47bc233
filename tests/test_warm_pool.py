"""The warm pool on Docker, under runc and gVisor: a new conversation's first call runs in a sandbox that was
started, hardened and loaded ahead of it, on the conversation's own folder and quota volume; no pooled sandbox
ever carries one conversation's files into another or serves two; a pooled sandbox is found again after a restart
and replaced rather than restarted; the pools of processes that ended are swept with their slots, and a live
process's pool is its own. The pool's rules on the fake backend are in ``test_warm_pool_rules.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from sandbox_runtime.api.runtime import Conversation, Runtime
from sandbox_runtime.policy import Policy, load_policy
from sandbox_runtime.sandbox.backend import ContainerInfo, SandboxBackend
from sandbox_runtime.sandbox.docker.backend import DockerBackend
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION, LABEL_POLICY, LABEL_POOL_SLOT, LABEL_STATE_DIR
from sandbox_runtime.sandbox.profile import sandbox_identity
from sandbox_runtime.store.quota import attached_loop_images
from tests.conftest import SESSION, TEST_LABEL, RuntimeFactory, mounts_under

READY_WITHIN_S = 120.0  # the self-check, then each sandbox and its executor (seconds; longer under gVisor)
MiB = 1024 * 1024

# A runtime with a pool in a process of its own, until the test kills it.
POOL_OWNER = """
import sys
from sandbox_runtime.api.runtime import Runtime
state_dir, image, label, session = sys.argv[1:5]
runtime = Runtime(state_dir, "default", image=image, extra_labels={label: session}, reap_interval_s=None,
                  retention_interval_s=None, warm_pool=True)
print(runtime.pool.wait_until_ready(timeout_s=120), runtime.manager.lease.id, flush=True)
sys.stdin.read()  # kept until the test kills this process
"""


def _pooled(backend: SandboxBackend, state_dir: Path) -> list[ContainerInfo]:
    labels = {TEST_LABEL: SESSION, LABEL_STATE_DIR: str(state_dir.resolve())}
    return [c for c in backend.list_containers(labels) if LABEL_POOL_SLOT in c.labels]


def _ready_pool(runtime_factory: RuntimeFactory, policy: Policy, state_dir: Path | None = None) -> Runtime:
    runtime = runtime_factory(policy, state_dir=state_dir, warm_pool=True)
    assert runtime.pool is not None
    if not runtime.pool.wait_until_ready(timeout_s=READY_WITHIN_S):
        raise AssertionError(f"the pool did not fill: {runtime.manager.self_check().summary()}")
    return runtime


def _seen(conversation: Conversation, code: str) -> dict[str, Any]:
    result = conversation.run_python(code)
    assert result.status == "ok", (result.status, result.stderr[-2000:])
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert isinstance(seen, dict)
    return seen


def test_a_new_conversations_first_call_runs_in_a_pooled_sandbox_on_its_own_folder_and_quota(
    runtime_factory: RuntimeFactory, docker_backend: DockerBackend
) -> None:
    policy = load_policy("default").changed({"store": {"quota_bytes": 64 * MiB}}, "a small quota")
    runtime = _ready_pool(runtime_factory, policy)
    state = runtime.state_dir
    waiting = {c.id for c in _pooled(docker_backend, state)}
    assert len(waiting) == policy.pool.ready_count == 1

    conversation = runtime.conversation("pooled-first")
    seen = _seen(
        conversation,
        """
import json, os
open("/mnt/results/exports/from-the-sandbox.txt", "w").write("hello")
stats = os.statvfs("/mnt/results")
print(json.dumps({"quota": stats.f_blocks * stats.f_frsize, "uid": os.getuid(), "entries": sorted(os.listdir("."))}))
""",
    )
    sandbox = conversation.sandbox()
    assert sandbox.pooled
    assert sandbox.container_id in waiting
    folders = conversation.folders
    assert (folders.results / "exports" / "from-the-sandbox.txt").read_text() == "hello"
    assert seen["uid"] == policy.sandbox.uid
    assert seen["entries"] == ["args", "errors", "exports", "scripts", "spill"]
    if runtime.store.quota_mode == "loop":  # the slot's volume is now the conversation's, at its name
        assert folders.volume.stat().st_size == 64 * MiB
        assert 48 * MiB < seen["quota"] <= 64 * MiB  # less the file system's own
        assert os.path.ismount(folders.results)
        assert str(folders.volume) in attached_loop_images()

    assert runtime.pool is not None
    assert runtime.pool.wait_until_ready(timeout_s=READY_WITHIN_S)
    started = {c.id for c in _pooled(docker_backend, state)} - {sandbox.container_id} - waiting
    assert len(started) == 1  # one in its place

    runtime.close()  # the sandboxes still waiting go, with their slots; the conversation's stays
    assert [c.id for c in _pooled(docker_backend, state)] == [sandbox.container_id]
    assert not (state / "pool" / runtime.manager.lease.id).exists()
    assert mounts_under(state / "pool") == []


def test_pooled_sandboxes_never_carry_one_conversations_files_into_another(
    runtime_factory: RuntimeFactory, containment_policy: Policy
) -> None:
    runtime = _ready_pool(runtime_factory, containment_policy)
    first = runtime.conversation("pool-first")
    first.run_python("open('/mnt/results/secret.txt', 'w').write('first'); open('/tmp/secret.txt', 'w').write('first')")
    first_id = first.sandbox().container_id
    first.close()
    assert runtime.backend.inspect(first_id) is None  # never back in the pool

    assert runtime.pool is not None
    assert runtime.pool.wait_until_ready(timeout_s=READY_WITHIN_S)
    second = runtime.conversation("pool-second")
    seen = _seen(
        second,
        """
import json, os
print(json.dumps({"results": sorted(os.listdir("/mnt/results")), "tmp": sorted(os.listdir("/tmp")),
                  "hostname": os.uname().nodename}))
""",
    )
    assert second.sandbox().pooled
    assert second.sandbox().container_id != first_id
    assert seen["results"] == ["args", "errors", "exports", "scripts", "spill"]
    assert "secret.txt" not in seen["tmp"]
    assert (first.folders.results / "secret.txt").read_text() == "first"  # the first one's files stay its own


def test_two_conversations_starting_at_once_never_share_a_pooled_sandbox(
    runtime_factory: RuntimeFactory, docker_backend: DockerBackend
) -> None:
    policy = load_policy("default").changed({"pool": {"ready_count": 2}}, "two ready")
    runtime = _ready_pool(runtime_factory, policy)
    waiting = {c.id for c in _pooled(docker_backend, runtime.state_dir)}
    conversations = [runtime.conversation(f"at-once-{n}") for n in range(2)]
    seen: dict[str, dict[str, Any]] = {}

    def first_call(conversation: Conversation) -> None:
        code = f"import json, os; open('mine.txt', 'w').write({conversation.id!r}); "
        code += "print(json.dumps({'files': sorted(os.listdir('.'))}))"
        seen[conversation.id] = _seen(conversation, code)

    threads = [threading.Thread(target=first_call, args=(c,)) for c in conversations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=READY_WITHIN_S)
    ids = {c.sandbox().container_id for c in conversations}
    assert len(ids) == 2
    assert ids == waiting
    for conversation in conversations:
        assert "mine.txt" in seen[conversation.id]["files"]
        assert (conversation.folders.results / "mine.txt").read_text() == conversation.id


def test_a_conversation_from_the_pool_is_found_again_by_a_restarted_runtime_and_closed_with_it(
    runtime_factory: RuntimeFactory, docker_backend: DockerBackend
) -> None:
    runtime = _ready_pool(runtime_factory, load_policy("default"))
    conversation = runtime.conversation("pool-restart")
    conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')")
    pooled_id = conversation.sandbox().container_id
    runtime.close()

    again = runtime_factory(state_dir=runtime.state_dir)  # its start-up sweep keeps it: the conversation is known
    resumed = again.conversation("pool-restart")
    assert resumed.run_python("print(open('/mnt/results/kept.txt').read())").stdout.strip() == "kept"
    assert resumed.sandbox().container_id == pooled_id
    assert resumed.close()
    assert docker_backend.inspect(pooled_id) is None


def test_a_pooled_sandbox_whose_processes_must_all_end_is_replaced_on_the_conversations_folder(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = _ready_pool(runtime_factory, load_policy("default"))
    conversation = runtime.conversation("pool-replaced")
    conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')")
    pooled = conversation.sandbox()
    runtime.manager.restart(pooled)  # what a run that passed the host's backstop gets
    assert runtime.backend.inspect(pooled.container_id) is None

    result = conversation.run_python("print(open('/mnt/results/kept.txt').read())")
    assert result.stdout.strip() == "kept"
    fresh = runtime.backend.inspect(conversation.sandbox().container_id)
    assert fresh is not None
    assert fresh.labels.get(LABEL_CONVERSATION) == "pool-replaced"


def test_the_pool_of_a_killed_process_is_swept_with_its_slots_and_a_new_policy_gets_a_pool_of_its_own(
    runtime_factory: RuntimeFactory, docker_backend: DockerBackend, executor_image: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    owner = subprocess.Popen(
        [sys.executable, "-c", POOL_OWNER, str(state), executor_image, TEST_LABEL, SESSION],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert owner.stdout is not None
        ready, lease = owner.stdout.readline().split()  # bounded: the owner's own wait is
        assert ready == "True"
        other = runtime_factory(state_dir=state)
        other.gc()  # a live process's pool is its own
        old = {c.id for c in _pooled(docker_backend, state) if c.labels.get("io.sandbox-runtime.lease") == lease}
        assert len(old) == load_policy("default").pool.ready_count
        assert all(docker_backend.inspect(i) is not None for i in old)
        assert mounts_under(state / "pool" / lease)
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=30)
        for pipe in (owner.stdin, owner.stdout):
            if pipe is not None:
                pipe.close()

    changed = load_policy("default").changed({"sandbox": {"limits": {"memory_bytes": 256 * MiB}}}, "another policy")
    successor = _ready_pool(runtime_factory, changed, state)  # its start-up sweep ran first
    assert all(docker_backend.inspect(i) is None for i in old)
    assert not (state / "pool" / lease).exists()
    assert mounts_under(state / "pool" / lease) == []
    assert {c.labels[LABEL_POLICY] for c in _pooled(docker_backend, state)} == {
        sandbox_identity(changed, executor_image)
    }
    assert successor.pool is not None
    assert successor.pool.ready() == changed.pool.ready_count
