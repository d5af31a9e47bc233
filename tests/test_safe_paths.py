"""The host opens model-named files in a hostile results folder without ever leaving it.

Every test plants hostile content directly with os calls (no Docker needed) and proves that the host refuses
it with a typed error, never blocks, never reads outside the folder and never writes through a planted link.
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest

from sandbox_runtime.errors import (
    FileTooLarge,
    PathNotFound,
    PathOutsideResults,
    PathRejected,
    UnsafeFileType,
)
from sandbox_runtime.store import safe_paths
from sandbox_runtime.store.safe_paths import Entry, ResultsRoot, display_name, read_capped

SECRET = b"host-only secret: root:$6$never-leaves-the-host"
HARMLESS = b"a,b\n1,2\n"
TIB = 1 << 40

Swapper = Callable[[Path, Path, threading.Event, threading.Event], None]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the results folder holding a secret the sandbox must never see."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "shadow").write_bytes(SECRET)
    return folder


@pytest.fixture
def fast_results(tmp_path: Path) -> Iterator[Path]:
    """A results folder on tmpfs where there is one: 50,000 creates can take many seconds on a slow disk."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        folder = tmp_path / "fast-results"
        folder.mkdir()
        yield folder
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="test-safe-paths-") as name:
        yield Path(name)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def leftovers(folder: Path) -> list[str]:
    return [name for name in os.listdir(folder) if name.startswith(".sandbox-runtime-")]


# ------------------------------------------------------------------------------------------------- paths
@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("../../etc/passwd", "climbs above"),
        ("/etc/passwd", "absolute path outside /mnt/results"),
        ("a/../..", "climbs above"),
        ("/mnt/results/../etc/passwd", "climbs above"),
        ("/mnt/resultsX/a", "absolute path outside"),
        ("%2e%2e%2f", "percent-encoded"),
        ("%2E%2e/etc/passwd", "percent-encoded"),
        ("spill%2Fa.json", "percent-encoded"),
        ("%252e%252e%252f", "percent-encoded"),
        ("a%5Cb", "percent-encoded"),
        ("a\x00b", "NUL byte"),
        ("a\nb", "control character"),
        ("a\x1b[31mb", "control character"),
        ("a\x7fb", "control character"),
        ("..\\..\\etc\\passwd", "backslash"),
        ("x" * 5000, "more than 4096"),
        ("a" * 256, "longer than 255 bytes"),
        ("\ud800", "unpaired surrogate"),
        ("", "is empty"),
        ("   ", "is empty"),
        ("/mnt/results", "results folder itself"),
        (".", "results folder itself"),
        ("a/..", "results folder itself"),
    ],
    ids=lambda value: repr(value)[:30],
)
def test_a_malformed_or_escaping_path_is_refused_with_a_message_naming_the_accepted_form(
    root: ResultsRoot, raw: str, problem: str
) -> None:
    with pytest.raises(PathOutsideResults) as caught:
        root.parse(raw)
    message = str(caught.value)
    assert problem in message
    assert "e.g. 'spill/a.json' or '/mnt/results/spill/a.json'" in message
    assert "\x00" not in message
    assert "\n" not in message
    assert len(message) < 400  # a 5,000-character name is not echoed back whole


@pytest.mark.parametrize("value", [123, None, b"spill/a.json", Path("spill/a.json")])
def test_a_path_that_is_not_a_string_is_refused(root: ResultsRoot, value: object) -> None:
    with pytest.raises(PathOutsideResults, match="must be a string"):
        root.parse(cast(str, value))


def test_the_sandbox_form_and_the_relative_form_name_the_same_file(root: ResultsRoot, results: Path) -> None:
    (results / "spill").mkdir()
    (results / "spill" / "a.json").write_bytes(b'{"rows": 3}')
    forms = ["/mnt/results/spill/a.json", "spill/a.json", "./spill/./a.json", "spill/x/../a.json"]
    assert {root.parse(form) for form in forms} == {("spill", "a.json")}
    assert {root.read_bytes(form, max_bytes=100) for form in forms} == {b'{"rows": 3}'}
    assert root.sandbox_path(("spill", "a.json")) == "/mnt/results/spill/a.json"
    assert root.host_path(("spill", "a.json")) == results / "spill" / "a.json"
    assert root.read_bytes(("spill", "a.json"), max_bytes=100) == b'{"rows": 3}'


