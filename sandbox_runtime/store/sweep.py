"""Retention sweep: remove old files from chosen sub-folders of a hostile results folder.

The sandbox controls every entry below the results folder, so the sweep follows the rules of
:mod:`~sandbox_runtime.store.safe_paths`: each folder is opened with ``O_NOFOLLOW`` from its parent's descriptor
(one descriptor per level, iteratively, on the root's device), entries are judged by ``lstat`` and removed with
``unlink(name, dir_fd=parent)``, so a planted link is removed itself and never followed, and a FIFO is never
opened. Entries and depth are bounded; problems are reported, never raised. Entries are removed while their
folder is read, as ``rm -r`` does; a file a file system still skips is caught by the next sweep.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISDIR

from sandbox_runtime.store.path_rules import display_name
from sandbox_runtime.store.walk import entry_kind

__all__ = ["SweepReport", "SweptFile", "sweep_older_than"]

logger = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_ERRORS = 100  # a hostile tree can cause one problem per entry; the report keeps the first ones
_RACES = (FileNotFoundError, NotADirectoryError, IsADirectoryError)  # the entry vanished or changed kind
_GONE_OR_SWAPPED = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


@dataclass(frozen=True, slots=True)
class SweptFile:
    """A removed entry: ``path`` is relative to the results folder and may hold surrogate escapes."""

    path: str
    bytes: int
    mtime: float


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What a sweep removed and kept; ``complete`` is False when max_entries or max_depth stopped it early."""

    removed: tuple[SweptFile, ...]
    removed_bytes: int
    kept_files: int
    errors: tuple[str, ...]
    complete: bool


@dataclass(slots=True)
class _Frame:
    """One open folder of the walk: its descriptor, path, whether to try ``rmdir`` once done, subfolders left."""

    fd: int
    rel: str
    removable: bool
    subdirs: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Sweep:
    cutoff: float
    max_entries: int
    root_dev: int = -1
    removed: list[SweptFile] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    kept: int = 0
    entries: int = 0
    dirs_removed: int = 0
    problems: int = 0
    complete: bool = True

    def problem(self, text: str, *, always: bool = False) -> None:
        self.problems += 1
        if always or len(self.errors) < _MAX_ERRORS:
            self.errors.append(text)
            logger.warning("retention sweep: %s", text)

    def scan(self, frame: _Frame) -> bool:
        """Remove the folder's old non-folders and collect its subfolders; False when the entry budget ran out."""
        fd, cutoff, unlink, removed = frame.fd, self.cutoff, os.unlink, self.removed  # hot loop: locals only
        try:
            with os.scandir(fd) as it:
                for item in it:
                    if self.entries >= self.max_entries:
                        return False
                    self.entries += 1
                    try:
                        st = item.stat(follow_symlinks=False)
                        if S_ISDIR(st.st_mode):
                            frame.subdirs.append(item.name)
                        elif st.st_mtime >= cutoff:
                            self.kept += 1
                        else:
                            unlink(item.name, dir_fd=fd)
                            removed.append(SweptFile(f"{frame.rel}/{item.name}", st.st_size, st.st_mtime))
                    except _RACES:  # removed, or swapped for a folder, since it was listed
                        continue
                    except OSError as exc:
                        self.kept += 1
                        self.problem(f"{display_name(frame.rel + '/' + item.name)} is left: {exc.strerror}")
        except OSError as exc:
            self.problem(f"{display_name(frame.rel)} could not be read: {exc.strerror}")
        return True

    def open_dir(self, parent: int, name: str, rel: str, *, top: bool) -> _Frame | None:
        """Open a folder without following links; None (with an error unless it vanished) when refused."""
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if top and exc.errno != errno.ENOENT:
                kind = _kind_of(parent, name)
                why = f"is a {kind}, not a folder" if kind != "dir" else f"could not be opened ({exc.strerror})"
                self.problem(f"{display_name(rel)} {why}; not swept")
            elif not top and exc.errno not in _GONE_OR_SWAPPED:
                self.problem(f"{display_name(rel)} could not be opened: {exc.strerror}")
            return None
        try:
            st = os.fstat(fd)  # the folder actually opened: its device, and its mtime before this sweep
            if st.st_dev == self.root_dev:
                return _Frame(fd, rel, removable=not top and st.st_mtime < self.cutoff)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        self.problem(f"{display_name(rel)} is on another device than the results folder; not swept")
        return None

    def rmdir(self, parent: int, frame: _Frame) -> None:
        try:
            os.rmdir(frame.rel.rsplit("/", 1)[1], dir_fd=parent)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, *_GONE_OR_SWAPPED):
                self.problem(f"{display_name(frame.rel)} could not be removed: {exc.strerror}")
            return
        self.dirs_removed += 1

    def report(self, host_root: Path) -> SweepReport:
        if self.problems > len(self.errors):
            self.errors.append(f"... and {self.problems - len(self.errors)} more problems (not listed)")
        removed_bytes = sum(item.bytes for item in self.removed)
        logger.debug(
            "retention sweep of %s: removed %d files (%d bytes) and %d folders, kept %d files, %d problems",
            host_root, len(self.removed), removed_bytes, self.dirs_removed, self.kept, self.problems,
        )  # fmt: skip
        return SweepReport(tuple(self.removed), removed_bytes, self.kept, tuple(self.errors), self.complete)


