"""Walking a hostile results folder: entry kinds, and the bounded measure of the space it really uses.

Nothing is followed: every folder is opened with ``O_NOFOLLOW`` from its parent's descriptor, one descriptor per
level, iteratively; entries and depth are bounded, so 10,000-deep trees and millions of files end the walk with
``complete=False`` instead of a crash.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["Entry", "EntryKind", "Usage", "entry_kind", "measure_usage"]

EntryKind = Literal["file", "dir", "symlink", "fifo", "socket", "char_device", "block_device", "other"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Usage:
    """Space used below the results folder; ``complete`` is False when a bound stopped the walk."""

    bytes_used: int
    files: int
    dirs: int
    others: int
    complete: bool


@dataclass(frozen=True, slots=True)
class Entry:
    """One folder entry, never followed: ``name`` may hold surrogate escapes (see :func:`display_name`)."""

    name: str
    kind: EntryKind
    size: int


def entry_kind(mode: int) -> EntryKind:
    checks: tuple[tuple[bool, EntryKind], ...] = (
        (stat.S_ISREG(mode), "file"),
        (stat.S_ISDIR(mode), "dir"),
        (stat.S_ISLNK(mode), "symlink"),
        (stat.S_ISFIFO(mode), "fifo"),
        (stat.S_ISSOCK(mode), "socket"),
        (stat.S_ISCHR(mode), "char_device"),
        (stat.S_ISBLK(mode), "block_device"),
    )
    return next((kind for hit, kind in checks if hit), "other")


def measure_usage(host_root: Path, *, max_entries: int = 200_000, max_depth: int = 256) -> Usage:
    """Space really used below the root (``st_blocks``), hard links once; bounded, iterative, no links."""
    if max_entries < 0 or max_depth < 0:
        raise ValueError("max_entries and max_depth must be >= 0")
    seen: set[tuple[int, int]] = set()
    counts = {"bytes": 0, "file": 0, "dir": 0, "other": 0, "entries": 0}
    stack: list[tuple[int, list[str]]] = []  # one descriptor per level, with its unvisited subfolders
    complete = True
    try:
        root = os.open(host_root, _DIR_FLAGS)
        stack.append((root, []))
        root_dev = os.fstat(root).st_dev
        exhausted = not _scan(root, stack[-1][1], seen, counts, max_entries)
        while not exhausted and stack:
            top, pending = stack[-1]
            if not pending:
                os.close(top)
                stack.pop()
                continue
            name = pending.pop()
            if len(stack) > max_depth:  # the subfolders of ``top`` lie deeper than max_depth
                pending.clear()
                complete = False
                continue
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=top)
            except OSError:  # swapped for a link, removed, or out of descriptors: not counted
                complete = False
                continue
            stack.append((child, []))
            if os.fstat(child).st_dev != root_dev:  # a mount below the root is not ours to count
                complete = False
                continue
            exhausted = not _scan(child, stack[-1][1], seen, counts, max_entries)
    finally:
        for top, _pending in stack:
            os.close(top)
    return Usage(counts["bytes"], counts["file"], counts["dir"], counts["other"], complete and not exhausted)


def _scan(fd: int, subdirs: list[str], seen: set[tuple[int, int]], counts: dict[str, int], max_entries: int) -> bool:
    """Count one folder's entries and collect its subfolders; False when the entry budget ran out."""
    with os.scandir(fd) as it:
        for item in it:
            if counts["entries"] >= max_entries:
                return False
            counts["entries"] += 1
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue
            kind = entry_kind(st.st_mode)
            counts[kind if kind in ("file", "dir") else "other"] += 1
            if kind == "dir":
                subdirs.append(item.name)
            if st.st_nlink > 1 and kind != "dir":
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            counts["bytes"] += st.st_blocks * 512
    return True
