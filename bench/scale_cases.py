"""The scale half of ``bench_latency.py``: throughput of parallel runs in many conversations beside raw exec into
the same containers, the memory of idle sandboxes with their resident executors, the runtime process's RSS after
many conversations, and the host disk a conversation's quota volume takes.

* ``throughput``: ``threads`` threads, one conversation each, every thread calling ``run_python("print(1)")``
  through ``conversation.call`` as fast as it can for ``runs`` runs; beside it the same threads doing raw docker-py
  execs of ``python -c 'print(1)'`` into the same containers. The two alternate in blocks (ours, raw, ours, raw)
  and the median block of each is reported, in runs per second.
* ``idle density``: ``count`` (20) new conversations, idle, each with its executor loaded (the standard library
  only) and its spare, beside as many bare containers of the same image (``sleep``: the floor); then after one
  office run each (the executor then loads openpyxl for the runs after it); then with the executors dropped
  (what a conversation costs whose executor idled out). Medians of the cgroup memory, in MiB.
* ``pool memory``: the cgroup memory of each sandbox waiting in a warm pool (what a pool costs per sandbox).
* ``rss``: the bench process (the runtime lives in it) after ``conversations`` conversations each made one run,
  all still live.
* ``volume``: the host disk (allocated blocks) of each of those conversations' quota volumes after that run.
"""

from __future__ import annotations

import functools
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker

from sandbox_runtime.api.runtime import Conversation, Runtime
from sandbox_runtime.sandbox.exec_stream import read_cgroup_file
from sandbox_runtime.sandbox.labels import LABEL_POOL_SLOT
from sandbox_runtime.sandbox.profile import code_user, exec_environment
from sandbox_runtime.sandbox.run_protocol import PYTHON

__all__ = ["idle_density", "pool_memory", "rss_and_volumes", "throughput"]

MiB = 1024 * 1024


def _ok(conversation: Conversation) -> None:
    outcome = conversation.call("run_python", {"code": "print(1)"})
    if outcome.is_error:
        raise RuntimeError(f"run_python failed: {outcome.text[:500]}")


def _raw_exec(client: docker.DockerClient, container_id: str, runtime: Runtime) -> None:
    api = client.api
    exec_id = api.exec_create(
        container_id,
        [PYTHON, "-c", "print(1)"],
        user=code_user(runtime.policy),
        environment=exec_environment(runtime.policy),
    )["Id"]
    api.exec_start(exec_id)


def _block(work: list[Callable[[], None]], runs: int) -> float:
    """Runs per second of ``len(work)`` threads each calling its callable ``runs`` times."""
    barrier = threading.Barrier(len(work) + 1)

    def loop(fn: Callable[[], None]) -> None:
        barrier.wait()
        for _ in range(runs):
            fn()

    with ThreadPoolExecutor(len(work)) as pool:
        futures = [pool.submit(loop, fn) for fn in work]
        barrier.wait()
        start = time.perf_counter()
        for future in futures:
            future.result()
        elapsed = time.perf_counter() - start
    return len(work) * runs / elapsed


def throughput(
    runtime: Runtime, client: docker.DockerClient, threads: int, runs: int, blocks: int
) -> tuple[dict[str, float], list[Conversation]]:
    """Median runs per second of ours and of raw exec, and the warm conversations (kept for the memory case)."""
    conversations = [runtime.conversation(f"bench-par-{i}-{uuid.uuid4().hex[:8]}") for i in range(threads)]
    for conversation in conversations:
        _ok(conversation)  # the sandbox and its executor, started (untimed)
    containers = [c.sandbox().container_id for c in conversations]
    ours: list[Callable[[], None]] = [functools.partial(_ok, c) for c in conversations]
    raw: list[Callable[[], None]] = [functools.partial(_raw_exec, client, cid, runtime) for cid in containers]
    _block(ours, 2)
    _block(raw, 2)
    samples: dict[str, list[float]] = {"ours": [], "raw": []}
    for _ in range(blocks):
        samples["ours"].append(_block(ours, runs))
        samples["raw"].append(_block(raw, runs))
    return {name: statistics.median(values) for name, values in samples.items()}, conversations


def _memory_bytes(container_id: str) -> int:
    text = read_cgroup_file(container_id, "memory", "memory.usage_in_bytes", "memory.current")
    return int(text) if text and text.isdigit() else 0


