"""Commands a host program runs in a sandbox (``Conversation.exec``) beside a raw ``docker exec`` of the same
command in the same container and beside ``run_python``, measured side by side in one run; then input streamed
through a command and back with the runtime's peak memory.

Run from the repository root::

    .venv/bin/python bench/bench_commands.py [--repeat 30] [--stream-mib 64]

Cases, interleaved round-robin (the order flips every round), one untimed warm-up each:

* ``exec_true``          ``conversation.exec(["true"])``: the whole call (admission, the record, the executor's fork)
* ``raw_exec_true``      docker-py ``exec_create`` + ``exec_start`` of ``true`` in the same container: baseline
* ``exec_python``        ``conversation.exec(["python3", "-c", "print(1)"])``
* ``raw_exec_python``    the same by raw exec: baseline
* ``run_python``         ``conversation.run_python("print(1)")``: the script path's own cost, for comparison

Then ``--stream-mib`` MiB go through ``sha256sum`` from a generator (never held whole), the same bytes are written
with ``write_bytes`` and read back, streamed with ``read_to`` then whole with ``read_bytes``; the runtime process's
peak RSS (``ru_maxrss``) is printed after each. Every container carries ``io.sandbox-runtime.bench=<uuid>`` and is
removed at the end, with the temporary state directory. Numbers are reported, never asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
from benchkit import bench_run, interleaved, line, pair

from sandbox_runtime.api.runtime import Conversation, Runtime
from sandbox_runtime.sandbox.image import executor_image_tag
from sandbox_runtime.sandbox.profile import code_user, exec_environment

BENCH_LABEL = "io.sandbox-runtime.bench"
CHUNK_BYTES = 1 << 20


def _raw_exec(client: docker.DockerClient, container_id: str, runtime: Runtime, argv: list[str]) -> None:
    policy = runtime.policy
    api = client.api
    exec_id = api.exec_create(
        container_id,
        argv,
        user=code_user(policy),
        environment=exec_environment(policy),
        workdir=policy.sandbox.results_mount_path,
    )["Id"]
    api.exec_start(exec_id)
    if api.exec_inspect(exec_id).get("ExitCode") != 0:
        raise RuntimeError(f"raw exec of {argv!r} failed")


def _chunks(total_bytes: int) -> Iterator[bytes]:
    block = bytes(range(256)) * (CHUNK_BYTES // 256)
    for _ in range(total_bytes // CHUNK_BYTES):
        yield block


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--stream-mib", type=int, default=64)
    options = parser.parse_args(argv)
    label = uuid.uuid4().hex
    client = docker.from_env()
    with bench_run("sandbox-runtime-bench-commands-", tempfile.gettempdir()) as work:
        runtime = Runtime(
            Path(work) / "state",
            image=executor_image_tag(),
            reap_interval_s=None,
            retention_interval_s=None,
            extra_labels={BENCH_LABEL: label},
        )
        try:
            conversation = runtime.conversation("bench-commands")
            container_id = conversation.sandbox().container_id
            cases: dict[str, Callable[[], object]] = {
                "exec_true": lambda: conversation.exec(["true"]),
                "raw_exec_true": lambda: _raw_exec(client, container_id, runtime, ["true"]),
                "exec_python": lambda: conversation.exec(["python3", "-c", "print(1)"]),
                "raw_exec_python": lambda: _raw_exec(client, container_id, runtime, ["python3", "-c", "print(1)"]),
                "run_python": lambda: conversation.run_python("print(1)"),
            }
            samples = interleaved(cases, options.repeat)
            for title, case, base in (
                ("exec(['true']) vs raw docker exec", "exec_true", "raw_exec_true"),
                ("exec(['python3', '-c', 'print(1)']) vs raw docker exec", "exec_python", "raw_exec_python"),
                ("exec(['python3', '-c', 'print(1)']) vs run_python('print(1)')", "exec_python", "run_python"),
            ):
                pair(title, (case, samples[case]), (base, samples[base]), 1000, "ms")
            _stream(conversation, options.stream_mib * CHUNK_BYTES)
        finally:
            for record in runtime.state.conversations():
                runtime.conversation(record.id).delete()
            runtime.close()
            for container in client.containers.list(all=True, filters={"label": f"{BENCH_LABEL}={label}"}):
                container.remove(force=True)


def _stream(conversation: Conversation, total_bytes: int) -> None:
    expected = hashlib.sha256()
    for chunk in _chunks(total_bytes):
        expected.update(chunk)
    mib = total_bytes / CHUNK_BYTES
    print(f"\n{mib:g} MiB streamed (peak RSS of this process before: {_peak_rss_mib():.0f} MiB)")
    started = time.perf_counter()
    summed = conversation.exec(["sha256sum"], stdin=_chunks(total_bytes), timeout_s=600)
    through = time.perf_counter() - started
    assert summed.stdout.split()[0].decode() == expected.hexdigest(), summed
    line("exec(['sha256sum'], stdin=generator)", [through], 1, "s")
    started = time.perf_counter()
    conversation.write_bytes("/tmp/streamed.bin", _chunks(total_bytes))
    written = time.perf_counter() - started
    line("write_bytes(generator)", [written], 1, "s")
    print(f"  peak RSS of this process after the streamed input: {_peak_rss_mib():.0f} MiB (nothing held whole)")
    started = time.perf_counter()
    streamed_back = hashlib.sha256()
    conversation.read_to("/tmp/streamed.bin", streamed_back.update)
    streamed = time.perf_counter() - started
    assert streamed_back.hexdigest() == expected.hexdigest()
    line("read_to(path, sha256.update) (streamed out)", [streamed], 1, "s")
    print(f"  peak RSS of this process after the streamed output: {_peak_rss_mib():.0f} MiB (nothing held whole)")
    started = time.perf_counter()
    back = conversation.read_bytes("/tmp/streamed.bin")
    read = time.perf_counter() - started
    assert hashlib.sha256(back).hexdigest() == expected.hexdigest()
    del back
    line("read_bytes (the whole file, returned as bytes)", [read], 1, "s")
    print(
        f"  throughput in: {mib / through:.1f} MiB/s by exec, {mib / written:.1f} MiB/s by write_bytes; "
        f"out: {mib / streamed:.1f} MiB/s by read_to, {mib / read:.1f} MiB/s by read_bytes"
    )
    print(f"  peak RSS of this process after: {_peak_rss_mib():.0f} MiB (read_bytes holds the file it returns)")


if __name__ == "__main__":
    main(sys.argv[1:])