def test_a_255_byte_name_is_accepted_and_a_256_byte_name_is_not(root: ResultsRoot) -> None:
    name = "é" * 127 + "a"  # 255 bytes in UTF-8, 128 characters
    assert root.parse(f"spill/{name}") == ("spill", name)
    with pytest.raises(PathOutsideResults, match="longer than 255 bytes"):
        root.parse(f"spill/{name}b")


@pytest.mark.parametrize("components", [("..", "etc"), ("a/b",), ("",), ("a", "."), ("/etc",)])
def test_component_tuples_are_validated_like_strings(root: ResultsRoot, components: tuple[str, ...]) -> None:
    with pytest.raises(PathOutsideResults):
        root.read_bytes(components, max_bytes=10)


def test_a_custom_mount_path_is_honoured_and_a_bad_one_is_refused(results: Path) -> None:
    custom = ResultsRoot(results, "/data/out")
    assert custom.parse("/data/out/a.csv") == ("a.csv",)
    assert custom.sandbox_path(("a.csv",)) == "/data/out/a.csv"
    with pytest.raises(PathOutsideResults, match="outside /data/out"):
        custom.parse("/mnt/results/a.csv")
    for bad in ("relative", "/", "/a/../b", "/a/"):
        with pytest.raises(ValueError, match="mount_path"):
            ResultsRoot(results, bad)


def test_the_results_folder_itself_can_be_listed_but_not_read(root: ResultsRoot, results: Path) -> None:
    (results / "a.csv").write_bytes(HARMLESS)
    assert [entry.name for entry in root.list_dir("/mnt/results", max_entries=10)] == ["a.csv"]
    assert root.parse(".", allow_root=True) == ()
    with pytest.raises(PathOutsideResults, match="itself"):
        root.read_bytes("/mnt/results/", max_bytes=100)


# ---------------------------------------------------------------------------------------- symlinks
@pytest.mark.parametrize("target", ["outside/shadow", "/", "../outside/shadow"], ids=["abs", "slash", "rel"])
def test_a_symlink_to_etc_shadow_is_refused_and_nothing_outside_is_read(
    root: ResultsRoot, results: Path, outside: Path, target: str
) -> None:
    link_target = str(outside / "shadow") if target == "outside/shadow" else target
    os.symlink(link_target, results / "out.csv")
    before = open_fds()
    for read in (
        lambda: root.read_bytes("out.csv", max_bytes=1 << 20),
        lambda: root.read_text("/mnt/results/out.csv", max_bytes=1 << 20),
        lambda: root.list_dir("out.csv", max_entries=10),
    ):
        with pytest.raises(UnsafeFileType, match="symbolic link"):
            read()
    with pytest.raises(UnsafeFileType), root.open_regular("out.csv", max_bytes=1 << 20):
        pytest.fail("a symlink was opened")
    assert open_fds() == before


def test_a_symlinked_parent_folder_is_refused_for_reads_listings_and_writes(
    root: ResultsRoot, results: Path, outside: Path
) -> None:
    os.symlink(outside, results / "spill")
    with pytest.raises(UnsafeFileType, match="symbolic link, not a folder"):
        root.read_bytes("/mnt/results/spill/shadow", max_bytes=1 << 20)
    with pytest.raises(UnsafeFileType):
        root.list_dir("spill", max_entries=10)
    with pytest.raises(UnsafeFileType):
        root.create_file("spill/planted.txt", b"x")
    with pytest.raises(UnsafeFileType):
        root.ensure_dir("spill/deeper")
    assert sorted(os.listdir(outside)) == ["shadow"]


def _swap_file(results: Path, outside: Path, stop: threading.Event, swapped: threading.Event) -> None:
    while not stop.is_set():
        os.symlink(outside / "shadow", results / ".link")
        os.replace(results / ".link", results / "out.csv")
        swapped.set()
        (results / ".real").write_bytes(HARMLESS)
        os.replace(results / ".real", results / "out.csv")