def _wait_until_loaded(conversations: list[Conversation], module: str) -> None:
    """Until a run of each conversation finds ``module`` imported as it starts (its executor loaded it)."""
    code = f"import sys; print({module!r} in sys.modules)"
    for conversation in conversations:
        deadline = time.monotonic() + 60
        while conversation.run_python(code).stdout.strip() != "True":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the executor of {conversation.id} never loaded {module}")


def _bare_containers(client: docker.DockerClient, runtime: Runtime, count: int, labels: dict[str, str]) -> list[str]:
    """``count`` containers of the executor image doing nothing (no executor, no run): the floor."""
    started = [
        client.containers.run(
            runtime.conversations.manager.image,
            ["sleep", "3600"],
            detach=True,
            network_mode="none",
            read_only=True,
            user=code_user(runtime.policy),
            labels=labels,
        )
        for _ in range(count)
    ]
    return [str(container.id) for container in started]


def idle_density(
    runtime: Runtime, client: docker.DockerClient, count: int, labels: dict[str, str], office_script: str
) -> dict[str, float]:
    """Median cgroup memory (MiB) of ``count`` idle conversations beside ``count`` bare containers of the same
    image: with their executors loaded (the standard library only), after one office run each (its executor then
    loads openpyxl for the runs after it), and with the executors dropped."""
    conversations = [runtime.conversation(f"bench-idle-{i}-{uuid.uuid4().hex[:8]}") for i in range(count)]
    for conversation in conversations:
        _ok(conversation)
    _wait_until_loaded(conversations, "zipfile")
    containers = [c.sandbox().container_id for c in conversations]
    bare = _bare_containers(client, runtime, count, labels)
    try:
        figures = {
            f"idle conversation, {count} of them (MiB, median)": _median_mib(containers),
            f"bare container of the image, {count} of them (MiB, median)": _median_mib(bare),
        }
    finally:
        for container_id in bare:
            client.api.remove_container(container_id, force=True)
    for conversation in conversations:
        done = conversation.call("run_python", {"code": office_script})
        if done.is_error:
            raise RuntimeError(f"the office script failed: {done.text[:500]}")
    _wait_until_loaded(conversations, "openpyxl")
    figures["idle conversation after an office run (MiB, median)"] = _median_mib(containers)
    runtime.manager.backend.drop_idle_executors(0.0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _median_mib(containers) >= figures[next(iter(figures))] * 0.5:
        time.sleep(0.2)  # the executors exit once their stdin ends; their memory goes a moment later
    figures["idle conversation, executor dropped (MiB, median)"] = _median_mib(containers)
    for conversation in conversations:
        conversation.delete()
    return figures


def _median_mib(containers: list[str]) -> float:
    return statistics.median(_memory_bytes(cid) / MiB for cid in containers)


def pool_memory(runtime: Runtime) -> dict[str, float]:
    """Median cgroup memory (MiB) of the sandboxes waiting in the runtime's warm pool (none took them)."""
    listed = runtime.backend.list_containers(runtime.manager.base_labels)
    waiting = [c.id for c in listed if LABEL_POOL_SLOT in c.labels and runtime.state.sandbox(c.id) is None]
    if not waiting:
        return {}
    return {"sandbox waiting in the pool (MiB, median)": statistics.median(_memory_bytes(cid) / MiB for cid in waiting)}


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def rss_and_volumes(runtime: Runtime, count: int) -> dict[str, float]:
    """The runtime process's RSS before and after ``count`` live conversations made one run each, and the host
    disk of their quota volumes."""
    before = _rss_bytes()
    made = [runtime.conversation(f"bench-many-{i}-{uuid.uuid4().hex[:8]}") for i in range(count)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(_ok, made))
    after = _rss_bytes()
    images = [runtime.state_dir / "volumes" / f"{c.id}.ext4" for c in made]
    sizes = [os.stat(image).st_blocks * 512 / 1024 for image in images if image.exists()]
    report = {
        "runtime RSS before (MiB)": before / MiB,
        f"runtime RSS with {count} live conversations (MiB)": after / MiB,
    }
    if sizes:
        report["quota volume on host disk after one run (KiB, median)"] = statistics.median(sizes)
    for conversation in made:
        conversation.delete()
    return report