def _kind_of(parent: int, name: str) -> str:
    try:
        kind = entry_kind(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return "vanished entry"
    return "special file" if kind == "other" else kind.replace("_", " ")


def sweep_older_than(
    host_root: Path, folders: Sequence[str], cutoff: float, *, max_entries: int = 1_000_000, max_depth: int = 64
) -> SweepReport:
    """Remove every non-folder older than ``cutoff`` (lstat mtime) below ``host_root/<folder>`` for each folder.

    Folders (single names) that are missing are skipped; ones that are links, not folders, or on another device
    are reported in ``errors`` and left alone. Subfolders that were older than ``cutoff`` and end up empty are
    removed too; the named folders themselves never are. Nothing is raised for what the sandbox planted.
    """
    if max_entries < 0 or max_depth < 0:
        raise ValueError("max_entries and max_depth must be >= 0")
    for name in folders:
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"folder {name!r} is not a single name below the results folder")
    sweep = _Sweep(cutoff, max_entries)
    try:
        root = os.open(host_root, _DIR_FLAGS)
    except OSError as exc:  # a results folder that does not exist (yet or any more) has nothing to sweep
        if exc.errno != errno.ENOENT:
            sweep.problem(f"the results folder could not be opened: {exc.strerror}")
        return sweep.report(host_root)
    try:
        sweep.root_dev = os.fstat(root).st_dev
        for name in dict.fromkeys(folders):
            if not _sweep_tree(sweep, root, name, max_depth):
                sweep.complete = False
                sweep.problem(f"stopped after {max_entries} entries; the rest is swept next time", always=True)
                break
    finally:
        os.close(root)
    return sweep.report(host_root)


def _sweep_tree(sweep: _Sweep, root: int, name: str, max_depth: int) -> bool:
    """Sweep one top folder iteratively; False when the entry budget ran out."""
    top = sweep.open_dir(root, name, name, top=True)
    if top is None:
        return True
    stack = [top]
    try:
        if not sweep.scan(top):
            return False
        while stack:
            frame = stack[-1]
            if not frame.subdirs:
                os.close(frame.fd)
                stack.pop()
                if frame.removable and stack:
                    sweep.rmdir(stack[-1].fd, frame)
                continue
            child_name = frame.subdirs.pop()
            if len(stack) > max_depth:  # the subfolders of ``frame`` lie deeper than max_depth
                frame.subdirs.clear()
                sweep.complete = False
                sweep.problem(f"{display_name(frame.rel)} holds folders deeper than {max_depth}; not swept")
                continue
            child = sweep.open_dir(frame.fd, child_name, f"{frame.rel}/{child_name}", top=False)
            if child is None:
                continue
            stack.append(child)
            if not sweep.scan(child):
                return False
    finally:
        for frame in stack:
            os.close(frame.fd)
    return True
