"""The descriptor-level steps of :class:`~sandbox_runtime.store.safe_paths.ResultsRoot`: open flags that never
follow a link or block on a FIFO, and what is done by name inside a folder that is already open (look, refuse,
make a temporary file, write, say why a name is taken). Nothing here resolves a path."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterable

from sandbox_runtime.errors import PathExists, PathNotFound, PathRejected, UnsafeFileType
from sandbox_runtime.store.walk import EntryKind, entry_kind

__all__ = [
    "APPEND_FLAGS",
    "DIR_FLAGS",
    "DISK_FULL",
    "FILE_FLAGS",
    "KIND_TEXT",
    "TMP_FLAGS",
    "UNSAFE_ERRNOS",
    "exists_error",
    "lstat_at",
    "make_temp",
    "refuse_if_not_regular",
    "write_all",
]

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
UNSAFE_ERRNOS = frozenset({errno.ELOOP, errno.ENOTDIR, errno.EXDEV, errno.ENXIO, errno.EISDIR})

KIND_TEXT: dict[EntryKind, str] = {
    "file": "a regular file",
    "dir": "a folder",
    "symlink": "a symbolic link",
    "fifo": "a FIFO (named pipe)",
    "socket": "a socket",
    "char_device": "a character device",
    "block_device": "a block device",
    "other": "a special file",
}


def lstat_at(parent: int, name: str) -> os.stat_result | None:
    """The entry ``name`` of the folder ``parent`` as it is (links not followed); None when there is none."""
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError:
        return None


def refuse_if_not_regular(parent: int, name: str, shown: str) -> None:
    """Refuse FIFOs, devices and the like before ``open`` so opening one never has side effects."""
    st = lstat_at(parent, name)
    if st is None:
        raise PathNotFound(f"{shown} does not exist in the results folder")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileType(f"{shown} is {KIND_TEXT[entry_kind(st.st_mode)]}; only regular files are read")


def write_all(fd: int, data: bytes | Iterable[bytes]) -> None:
    """Write every byte of ``data`` (bytes, or chunks as they come)."""
    for chunk in (data,) if isinstance(data, bytes) else data:
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]


def make_temp(parent: int, shown: str) -> tuple[str, int]:
    """A new temporary file (0600) in the folder ``parent``, under a random name no one else holds."""
    for _attempt in range(8):
        tmp = f".sandbox-runtime-{secrets.token_hex(8)}.tmp"
        try:
            return tmp, os.open(tmp, TMP_FLAGS, 0o600, dir_fd=parent)
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno in DISK_FULL:
                raise  # the quota is reached: callers tell that apart from a refused path
            raise PathRejected(f"cannot create a temporary file next to {shown}: {exc.strerror}") from exc
    raise PathRejected(f"cannot create a temporary file next to {shown}: every random name was taken")


def exists_error(parent: int, name: str, shown: str) -> PathRejected:
    """The refusal for a name that is taken: a regular file, or something else planted there."""
    st = lstat_at(parent, name)
    kind = entry_kind(st.st_mode) if st is not None else "other"
    if kind == "file":
        return PathExists(f"{shown} already exists; choose another name")
    return UnsafeFileType(f"{shown} already exists as {KIND_TEXT[kind]}; refusing to write there")