def _swap_parent(results: Path, outside: Path, stop: threading.Event, swapped: threading.Event) -> None:
    while not stop.is_set():
        os.rename(results / "spill", results / "spill.real")
        os.symlink(outside, results / "spill")
        swapped.set()
        os.unlink(results / "spill")
        os.rename(results / "spill.real", results / "spill")


@pytest.mark.parametrize(
    ("swapper", "name"), [(_swap_file, "out.csv"), (_swap_parent, "spill/out.csv")], ids=["file", "parent"]
)
def test_a_file_swapped_with_a_symlink_while_the_host_reads_it_never_yields_outside_content(
    root: ResultsRoot, results: Path, outside: Path, swapper: Swapper, name: str
) -> None:
    (outside / "out.csv").write_bytes(SECRET)
    (results / "spill").mkdir()
    (results / "spill" / "out.csv").write_bytes(HARMLESS)
    (results / "out.csv").write_bytes(HARMLESS)
    stop, swapped = threading.Event(), threading.Event()
    thread = threading.Thread(target=swapper, args=(results, outside, stop, swapped), daemon=True)
    thread.start()
    outcomes: set[object] = set()
    try:
        assert swapped.wait(timeout=5)
        for _ in range(1500):
            try:
                outcomes.add(root.read_bytes(name, max_bytes=1024))
            except (UnsafeFileType, PathNotFound) as exc:
                outcomes.add(type(exc))
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert SECRET not in outcomes
    assert outcomes <= {HARMLESS, UnsafeFileType, PathNotFound}


# ------------------------------------------------------------------------------------------- writing
@pytest.mark.parametrize("dangling", [False, True], ids=["to-existing-file", "dangling"])
def test_a_symlink_pre_planted_where_the_host_creates_a_file_makes_the_create_fail(
    root: ResultsRoot, results: Path, outside: Path, dangling: bool
) -> None:
    target = outside / ("not-yet-there" if dangling else "shadow")
    (results / "args").mkdir()
    os.symlink(target, results / "args" / "call.json")
    with pytest.raises(UnsafeFileType, match="already exists as a symbolic link"):
        root.create_file("args/call.json", b'{"evil": false}')
    assert target.exists() is not dangling
    if not dangling:
        assert target.read_bytes() == SECRET
    assert (results / "args" / "call.json").is_symlink()
    assert leftovers(results / "args") == []


def test_replace_file_replaces_a_planted_symlink_itself_never_its_target(
    root: ResultsRoot, results: Path, outside: Path
) -> None:
    os.symlink(outside / "shadow", results / "manifest.json")
    assert root.replace_file("manifest.json", b"{}") == "/mnt/results/manifest.json"
    assert (outside / "shadow").read_bytes() == SECRET
    assert not (results / "manifest.json").is_symlink()
    assert root.read_bytes("manifest.json", max_bytes=10) == b"{}"
    root.replace_file("manifest.json", b'{"v": 2}')
    assert root.read_bytes("manifest.json", max_bytes=10) == b'{"v": 2}'
    (results / "folder").mkdir()
    with pytest.raises(UnsafeFileType, match="folder"):
        root.replace_file("folder", b"x")
    assert leftovers(results) == []


def test_create_file_refuses_to_overwrite_an_existing_file(root: ResultsRoot, results: Path) -> None:
    (results / "out.csv").write_bytes(HARMLESS)
    with pytest.raises(PathRejected, match="already exists; choose another name") as caught:
        root.create_file("out.csv", b"new")
    assert not isinstance(caught.value, UnsafeFileType)
    assert (results / "out.csv").read_bytes() == HARMLESS
    assert leftovers(results) == []


