"""The host clears old spill, error and argument files from a hostile results folder without ever leaving it.

Every test plants content directly with os calls (no Docker needed), ages it with ``os.utime`` and checks that
the sweep removes exactly the old entries of the chosen folders, never follows a planted link, never blocks on
a FIFO, and reports problems instead of raising.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_runtime.store.sweep import SweepReport, SweptFile, sweep_older_than

NOW = time.time()
CUTOFF = NOW - 3600
OLD = NOW - 7200
FOLDERS = ("spill", "errors", "args")
SECRET = b"host-only secret"


def age(path: Path | bytes, when: float = OLD) -> None:
    os.utime(path, (when, when), follow_symlinks=False)


def plant(path: Path, data: bytes = b"x", when: float = OLD) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    age(path, when)
    return path


def removed_paths(report: SweepReport) -> set[str]:
    return {item.path for item in report.removed}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host folder beside the results folder, full of old files the sweep must never touch."""
    folder = tmp_path / "outside"
    folder.mkdir()
    plant(folder / "shadow", SECRET)
    age(folder)
    return folder


@pytest.fixture
def fast_results(tmp_path: Path) -> Iterator[Path]:
    """A results folder on tmpfs where there is one, so creating many files does not dominate the test."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path / "results-fast"
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="test-sweep-") as name:
        yield Path(name)


# ------------------------------------------------------------------------------------------- the usual day
def test_old_files_are_removed_and_young_ones_kept_in_spill_errors_and_args(results: Path) -> None:
    for folder in FOLDERS:
        plant(results / folder / "old.txt")
        plant(results / folder / "young.txt", when=NOW)

    report = sweep_older_than(results, FOLDERS, CUTOFF)

    assert removed_paths(report) == {f"{folder}/old.txt" for folder in FOLDERS}
    assert all((results / folder / "young.txt").exists() for folder in FOLDERS)
    assert not any((results / folder / "old.txt").exists() for folder in FOLDERS)
    assert (report.kept_files, report.errors, report.complete) == (3, (), True)
    assert all((results / folder).is_dir() for folder in FOLDERS)


def test_other_folders_and_files_at_the_root_are_never_touched(results: Path) -> None:
    untouched = [plant(results / name / "old.csv") for name in ("exports", "outputs", "scripts", "spill-old")]
    untouched.append(plant(results / "old-at-root.txt"))
    plant(results / "spill" / "old.json")

    report = sweep_older_than(results, ("spill",), CUTOFF)

    assert removed_paths(report) == {"spill/old.json"}
    assert all(path.exists() for path in untouched)


def test_a_missing_folder_or_results_folder_is_simply_nothing_to_do(tmp_path: Path, results: Path) -> None:
    assert sweep_older_than(results, FOLDERS, CUTOFF) == SweepReport((), 0, 0, (), complete=True)
    assert sweep_older_than(tmp_path / "gone", FOLDERS, CUTOFF).errors == ()


def test_a_file_exactly_at_the_cutoff_is_kept(results: Path) -> None:
    plant(results / "spill" / "borderline.txt", when=CUTOFF)

    report = sweep_older_than(results, ("spill",), CUTOFF)

    assert (report.removed, report.kept_files) == ((), 1)


def test_removed_bytes_is_the_sum_of_the_sizes_that_were_removed(results: Path) -> None:
    sizes = {"spill/a.bin": 10, "spill/deep/b.bin": 2048, "errors/c.txt": 0, "args/d.json": 777}
    for rel, size in sizes.items():
        plant(results / rel, b"z" * size)
    plant(results / "spill" / "young.bin", b"y" * 5000, when=NOW)

    report = sweep_older_than(results, FOLDERS, CUTOFF)

    assert {item.path: item.bytes for item in report.removed} == sizes
    assert report.removed_bytes == sum(item.bytes for item in report.removed) == sum(sizes.values())
    assert all(isinstance(item, SweptFile) and item.mtime == pytest.approx(OLD) for item in report.removed)


# ---------------------------------------------------------------------------------- hostile top folders
def test_a_spill_folder_planted_as_a_symlink_to_outside_is_reported_and_never_followed(
    results: Path, outside: Path
) -> None:
    (results / "spill").symlink_to(outside)
    plant(results / "errors" / "old.txt")

    report = sweep_older_than(results, FOLDERS, CUTOFF)

    assert (outside / "shadow").read_bytes() == SECRET
    assert removed_paths(report) == {"errors/old.txt"}
    assert len(report.errors) == 1
    assert "spill is a symlink, not a folder" in report.errors[0]
    assert (results / "spill").is_symlink()


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("kind", "make"), [("file", Path.touch), ("fifo", os.mkfifo)])
def test_a_top_folder_that_is_a_file_or_a_fifo_is_reported_and_left_alone(
    results: Path, kind: str, make: Callable[[Path], None]
) -> None:
    make(results / "spill")
    age(results / "spill")

    report = sweep_older_than(results, ("spill",), CUTOFF)

    assert report.errors == (f"spill is a {kind}, not a folder; not swept",)
    assert os.path.lexists(results / "spill")


def test_folder_names_that_are_not_single_names_are_a_programming_error(results: Path) -> None:
    for bad in ("", ".", "..", "spill/sub", "../outside", "a\0b"):
        with pytest.raises(ValueError, match="not a single name"):
            sweep_older_than(results, (bad,), CUTOFF)
    with pytest.raises(ValueError, match=">= 0"):
        sweep_older_than(results, FOLDERS, CUTOFF, max_entries=-1)


# -------------------------------------------------------------------------------- hostile entries inside
def test_a_symlink_inside_spill_is_removed_itself_and_its_target_survives(results: Path, outside: Path) -> None:
    spill = results / "spill"
    spill.mkdir()
    (spill / "old-link").symlink_to(outside / "shadow")
    age(spill / "old-link")
    (spill / "young-link").symlink_to(outside / "shadow")  # its target is old, but the link itself is young
    (spill / "dir-link").symlink_to(outside)
    age(spill / "dir-link")

    report = sweep_older_than(results, ("spill",), CUTOFF)

    assert removed_paths(report) == {"spill/old-link", "spill/dir-link"}
    assert (spill / "young-link").is_symlink()
    assert (outside / "shadow").read_bytes() == SECRET
    assert report.errors == ()


def test_a_hard_link_to_an_outside_file_only_loses_its_name_in_spill(results: Path, outside: Path) -> None:
    (results / "spill").mkdir()
    os.link(outside / "shadow", results / "spill" / "linked")

    report = sweep_older_than(results, ("spill",), CUTOFF)

    assert removed_paths(report) == {"spill/linked"}
    assert (outside / "shadow").read_bytes() == SECRET


@pytest.mark.timeout(10)
def test_a_fifo_and_a_socket_are_removed_without_ever_being_opened(results: Path) -> None:
    spill = results / "spill"
    spill.mkdir()
    os.mkfifo(spill / "pipe")
    os.mknod(spill / "sock", stat.S_IFSOCK | 0o600)
    os.mkfifo(spill / "young-pipe")
    age(spill / "pipe")
    age(spill / "sock")

    report = sweep_older_than(results, ("spill",), CUTOFF)

    assert removed_paths(report) == {"spill/pipe", "spill/sock"}
    assert os.listdir(spill) == ["young-pipe"]


def test_nested_folders_are_swept_and_old_folders_left_empty_are_removed(results: Path) -> None:
    spill = results / "spill"
    plant(spill / "a" / "b" / "c" / "old.txt")
    plant(spill / "a" / "keep" / "young.txt", when=NOW)
    (spill / "young-empty").mkdir()
    (spill / "old-empty").mkdir()
    for folder in ("a/b/c", "a/b", "a/keep", "a", "old-empty", ""):
        age(spill / folder)

    report = sweep_older_than(results, ("spill",), CUTOFF)

    assert removed_paths(report) == {"spill/a/b/c/old.txt"}
    assert sorted(os.listdir(spill)) == ["a", "young-empty"]
    assert os.listdir(spill / "a") == ["keep"]  # b and c emptied and removed; keep still holds a young file
    assert (spill / "a" / "keep" / "young.txt").exists()
    assert report.errors == ()


def test_a_top_folder_is_never_removed_even_when_old_and_emptied(results: Path) -> None:
    plant(results / "errors" / "old.txt")
    age(results / "errors")

    sweep_older_than(results, ("errors",), CUTOFF)

    assert os.listdir(results / "errors") == []


def test_in_flight_temp_files_are_kept_while_young_and_removed_when_stale(results: Path) -> None:
    writing = plant(results / "spill" / ".sandbox-runtime-0123456789abcdef.tmp", when=NOW)
    plant(results / "spill" / ".sandbox-runtime-fedcba9876543210.tmp")

    report = sweep_older_than(results, ("spill",), CUTOFF)

    assert removed_paths(report) == {"spill/.sandbox-runtime-fedcba9876543210.tmp"}
    assert writing.exists()


def test_names_with_newlines_and_invalid_utf8_are_removed_and_reported_with_surrogate_escapes(
    results: Path,
) -> None:
    spill = os.fsencode(results / "spill")
    os.mkdir(spill)
    odd = [b"line\nbreak.txt", b"bad\xff\xfe.bin", b"\xe2\x80\xaeevil.txt", b"sub\xff"]
    for name in odd[:3]:
        with open(spill + b"/" + name, "wb") as file:
            file.write(b"data")
        age(spill + b"/" + name)
    os.mkdir(spill + b"/" + odd[3])
    with open(spill + b"/" + odd[3] + b"/in\nside", "wb") as file:
        file.write(b"data")
    age(spill + b"/" + odd[3] + b"/in\nside")

    report = sweep_older_than(results, ("spill",), CUTOFF)

    expected = {b"spill/" + name for name in odd[:3]} | {b"spill/sub\xff/in\nside"}
    assert {os.fsencode(item.path) for item in report.removed} == expected
    assert os.listdir(spill) == [odd[3]]
    assert report.errors == ()


# ---------------------------------------------------------------------------------------- races and errors
def test_an_entry_that_vanishes_before_its_unlink_is_skipped_silently(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant(results / "spill" / "racy.txt")
    plant(results / "spill" / "plain.txt")
    real_unlink = os.unlink

    def sandbox_removes_it_first(name: str, *, dir_fd: int | None = None) -> None:
        if name == "racy.txt":
            real_unlink(name, dir_fd=dir_fd)
        real_unlink(name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", sandbox_removes_it_first)
    report = sweep_older_than(results, ("spill",), CUTOFF)

    assert removed_paths(report) == {"spill/plain.txt"}
    assert report.errors == ()


def test_an_entry_that_cannot_be_removed_is_reported_and_the_sweep_goes_on(
    results: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant(results / "spill" / "stuck.txt")
    plant(results / "errors" / "old.txt")
    real_unlink = os.unlink

    def refuse_one(name: str, *, dir_fd: int | None = None) -> None:
        if name == "stuck.txt":
            raise PermissionError(1, "Operation not permitted")
        real_unlink(name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", refuse_one)
    report = sweep_older_than(results, ("spill", "errors"), CUTOFF)

    assert removed_paths(report) == {"errors/old.txt"}
    assert report.errors == ("spill/stuck.txt is left: Operation not permitted",)
    assert (report.kept_files, report.complete) == (1, True)


def test_a_subfolder_swapped_for_a_link_to_outside_during_the_walk_is_not_followed(
    results: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spill = results / "spill"
    plant(spill / "first.txt")
    plant(spill / "sub" / "old.txt")
    real_unlink = os.unlink

    def swap_sub_for_a_link(name: str, *, dir_fd: int | None = None) -> None:
        real_unlink(name, dir_fd=dir_fd)
        if name == "first.txt":  # the top folder is scanned before its subfolders are opened
            (spill / "sub" / "old.txt").unlink()
            (spill / "sub").rmdir()
            (spill / "sub").symlink_to(outside)

    monkeypatch.setattr(os, "unlink", swap_sub_for_a_link)
    report = sweep_older_than(results, ("spill",), CUTOFF)

    assert removed_paths(report) == {"spill/first.txt"}
    assert (outside / "shadow").read_bytes() == SECRET
    assert report.errors == ()


# ----------------------------------------------------------------------------------------------- bounds
def test_max_entries_stops_the_sweep_early_and_says_so(results: Path) -> None:
    for index in range(50):
        plant(results / "spill" / f"old-{index}.txt")
    plant(results / "errors" / "old.txt")

    report = sweep_older_than(results, FOLDERS, CUTOFF, max_entries=20)

    assert len(report.removed) == 20
    assert report.complete is False
    assert report.errors == ("stopped after 20 entries; the rest is swept next time",)
    assert (results / "errors" / "old.txt").exists()
    assert sweep_older_than(results, FOLDERS, CUTOFF).complete is True


def test_a_tree_deeper_than_max_depth_is_swept_down_to_the_bound_without_leaking_descriptors(
    results: Path,
) -> None:
    spill = results / "spill"
    spill.mkdir()
    fd = os.open(spill, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _level in range(500):  # far deeper than PATH_MAX allows to name from the root
            os.close(os.open("old.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
            os.utime("old.txt", (OLD, OLD), dir_fd=fd)
            os.mkdir("d" * 100, dir_fd=fd)
            child = os.open("d" * 100, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    before = open_fds()

    report = sweep_older_than(results, ("spill",), CUTOFF, max_depth=10)

    assert len(report.removed) == 11  # spill itself and ten folder levels below it
    assert report.complete is False
    assert report.errors == (f"spill/{'/'.join(['d' * 100] * 10)} holds folders deeper than 10; not swept",)
    assert open_fds() == before


def test_a_flood_of_problems_is_capped_in_the_report_and_logged_as_warnings(
    results: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for index in range(150):
        (results / "spill" / f"d{index}" / "deeper").mkdir(parents=True)

    with caplog.at_level(logging.DEBUG, logger="sandbox_runtime.store.sweep"):
        report = sweep_older_than(results, ("spill",), CUTOFF, max_depth=1)

    assert len(report.errors) == 101
    assert report.errors[-1] == "... and 50 more problems (not listed)"
    assert all(error.endswith("holds folders deeper than 1; not swept") for error in report.errors[:100])
    assert [r.levelno for r in caplog.records].count(logging.WARNING) == 100
    assert "removed 0 files (0 bytes)" in caplog.records[-1].getMessage()


def test_twenty_thousand_files_are_swept_in_well_under_three_seconds(fast_results: Path) -> None:
    spill = fast_results / "spill"
    spill.mkdir(parents=True)
    for index in range(20_000):
        os.close(os.open(spill / f"run_python-c{index}.txt", os.O_WRONLY | os.O_CREAT, 0o644))

    started = time.perf_counter()
    report = sweep_older_than(fast_results, FOLDERS, time.time() + 60)  # everything counts as old
    elapsed = time.perf_counter() - started

    assert len(report.removed) == 20_000
    assert os.listdir(spill) == []
    assert elapsed < 3.0, f"sweeping 20,000 files took {elapsed:.2f} s"
