"""The one place that turns a model-supplied path into an open file in a hostile results folder.

The sandbox controls everything below the host's ``results/`` folder (bind-mounted at ``/mnt/results``) and
may plant symlinks, FIFOs, hard links, devices, sparse or growing files, very deep trees and odd names there.
The host runs as root, so it must never follow a link the sandbox planted. Every operation here therefore:

* validates the path lexically first (:meth:`ResultsRoot.parse`), never resolving anything on disk;
* walks from a descriptor of the trusted root, one component at a time, with ``O_NOFOLLOW`` (``openat``),
  checking that each folder is on the root's device;
* checks the *opened descriptor* with ``fstat`` (regular file, same device, one link, size under the cap)
  and reads at most ``cap + 1`` bytes;
* creates files only with ``O_CREAT|O_EXCL|O_NOFOLLOW`` under a random temporary name and publishes them
  atomically with ``link`` (never overwrites) or ``rename`` (replaces a planted link itself, never writes
  through it), then checks that the published name is the inode it wrote;
* bounds every walk (entries and depth), holds at most one descriptor per level and never recurses.

Names read back from disk may hold invalid UTF-8 (kept as surrogate escapes), newlines or bidi marks; pass
them through :func:`display_name` before showing them to a person or a model.
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from sandbox_runtime.errors import (
    FileTooLarge,
    PathNotFound,
    PathOutsideResults,
    PathRejected,
    UnsafeFileType,
)
from sandbox_runtime.store.capped import read_capped
from sandbox_runtime.store.dir_fd import (
    APPEND_FLAGS,
    DIR_FLAGS,
    DISK_FULL,
    FILE_FLAGS,
    KIND_TEXT,
    UNSAFE_ERRNOS,
    exists_error,
    lstat_at,
    make_temp,
    refuse_if_not_regular,
    write_all,
)
from sandbox_runtime.store.path_rules import (
    DEFAULT_MOUNT_PATH,
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    display_name,
    parse_model_path,
)
from sandbox_runtime.store.walk import Entry, EntryKind, Usage, entry_kind, measure_usage

__all__ = [
    "DEFAULT_MOUNT_PATH",
    "MAX_NAME_BYTES",
    "MAX_PATH_BYTES",
    "PRIVATE_FILE_MODE",
    "Entry",
    "EntryKind",
    "PathArg",
    "ResultsRoot",
    "Usage",
    "display_name",
    "read_capped",
]


PathArg = str | tuple[str, ...]

# files only the sandbox user reads: as root the host hands each one to that user (fchown); otherwise they stay
# the host user's and must stay readable by the sandbox
PRIVATE_FILE_MODE = 0o600 if os.geteuid() == 0 else 0o644
_LIBC = ctypes.CDLL(None, use_errno=True)  # syncfs(2): os has no wrapper before Python 3.14


class ResultsRoot:
    """A conversation's results folder: the folder itself is trusted, everything below it is hostile."""

    def __init__(
        self,
        host_root: str | os.PathLike[str],
        mount_path: str = DEFAULT_MOUNT_PATH,
        owner: tuple[int, int] | None = None,
    ) -> None:
        """Use ``host_root`` (created by the host) as the folder seen at ``mount_path`` in the sandbox.

        ``owner`` (uid, gid): files and folders the host creates are handed to the sandbox user (``fchown``
        on the new descriptor, never by path), so the code can edit and delete what the host wrote for it.
        """
        self._owner = owner
        if not mount_path.startswith("/") or mount_path == "/" or os.path.normpath(mount_path) != mount_path:
            raise ValueError(f"mount_path must be a normalised absolute path other than '/', not {mount_path!r}")
        self._host_root = Path(os.path.abspath(os.fspath(host_root)))
        self._mount = mount_path

    @property
    def host_root(self) -> Path:
        """The host path of the results folder."""
        return self._host_root

    @property
    def mount_path(self) -> str:
        """Where the results folder appears inside the sandbox."""
        return self._mount

    # ----------------------------------------------------------------------------------------- paths
    def parse(self, raw: str, *, allow_root: bool = False) -> tuple[str, ...]:
        """Validate a model-supplied path; see :func:`~sandbox_runtime.store.path_rules.parse_model_path`."""
        return parse_model_path(raw, self._mount, allow_root=allow_root)

    def sandbox_path(self, components: tuple[str, ...]) -> str:
        """The absolute path of ``components`` inside the sandbox, e.g. ``/mnt/results/spill/a.json``."""
        return "/".join((self._mount, *components))

    def host_path(self, components: tuple[str, ...]) -> Path:
        """The host path of ``components``; for display and logging only, never for opening."""
        return self._host_root.joinpath(*components)

    def _components(self, path: PathArg, *, allow_root: bool) -> tuple[str, ...]:
        if isinstance(path, tuple):
            if not all(isinstance(part, str) for part in path):
                raise PathOutsideResults("path components must be strings")
            parsed = self.parse("/".join(path) or ".", allow_root=allow_root)
            if parsed != path:
                raise PathOutsideResults(f"path components {path!r} are not normalised single names")
            return parsed
        return self.parse(path, allow_root=allow_root)

    def _shown(self, components: tuple[str, ...]) -> str:
        return display_name(self.sandbox_path(components))

    # ------------------------------------------------------------------------------------ folder walk
    @contextmanager
    def _dir(self, components: tuple[str, ...], *, create: bool = False) -> Iterator[tuple[int, int]]:
        """Yield ``(fd, root_dev)`` for the folder ``components``, walked without following any link."""
        fd = os.open(self._host_root, DIR_FLAGS)
        try:
            root_dev = os.fstat(fd).st_dev
            for depth, name in enumerate(components):
                child = self._open_child_dir(fd, name, components[: depth + 1], root_dev, create=create)
                parent, fd = fd, child
                os.close(parent)
            yield fd, root_dev
        finally:
            os.close(fd)

    def _open_child_dir(self, parent: int, name: str, here: tuple[str, ...], root_dev: int, *, create: bool) -> int:
        created = False
        if create:
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
                created = True
            except FileExistsError:
                pass
            except OSError as exc:
                if exc.errno in DISK_FULL:
                    raise
                raise PathRejected(f"cannot create folder {self._shown(here)}: {exc.strerror}") from exc
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise self._open_error(exc, parent, name, here, wanted="a folder") from exc
        try:
            if os.fstat(fd).st_dev != root_dev:
                raise UnsafeFileType(f"{self._shown(here)} is on another device than the results folder")
            if created:
                os.fchmod(fd, 0o755)
                self._give(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_error(
        self, exc: OSError, parent: int, name: str, here: tuple[str, ...], *, wanted: str
    ) -> PathRejected | PathNotFound:
        shown = self._shown(here)
        if exc.errno == errno.ENOENT:
            return PathNotFound(f"{shown} does not exist in the results folder")
        st = lstat_at(parent, name)
        if st is not None and exc.errno in UNSAFE_ERRNOS:
            return UnsafeFileType(f"{shown} is {KIND_TEXT[entry_kind(st.st_mode)]}, not {wanted}; refused")
        if exc.errno in UNSAFE_ERRNOS:
            return UnsafeFileType(f"{shown} is not {wanted} ({exc.strerror}); refused")
        return PathRejected(f"{shown} cannot be opened or created: {exc.strerror}")

    # ------------------------------------------------------------------------------------------ reading
    def _open_regular_fd(self, components: tuple[str, ...], max_bytes: int) -> tuple[int, os.stat_result]:
        try:
            return self._open_checked(components, max_bytes)
        except PathNotFound as exc:
            if exc.path is None:
                exc.path = self.sandbox_path(components)  # the file asked for, whichever part of it is missing
            raise

    def _open_checked(self, components: tuple[str, ...], max_bytes: int) -> tuple[int, os.stat_result]:
        shown = self._shown(components)
        name = components[-1]
        with self._dir(components[:-1]) as (parent, root_dev):
            refuse_if_not_regular(parent, name, shown)
            try:
                fd = os.open(name, FILE_FLAGS, dir_fd=parent)
            except OSError as exc:
                raise self._open_error(exc, parent, name, components, wanted="a regular file") from exc
        try:
            st = os.fstat(fd)
            kind = entry_kind(st.st_mode)
            if kind != "file":
                raise UnsafeFileType(f"{shown} is {KIND_TEXT[kind]}; only regular files are read")
            if st.st_dev != root_dev:
                raise UnsafeFileType(f"{shown} is on another device than the results folder; refused")
            if st.st_nlink == 0:
                raise PathNotFound(f"{shown} was removed while it was opened; try again")
            if st.st_nlink != 1:
                raise UnsafeFileType(f"{shown} has {st.st_nlink} hard links (it may be a file from outside)")
            if st.st_size > max_bytes:
                raise FileTooLarge(f"{shown} is {st.st_size} bytes, more than the cap of {max_bytes} bytes")
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    @contextmanager
    def open_regular(self, path: PathArg, *, max_bytes: int) -> Iterator[tuple[io.FileIO, os.stat_result]]:
        """Open a regular file below the root without following links; yield ``(file, fstat result)``.

        The descriptor is checked to be a regular file on the root's device with one link and at most
        ``max_bytes`` bytes. Read it with :func:`read_capped` so growth after the check is caught too.
        """
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        fd, st = self._open_regular_fd(self._components(path, allow_root=False), max_bytes)
        try:
            file = io.FileIO(fd, "r", closefd=True)
        except BaseException:
            os.close(fd)
            raise
        with file:
            yield file, st

    def read_bytes(self, path: PathArg, *, max_bytes: int) -> bytes:
        """The content of a regular file, at most ``max_bytes`` bytes (:class:`FileTooLarge` otherwise)."""
        components = self._components(path, allow_root=False)
        with self.open_regular(components, max_bytes=max_bytes) as (file, _st):
            return read_capped(file, max_bytes, label=self._shown(components))

    def read_text(self, path: PathArg, *, max_bytes: int, encoding: str = "utf-8") -> str:
        """:meth:`read_bytes` decoded strictly; undecodable content raises :class:`PathRejected`."""
        components = self._components(path, allow_root=False)
        data = self.read_bytes(components, max_bytes=max_bytes)
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise PathRejected(
                f"{self._shown(components)} is not {encoding} text (invalid byte at offset {exc.start})"
            ) from exc

    # ------------------------------------------------------------------------------------------ writing
    def ensure_dir(self, path: PathArg) -> None:
        """Create the folder ``path`` and its parents (mode 0755) without following any planted link."""
        with self._dir(self._components(path, allow_root=True), create=True):
            pass

    def create_file(
        self,
        path: PathArg,
        data: bytes | Iterable[bytes],
        *,
        make_parents: bool = True,
        mode: int = 0o644,
        durable: bool = True,
    ) -> str:
        """Publish a new file atomically; fail if anything (even a dangling link) holds the name.

        ``data`` may be an iterable of chunks, written as they come (memory does not grow with the file).
        ``durable=False`` skips the file's and the folder's fsync: the caller makes a batch durable at once
        with :meth:`sync` (a crash may then lose the batch, never leave a partly written file visible).
        Returns the sandbox path. ``mode`` may hold permission bits only (no setuid/setgid/sticky).
        """
        return self._publish(path, data, make_parents=make_parents, mode=mode, replace=False, durable=durable)

    def replace_file(self, path: PathArg, data: bytes, *, make_parents: bool = True, mode: int = 0o644) -> str:
        """Publish a file atomically, replacing any non-folder at the name (a link itself, not its target)."""
        return self._publish(path, data, make_parents=make_parents, mode=mode, replace=True, durable=True)

    def _publish(
        self,
        path: PathArg,
        data: bytes | Iterable[bytes],
        *,
        make_parents: bool,
        mode: int,
        replace: bool,
        durable: bool,
    ) -> str:
        if mode & ~0o777:
            raise ValueError(f"mode {mode:#o} holds special bits; only permission bits (0o777) are allowed")
        components = self._components(path, allow_root=False)
        shown = self._shown(components)
        name = components[-1]
        with self._dir(components[:-1], create=make_parents) as (parent, _dev):
            tmp, fd = make_temp(parent, shown)
            tmp_gone = False  # a rename consumes the temporary name; a link leaves it to remove
            try:
                try:
                    write_all(fd, data)
                    os.fchmod(fd, mode)
                    self._give(fd)
                    if durable:
                        os.fsync(fd)
                    written = os.fstat(fd)
                finally:
                    os.close(fd)
                try:
                    if replace:
                        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
                    else:
                        os.link(tmp, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
                    tmp_gone = replace
                except FileExistsError as exc:
                    raise exists_error(parent, name, shown) from exc
                except OSError as exc:
                    raise self._open_error(exc, parent, name, components, wanted="a file name") from exc
            finally:
                if not tmp_gone:
                    with suppress(FileNotFoundError):
                        os.unlink(tmp, dir_fd=parent)
            now = lstat_at(parent, name)
            if now is None or (now.st_dev, now.st_ino) != (written.st_dev, written.st_ino):
                raise PathRejected(f"{shown} was swapped by the sandbox while it was published")
            if durable:
                os.fsync(parent)
        return self.sandbox_path(components)

    def append_bytes(
        self, path: PathArg, data: bytes, *, max_bytes: int, durable: bool = True, mode: int = 0o644
    ) -> str:
        """Append to a regular file (made 0644 when missing) that stays at most ``max_bytes`` long.

        The name is opened without following links and the descriptor checked like a read (regular, one
        link, the root's device), so a planted link, FIFO or hard link is refused, never written through.
        """
        components = self._components(path, allow_root=False)
        shown = self._shown(components)
        with self._dir(components[:-1], create=True) as (parent, root_dev):
            if lstat_at(parent, components[-1]) is not None:
                refuse_if_not_regular(parent, components[-1], shown)
            try:
                fd = os.open(components[-1], APPEND_FLAGS, mode & 0o777, dir_fd=parent)
            except OSError as exc:
                if exc.errno in DISK_FULL:
                    raise
                raise self._open_error(exc, parent, components[-1], components, wanted="a regular file") from exc
            try:
                st = os.fstat(fd)
                if entry_kind(st.st_mode) != "file" or st.st_dev != root_dev or st.st_nlink != 1:
                    raise UnsafeFileType(f"{shown} is not a plain regular file of the results folder; refused")
                if st.st_size + len(data) > max_bytes:
                    raise FileTooLarge(f"{shown} would grow past its cap of {max_bytes} bytes")
                if st.st_size == 0:
                    self._give(fd)
                write_all(fd, data)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
        return self.sandbox_path(components)

    def sync(self) -> None:
        """Make every earlier non-durable write below the root durable: one ``syncfs`` of its filesystem."""
        fd = os.open(self._host_root, DIR_FLAGS)
        try:
            if _LIBC.syncfs(fd) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"syncfs of the results folder failed: {os.strerror(code)}")
        finally:
            os.close(fd)

    def _give(self, fd: int) -> None:
        if self._owner is not None:
            with suppress(PermissionError):  # not root: the files stay the host user's
                os.fchown(fd, *self._owner)

    # ------------------------------------------------------------------------------------ walking
    def list_dir(self, path: PathArg, *, max_entries: int) -> list[Entry]:
        """At most ``max_entries`` entries of a folder, sorted by name; nothing is followed or opened."""
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        entries: list[Entry] = []
        with self._dir(self._components(path, allow_root=True)) as (fd, _dev), os.scandir(fd) as it:
            for item in it:
                if len(entries) >= max_entries:
                    break
                try:
                    st = item.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed while listed
                entries.append(Entry(item.name, entry_kind(st.st_mode), st.st_size))
        return sorted(entries, key=lambda entry: entry.name)

    def measure_usage(self, *, max_entries: int = 200_000, max_depth: int = 256) -> Usage:
        """Space really used below the root; see :func:`~sandbox_runtime.store.walk.measure_usage`."""
        return measure_usage(self._host_root, max_entries=max_entries, max_depth=max_depth)