def test_create_file_makes_parents_and_publishes_exactly_0644_whatever_the_umask(
    root: ResultsRoot, results: Path
) -> None:
    old_umask = os.umask(0o077)
    try:
        path = root.create_file("/mnt/results/exports/2024/report.csv", HARMLESS)
    finally:
        os.umask(old_umask)
    assert path == "/mnt/results/exports/2024/report.csv"
    produced = results / "exports" / "2024" / "report.csv"
    assert produced.read_bytes() == HARMLESS
    assert stat.S_IMODE(produced.stat().st_mode) == 0o644
    assert produced.stat().st_nlink == 1
    assert stat.S_IMODE((results / "exports").stat().st_mode) == 0o755
    assert leftovers(produced.parent) == []


def test_create_file_refuses_special_mode_bits_and_missing_parents_when_asked(root: ResultsRoot) -> None:
    with pytest.raises(ValueError, match="special bits"):
        root.create_file("tool", b"#!/bin/sh\n", mode=0o4755)
    with pytest.raises(PathNotFound):
        root.create_file("missing/out.csv", b"x", make_parents=False)


def test_ensure_dir_creates_nested_folders_and_refuses_a_file_in_the_way(root: ResultsRoot, results: Path) -> None:
    root.ensure_dir("a/b/c")
    root.ensure_dir("a/b/c")
    assert (results / "a" / "b" / "c").is_dir()
    (results / "a" / "file").write_bytes(b"x")
    with pytest.raises(UnsafeFileType, match="regular file, not a folder"):
        root.ensure_dir("a/file/d")


def test_a_setuid_file_is_readable_and_its_copy_handed_out_is_0644(root: ResultsRoot, results: Path) -> None:
    produced = results / "tool"
    produced.write_bytes(b"\x7fELF...")
    os.chmod(produced, 0o4755)  # noqa: S103  (the sandbox-set setuid bit under test)
    data = root.read_bytes("tool", max_bytes=100)
    assert data == b"\x7fELF..."
    root.create_file("attachments/tool", data)
    assert stat.S_IMODE((results / "attachments" / "tool").stat().st_mode) == 0o644


# ---------------------------------------------------------------------------------- special files
def _make_special(results: Path, kind: str) -> None:
    path = results / "out.csv"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        os.mknod(path, 0o600 | stat.S_IFSOCK)
    elif kind == "device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod of a character device is not permitted here (not root / no CAP_MKNOD)")
    else:
        path.mkdir()


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("fifo", "FIFO"),
        ("socket", "socket"),
        ("device", "character device"),
        ("dir", "folder"),
    ],
)
@pytest.mark.parametrize("precheck", [True, False], ids=["lstat-first", "descriptor-only"])
def test_a_fifo_socket_device_or_folder_named_like_a_result_is_refused_at_once(
    root: ResultsRoot, monkeypatch: pytest.MonkeyPatch, kind: str, words: str, precheck: bool
) -> None:
    _make_special(root.host_root, kind)
    if not precheck:  # prove the descriptor check alone is enough if the file is swapped after the lstat
        monkeypatch.setattr(safe_paths, "refuse_if_not_regular", lambda *_args: None)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            root.read_bytes("out.csv", max_bytes=1 << 20)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=5)
    assert not thread.is_alive(), "the read blocked"
    assert len(outcome) == 1
    assert isinstance(outcome[0], UnsafeFileType)
    assert words in str(outcome[0])


def test_a_hard_link_to_a_file_outside_is_refused(root: ResultsRoot, results: Path, outside: Path) -> None:
    os.link(outside / "shadow", results / "out.csv")
    with pytest.raises(UnsafeFileType, match="2 hard links"):
        root.read_bytes("out.csv", max_bytes=1 << 20)


# ------------------------------------------------------------------------------------------- caps
def test_a_file_of_exactly_the_cap_is_read_and_one_byte_more_is_too_large(root: ResultsRoot, results: Path) -> None:
    cap = 1_048_576
    (results / "args.json").write_bytes(b"x" * cap)
    (results / "big.json").write_bytes(b"x" * (cap + 1))
    assert len(root.read_bytes("args.json", max_bytes=cap)) == cap
    with pytest.raises(FileTooLarge, match=f"1048577 bytes, more than the cap of {cap} bytes"):
        root.read_bytes("big.json", max_bytes=cap)


