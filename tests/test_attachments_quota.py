"""Attachments are bounded: ``outputs/`` has its own quota (bytes of distinct content, attachments), the same content
attached again is stored once, and a refused or interrupted attach leaves nothing behind that counts.

Most stories drive ``attach_file`` on a real results folder with a small quota (no Docker needed); the last ones go
through a real runtime and sandbox.
"""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_runtime.errors import OutputsFull, ToolFailure, UnsafeFileType
from sandbox_runtime.mcp.resources import attachment_uri, read_resource
from sandbox_runtime.models import Attachment, HostResult, ToolCall
from sandbox_runtime.policy import load_policy
from sandbox_runtime.store.outputs import AttachmentStore, OutputsLimits
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tools.attach import AttachFileArgs, attach_file
from tests.conftest import RuntimeFactory

MiB = 1 << 20
WAIT_S = 30.0


def write_source(results: Path, name: str, size: int, seed: int) -> str:
    """A file of ``size`` random bytes (the same for the same seed) in results/exports; its model path."""
    (results / "exports").mkdir(exist_ok=True)
    (results / "exports" / name).write_bytes(random.Random(seed).randbytes(size))  # noqa: S311  (test data)
    return f"exports/{name}"


def attach(
    root: ResultsRoot, outputs: Path, path: str, limits: OutputsLimits, filename: str | None = None
) -> Attachment:
    return attach_file(root, outputs, AttachFileArgs(path=path, filename=filename), max_bytes=64 * MiB, limits=limits)


def tree(outputs: Path) -> dict[str, tuple[int, int]]:
    """Every name under outputs/ (but the lock file) with its inode and, for files, its size."""
    listing = {}
    for path in sorted(outputs.rglob("*")):
        st = path.lstat()
        if path.name != ".lock":
            listing[str(path.relative_to(outputs))] = (st.st_ino, st.st_size if path.is_file() else -1)
    return listing


def bytes_on_disk(outputs: Path) -> int:
    """The sizes of the distinct files under outputs/ (each inode once), measured apart from the store."""
    sizes = {}
    for path in outputs.rglob("*"):
        st = path.lstat()
        if path.is_file() and not path.is_symlink() and path.name != ".lock":
            sizes[(st.st_dev, st.st_ino)] = st.st_size
    return sum(sizes.values())


def staged(outputs: Path) -> list[str]:
    return sorted(p.name for p in (outputs / ".staging").iterdir())