def test_a_file_growing_while_read_never_yields_more_than_the_cap(root: ResultsRoot, results: Path) -> None:
    (results / "grow.log").write_bytes(b"x" * 10)
    with root.open_regular("grow.log", max_bytes=10) as (file, st):
        assert st.st_size == 10
        with open(results / "grow.log", "ab") as writer:
            writer.write(b"y" * 100_000)
        with pytest.raises(FileTooLarge, match="grew past the cap of 10 bytes"):
            read_capped(file, 10)
        assert file.tell() == 11  # never read past cap + 1


def test_invalid_utf8_text_is_a_typed_error_and_valid_text_is_read(root: ResultsRoot, results: Path) -> None:
    (results / "ok.txt").write_text("héllo", encoding="utf-8")
    (results / "bad.txt").write_bytes(b"ok\xff\xfe")
    assert root.read_text("ok.txt", max_bytes=100) == "héllo"
    with pytest.raises(PathRejected, match="not utf-8 text"):
        root.read_text("bad.txt", max_bytes=100)


def test_a_missing_file_or_parent_is_path_not_found(root: ResultsRoot) -> None:
    with pytest.raises(PathNotFound):
        root.read_bytes("nope.csv", max_bytes=10)
    with pytest.raises(PathNotFound):
        root.read_bytes("no/such/folder.csv", max_bytes=10)


# ----------------------------------------------------------------------------------- walks and usage
def test_a_sparse_1_tb_file_counts_only_its_blocks_and_is_too_large_to_read(root: ResultsRoot, results: Path) -> None:
    with open(results / "sparse.bin", "wb") as handle:
        os.truncate(handle.fileno(), TIB)
    usage = root.measure_usage()
    assert usage.complete
    assert usage.files == 1
    assert usage.bytes_used < 1 << 20
    with pytest.raises(FileTooLarge, match=str(TIB)):
        root.read_bytes("sparse.bin", max_bytes=1 << 20)


def test_hard_linked_inodes_are_counted_once(root: ResultsRoot, results: Path) -> None:
    (results / "a.bin").write_bytes(b"x" * 65536)
    alone = root.measure_usage().bytes_used
    os.link(results / "a.bin", results / "b.bin")
    usage = root.measure_usage()
    assert usage.files == 2
    assert usage.bytes_used == alone


def test_measure_usage_never_follows_a_symlink_to_a_big_folder(root: ResultsRoot, results: Path, outside: Path) -> None:
    (outside / "big.bin").write_bytes(b"x" * (1 << 20))
    os.symlink(outside, results / "link")
    usage = root.measure_usage()
    assert (usage.files, usage.dirs, usage.others, usage.complete) == (0, 0, 1, True)
    assert usage.bytes_used < 1 << 20


def _remove_chain(base: Path, name: str) -> None:
    """shutil.rmtree recurses and would fail 10,000 deep: pull each level up to ``base`` and remove it."""
    base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while True:
            top = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=base_fd)
            try:
                children = os.listdir(top)
                for child in children:
                    os.rename(child, f"{name}.next", src_dir_fd=top, dst_dir_fd=base_fd)
            finally:
                os.close(top)
            os.rmdir(name, dir_fd=base_fd)
            if not children:
                return
            os.rename(f"{name}.next", name, src_dir_fd=base_fd, dst_dir_fd=base_fd)
    finally:
        os.close(base_fd)


@pytest.fixture
def deep_results(fast_results: Path) -> Iterator[Path]:
    """10,000 nested folders ``d/d/d/...`` (far beyond PATH_MAX), removed again without recursion."""
    results = fast_results
    fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(10_000):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    yield results
    _remove_chain(results, "d")


def test_10000_deep_folders_are_measured_within_bounds_without_crashing_or_leaking(
    deep_results: Path,
) -> None:
    root = ResultsRoot(deep_results)
    before = open_fds()
    started = time.monotonic()
    usage = root.measure_usage(max_depth=256)
    assert usage.complete is False
    assert usage.dirs == 257  # depths 1..257 are seen; only those up to 256 are opened
    assert open_fds() == before
    deep_path = "d/" * 2000 + "missing.csv"  # 4,011 bytes: within the path limit, 2,000 folders walked
    with pytest.raises(PathNotFound):
        root.read_bytes(deep_path, max_bytes=10)
    assert open_fds() == before
    assert time.monotonic() - started < 5


def test_a_folder_with_50000_files_is_measured_and_listed_only_up_to_the_bound(fast_results: Path) -> None:
    results = fast_results
    root = ResultsRoot(results)
    fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for number in range(50_000):
            os.mknod(f"f{number}", 0o600 | stat.S_IFREG, dir_fd=fd)
    finally:
        os.close(fd)
    usage = root.measure_usage(max_entries=10_000)
    assert usage.complete is False
    assert usage.files == 10_000
    assert len(root.list_dir(".", max_entries=100)) == 100


ODD_NAMES = [b"bad\xff\xfe.csv", b"new\nline.csv", b"a" * 255, "evil\u202etxt.exe".encode()]


def test_odd_names_are_listed_measured_read_and_displayed_safely(root: ResultsRoot, results: Path) -> None:
    base = os.fsencode(results)
    for name in ODD_NAMES:
        with open(base + b"/" + name, "wb") as handle:
            handle.write(name)
    entries = root.list_dir("/mnt/results", max_entries=100)
    assert sorted(os.fsencode(entry.name) for entry in entries) == sorted(ODD_NAMES)
    assert all(entry.kind == "file" for entry in entries)
    usage = root.measure_usage()
    assert (usage.files, usage.complete) == (4, True)
    assert root.read_bytes(os.fsdecode(b"bad\xff\xfe.csv"), max_bytes=100) == b"bad\xff\xfe.csv"
    assert root.read_bytes("a" * 255, max_bytes=300) == b"a" * 255
    assert root.read_bytes("evil\u202etxt.exe", max_bytes=100) == "evil\u202etxt.exe".encode()
    shown = [display_name(entry.name) for entry in entries]
    assert "bad\\xff\\xfe.csv" in shown
    assert "new\\x0aline.csv" in shown
    assert "evil\\u202etxt.exe" in shown
    with pytest.raises(PathOutsideResults, match="control character"):
        root.read_bytes("new\nline.csv", max_bytes=100)


def test_list_dir_reports_kinds_and_sizes_without_following_anything(
    root: ResultsRoot, results: Path, outside: Path
) -> None:
    (results / "data.csv").write_bytes(HARMLESS)
    (results / "sub").mkdir()
    os.symlink(outside / "shadow", results / "link")
    os.mkfifo(results / "pipe")
    entries = root.list_dir(".", max_entries=10)
    by_name = {entry.name: entry for entry in entries}
    assert by_name["data.csv"] == Entry("data.csv", "file", len(HARMLESS))
    assert by_name["sub"].kind == "dir"
    assert by_name["link"].kind == "symlink"
    assert by_name["link"].size == len(str(outside / "shadow"))
    assert by_name["pipe"].kind == "fifo"
    assert [entry.name for entry in entries] == sorted(by_name)
    with pytest.raises(UnsafeFileType, match="regular file, not a folder"):
        root.list_dir("data.csv", max_entries=10)


def test_no_descriptor_is_leaked_when_operations_fail(root: ResultsRoot, results: Path, outside: Path) -> None:
    os.symlink(outside, results / "spill")
    (results / "big").write_bytes(b"x" * 100)
    os.mkfifo(results / "pipe")
    before = open_fds()
    for _ in range(50):
        for failing in (
            lambda: root.read_bytes("spill/shadow", max_bytes=10),
            lambda: root.read_bytes("big", max_bytes=10),
            lambda: root.read_bytes("pipe", max_bytes=10),
            lambda: root.create_file("big", b"x"),
            lambda: root.create_file("spill/x", b"x"),
            lambda: root.list_dir("big", max_entries=1),
        ):
            with pytest.raises((PathRejected, PathNotFound)):
                failing()
    assert open_fds() == before