def run_bounded(job: Callable[[], object]) -> object:
    """Run ``job`` in a thread; fail (instead of hanging) when it does not end within WAIT_S."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(job()), daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), f"the job did not end within {WAIT_S} s"
    return result[0]


# ------------------------------------------------------------------------------------------ stored once
def test_the_same_24_mib_file_attached_8_times_under_a_32_mib_quota_is_stored_once(
    root: ResultsRoot, results: Path, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    limits = OutputsLimits(max_bytes=32 * MiB, files_max=10)
    path = write_source(results, "report.bin", 24 * MiB, seed=1)
    cards = [attach(root, outputs, path, limits, filename=f"report-{i}.bin") for i in range(8)]
    content = (results / path).read_bytes()
    assert len({c.attachment_id for c in cards}) == 8
    assert [c.filename for c in cards] == [f"report-{i}.bin" for i in range(8)]
    for card in cards:
        assert Path(card.host_path).read_bytes() == content
        assert Path(card.host_path).parent.name == card.attachment_id
        assert card.bytes == 24 * MiB
    assert bytes_on_disk(outputs) == 24 * MiB
    assert len({Path(c.host_path).stat().st_ino for c in cards}) == 1
    usage = AttachmentStore(outputs, limits).usage()
    assert (usage.attachments, usage.contents, usage.bytes) == (8, 1, 24 * MiB)
    assert staged(outputs) == []


def test_a_different_file_past_the_byte_quota_is_outputs_full_and_leaves_nothing_behind(
    root: ResultsRoot, results: Path, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    limits = OutputsLimits(max_bytes=32 * MiB, files_max=10)
    first = attach(root, outputs, write_source(results, "report.bin", 24 * MiB, seed=1), limits)
    before = tree(outputs)
    other = write_source(results, "other.bin", 16 * MiB, seed=2)
    with pytest.raises(OutputsFull) as refused:
        attach(root, outputs, other, limits)
    assert isinstance(refused.value, ToolFailure)  # the model reads it as a tool error
    message = str(refused.value)
    for part in (
        "/mnt/results/exports/other.bin",
        f"{16 * MiB:,} bytes",  # what it would add
        f"{40 * MiB:,} bytes",  # where it would bring the attachments
        f"quota of {32 * MiB:,} bytes",
        "tools.outputs_max_bytes",
        f"{24 * MiB:,} bytes are used by 1 attachment)",
        "nothing was attached",
        "Attach a smaller file",
    ):
        assert part in message, message
    assert tree(outputs) == before
    assert AttachmentStore(outputs, limits).usage().bytes == 24 * MiB
    again = attach(root, outputs, "exports/report.bin", limits)  # the stored content still fits: it adds nothing
    assert again.sha256 == first.sha256
    assert bytes_on_disk(outputs) == 24 * MiB


@pytest.mark.parametrize("first_bytes", [0, 1, 499, 999, 1000])
def test_the_byte_quota_takes_exactly_its_bytes_of_distinct_content(
    root: ResultsRoot, results: Path, tmp_path: Path, first_bytes: int
) -> None:
    outputs = tmp_path / "outputs"
    limits = OutputsLimits(max_bytes=1000, files_max=100)
    first = write_source(results, "first.bin", first_bytes, seed=10)
    rest = write_source(results, "rest.bin", 1000 - first_bytes, seed=11)
    attach(root, outputs, first, limits)
    attach(root, outputs, rest, limits)
    assert AttachmentStore(outputs, limits).usage().bytes == 1000
    before = tree(outputs)
    with pytest.raises(OutputsFull, match=r"tools\.outputs_max_bytes"):
        attach(root, outputs, write_source(results, "one-more.bin", 1, seed=12), limits)
    assert tree(outputs) == before
    attach(root, outputs, first, limits)  # already stored: adds no bytes
    attach(root, outputs, rest, limits)
    assert bytes_on_disk(outputs) == 1000


@pytest.mark.parametrize("files_max", [1, 2, 3, 5])
def test_the_file_limit_allows_exactly_n_attachments_and_refuses_the_next_even_of_stored_content(
    root: ResultsRoot, results: Path, tmp_path: Path, files_max: int
) -> None:
    outputs = tmp_path / "outputs"
    limits = OutputsLimits(max_bytes=10 * MiB, files_max=files_max)
    sources = [write_source(results, f"part-{i}.txt", 1000 + i, seed=i) for i in range(2)]
    for i in range(files_max):  # every other one shares its content: each attachment counts
        attach(root, outputs, sources[i % 2], limits)
    usage = AttachmentStore(outputs, limits).usage()
    assert (usage.attachments, usage.contents) == (files_max, min(files_max, 2))
    before = tree(outputs)
    for source in [*sources, write_source(results, "new.txt", 10, seed=99)]:
        with pytest.raises(OutputsFull) as refused:
            attach(root, outputs, source, limits)
        message = str(refused.value)
        assert f"already has {files_max:,} attachment" in message, message
        assert f"tools.outputs_files_max = {files_max:,}" in message, message
        assert "nothing was attached" in message
        assert "archive" in message  # what to do instead
    assert tree(outputs) == before


def test_a_legacy_attachment_folder_counts_its_own_copy(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    (outputs / "att-0123456789abcdef").mkdir(parents=True)
    (outputs / "att-0123456789abcdef" / "old.txt").write_bytes(b"x" * 100)  # made before content addressing
    usage = AttachmentStore(outputs, OutputsLimits(max_bytes=1000, files_max=5)).usage()
    assert (usage.attachments, usage.contents, usage.bytes) == (1, 1, 100)


def test_an_attachment_its_caller_could_not_record_is_discarded_and_its_content_with_it_when_unshared(
    root: ResultsRoot, results: Path, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    limits = OutputsLimits(max_bytes=MiB, files_max=10)
    store = AttachmentStore(outputs, limits)
    shared = [attach(root, outputs, write_source(results, "a.txt", 100, seed=20), limits) for _ in range(2)]
    alone = attach(root, outputs, write_source(results, "b.txt", 50, seed=21), limits)
    store.discard(shared[0].attachment_id)
    assert Path(shared[1].host_path).read_bytes() == (results / "exports" / "a.txt").read_bytes()
    store.discard(alone.attachment_id)
    assert not Path(alone.host_path).parent.exists()
    usage = store.usage()
    assert (usage.attachments, usage.contents, usage.bytes) == (1, 1, 100)
    assert bytes_on_disk(outputs) == 100
    with pytest.raises(ValueError, match="not an attachment id"):
        store.discard("../results")


# ------------------------------------------------------------------------------------------ concurrency
def test_eight_concurrent_attaches_of_the_same_content_store_it_once(
    root: ResultsRoot, results: Path, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    limits = OutputsLimits(max_bytes=5 * MiB, files_max=8)
    path = write_source(results, "same.bin", 4 * MiB, seed=3)
    start = threading.Barrier(8)
    cards: list[Attachment] = []

    def one() -> None:
        start.wait(WAIT_S)
        cards.append(attach(root, outputs, path, limits))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert len(cards) == 8
    assert bytes_on_disk(outputs) == 4 * MiB
    assert {Path(c.host_path).stat().st_nlink for c in cards} == {9}  # 8 attachments and the content itself
    assert staged(outputs) == []


def test_concurrent_attaches_of_different_contents_never_pass_the_quota(
    root: ResultsRoot, results: Path, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    limits = OutputsLimits(max_bytes=3 * MiB, files_max=100)
    paths = [write_source(results, f"part-{i}.bin", MiB, seed=100 + i) for i in range(8)]
    start = threading.Barrier(8)
    made: list[Attachment] = []
    refused: list[OutputsFull] = []

    def one(path: str) -> None:
        start.wait(WAIT_S)
        try:
            made.append(attach(root, outputs, path, limits))
        except OutputsFull as exc:
            refused.append(exc)

    threads = [threading.Thread(target=one, args=(path,)) for path in paths]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert (len(made), len(refused)) == (3, 5)
    assert bytes_on_disk(outputs) == 3 * MiB
    assert AttachmentStore(outputs, limits).usage().attachments == 3
    assert staged(outputs) == []


# ------------------------------------------------------------------------------------------ crashes
CRASHING_ATTACH = """\
import io, sys
from pathlib import Path
from sandbox_runtime.store.outputs import AttachmentStore, OutputsLimits
store = AttachmentStore(Path(sys.argv[1]), OutputsLimits(max_bytes=64 << 20, files_max=10))
store.add(io.FileIO(0, "r", closefd=False), "report.bin", max_bytes=64 << 20, shown="stdin")
"""


@pytest.mark.process
def test_an_attach_killed_mid_copy_leaves_nothing_that_counts_and_the_next_one_proceeds(
    root: ResultsRoot, results: Path, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    limits = OutputsLimits(max_bytes=64 * MiB, files_max=10)
    child = subprocess.Popen([sys.executable, "-c", CRASHING_ATTACH, str(outputs)], stdin=subprocess.PIPE)
    try:
        assert child.stdin is not None
        child.stdin.write(b"x" * MiB)  # the child copies this much, then waits for more while it holds the lock
        child.stdin.flush()
        deadline = time.monotonic() + WAIT_S
        while not [p for p in (outputs / ".staging").glob("*.partial") if p.stat().st_size >= MiB]:
            assert time.monotonic() < deadline, "the child never staged its copy"
            assert child.poll() is None, "the child ended before it was killed"
            time.sleep(0.01)
        assert AttachmentStore(outputs, limits).usage().bytes == 0  # a staged copy is no attachment
        child.send_signal(signal.SIGKILL)
        assert child.wait(WAIT_S) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT_S)
        if child.stdin is not None:
            child.stdin.close()
    card = run_bounded(lambda: attach(root, outputs, write_source(results, "a.txt", 10, seed=5), limits))
    assert isinstance(card, Attachment)
    assert staged(outputs) == []
    assert bytes_on_disk(outputs) == 10


def _staged_copy(outputs: Path) -> None:
    (outputs / ".staging" / "0123456789abcdef.partial").write_bytes(b"half" * 1000)


def _content_without_attachment(outputs: Path) -> None:
    (outputs / ".blobs" / ("ab" * 32)).write_bytes(b"whole" * 1000)


def _attachment_folder_not_yet_in_place(outputs: Path) -> None:
    _content_without_attachment(outputs)
    (outputs / ".staging" / "att-0123456789abcdef").mkdir()
    os.link(outputs / ".blobs" / ("ab" * 32), outputs / ".staging" / "att-0123456789abcdef" / "r.txt")


@pytest.mark.parametrize(
    "crash", [_staged_copy, _content_without_attachment, _attachment_folder_not_yet_in_place], ids=lambda f: f.__name__
)
def test_what_a_crash_between_steps_leaves_is_removed_by_the_next_attach(
    root: ResultsRoot, results: Path, tmp_path: Path, crash: Callable[[Path], None]
) -> None:
    outputs = tmp_path / "outputs"
    limits = OutputsLimits(max_bytes=6000, files_max=1)
    for folder in (".staging", ".blobs"):
        (outputs / folder).mkdir(parents=True, exist_ok=True)
    crash(outputs)
    card = attach(root, outputs, write_source(results, "r.txt", 5000, seed=6), limits)  # fits once cleaned up
    assert sorted(tree(outputs)) == [
        ".blobs",
        f".blobs/{card.sha256}",
        ".staging",
        card.attachment_id,
        f"{card.attachment_id}/r.txt",
    ]
    assert bytes_on_disk(outputs) == 5000


# ------------------------------------------------------------------------------------------ bounded, no links
def test_copying_is_streamed_a_32_mib_attach_allocates_at_most_a_few_mib(
    root: ResultsRoot, results: Path, tmp_path: Path
) -> None:
    path = write_source(results, "big.bin", 32 * MiB, seed=7)
    limits = OutputsLimits(max_bytes=64 * MiB, files_max=10)
    tracemalloc.start()
    try:
        attach(root, tmp_path / "outputs", path, limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MiB, f"{peak:,} bytes allocated at the peak"


def test_a_second_hard_link_or_a_linked_folder_is_refused_and_nothing_is_stored(
    root: ResultsRoot, results: Path, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    limits = OutputsLimits(max_bytes=MiB, files_max=10)
    os.link(results / write_source(results, "a.txt", 10, seed=8), results / "exports" / "b.txt")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret")
    (results / "linked").symlink_to(tmp_path / "outside")
    for path in ("exports/a.txt", "exports/b.txt", "linked/secret.txt", "../outside/secret.txt"):
        with pytest.raises(ToolFailure):
            attach(root, outputs, path, limits)
    with pytest.raises(UnsafeFileType, match="hard links"):
        attach(root, outputs, "exports/b.txt", limits)
    assert not outputs.exists() or bytes_on_disk(outputs) == 0


def test_a_source_that_grows_past_the_cap_while_it_is_read_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    store = AttachmentStore(outputs, OutputsLimits(max_bytes=10 * MiB, files_max=10))
    source = tmp_path / "growing.bin"
    source.write_bytes(b"y" * (2 * MiB))  # opened with a cap of 1 MiB: what a file that grew after its check reads
    with io.FileIO(source, "r") as file, pytest.raises(ToolFailure, match="grew past the cap"):
        store.add(file, "growing.bin", max_bytes=MiB, shown="/mnt/results/growing.bin")
    assert bytes_on_disk(outputs) == 0
    assert staged(outputs) == []
    assert store.usage().attachments == 0


# ------------------------------------------------------------------------------------------ through the runtime
WRITE_REPORT = "import os\nopen('/mnt/results/exports/report.bin', 'wb').write(os.urandom(24 << 20))\n"


def test_through_a_runtime_eight_attaches_of_a_24_mib_report_in_one_turn_are_one_copy_each_read_back(
    runtime_factory: RuntimeFactory,
) -> None:
    policy = load_policy("default").changed({"tools": {"outputs_max_bytes": 32 * MiB, "outputs_files_max": 8}}, "test")
    runtime = runtime_factory(policy)
    conversation = runtime.conversation("attach-once")
    assert not conversation.call("run_python", {"code": WRITE_REPORT}).is_error
    calls: list[ToolCall | HostResult] = [
        ToolCall(tool="attach_file", arguments={"path": "exports/report.bin", "filename": f"r{i}.bin"}, call_id=f"a{i}")
        for i in range(8)
    ]
    report = conversation.run_turn(calls)  # in parallel
    assert not any(outcome.is_error for outcome in report.outcomes), [o.text for o in report.outcomes]
    content = (conversation.folders.results / "exports" / "report.bin").read_bytes()
    cards = conversation.attachments()
    assert sorted(c.filename for c in cards) == [f"r{i}.bin" for i in range(8)]
    for card in cards:
        assert read_resource(runtime, attachment_uri(conversation.id, card.attachment_id)).data == content
    assert bytes_on_disk(conversation.folders.outputs) == 24 * MiB
    usage = runtime.store.outputs_usage(conversation.folders)
    assert (usage.attachments, usage.bytes, usage.max_bytes, usage.files_max) == (8, 24 * MiB, 32 * MiB, 8)


def test_through_a_runtime_a_file_past_the_attachments_quota_is_a_tool_error_and_nothing_is_recorded(
    runtime_factory: RuntimeFactory,
) -> None:
    policy = load_policy("default").changed({"tools": {"outputs_max_bytes": 32 * MiB, "outputs_files_max": 2}}, "test")
    runtime = runtime_factory(policy)
    conversation = runtime.conversation("attach-full")
    assert not conversation.call("run_python", {"code": WRITE_REPORT}).is_error
    assert not conversation.call("attach_file", {"path": "exports/report.bin"}).is_error
    before = tree(conversation.folders.outputs)
    code = "import os\nopen('/mnt/results/exports/other.bin', 'wb').write(os.urandom(16 << 20))\n"
    assert not conversation.call("run_python", {"code": code}).is_error
    refused = conversation.call("attach_file", {"path": "exports/other.bin"})
    assert refused.is_error
    assert "OutputsFull" in refused.text
    assert "tools.outputs_max_bytes" in refused.text
    assert tree(conversation.folders.outputs) == before
    assert not conversation.call("attach_file", {"path": "exports/report.bin"}).is_error  # stored: adds nothing
    refused = conversation.call("attach_file", {"path": "exports/report.bin"})
    assert refused.is_error
    assert "tools.outputs_files_max = 2" in refused.text
    assert len(conversation.attachments()) == 2
