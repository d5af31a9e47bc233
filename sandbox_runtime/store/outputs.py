"""A conversation's attachments (``outputs/``): each distinct content stored once, within a quota of its own.

::

    outputs/
      .lock                     held (flock) by every attach of the conversation, one at a time
      .blobs/<sha256>           each distinct content once, named by its digest (0644)
      .staging/                 copies and attachment folders being built; emptied by the next attach
      att-<16 hex>/<filename>   one folder per attachment; the file is a hard link to its blob

The attachment's ``host_path`` is ``outputs/<attachment id>/<filename>``, as before content addressing: the ids,
cards and resource URIs are unchanged, and a reader opens the same kind of file (a regular file, never a
symbolic link) — only its link count tells that the content is shared.

**What the quota counts** (``tools.outputs_max_bytes`` and ``tools.outputs_files_max``):

* *bytes*: the sizes of the distinct contents stored — each content once, however many attachments point at it
  (counted by inode, so a folder made before content addressing counts its own copy). Folders, names and
  file-system block rounding are not counted. Attaching a content already stored adds no bytes.
* *files*: the attachments, one per successful ``attach_file`` (each has its own id and card, also when its
  content is shared with another).

An attach is refused with :class:`~sandbox_runtime.errors.OutputsFull` when the conversation already has
``outputs_files_max`` attachments, or when the new content would bring the bytes past ``outputs_max_bytes``.

**Crash and concurrency safety.** An attach holds the conversation's lock from its first check to its last
step, so two attaches of one conversation (threads or processes) never both pass the quota, and the second of
two with the same content finds the first one's blob. Each step publishes atomically, in an order that leaves
nothing visible half made:

1. the content is copied (streamed, hashed as it goes, at most one chunk in memory) to ``.staging/``; it is
   written to disk only while it fits the free bytes — past them it is only hashed, so that a content already
   stored can still be attached and disk use never passes the quota, not even for a moment;
2. a new content is synced and linked as ``.blobs/<sha256>`` (a stored one is reused; the copy is dropped);
3. the attachment folder is built in ``.staging/`` (a link to the blob), synced, and renamed into place.

A crash leaves at most a staged copy or folder, or a blob no attachment links to (link count 1); the next
attach removes them before it measures. The caller records the attachment only once it is in place, so no
record names an attachment that is not there (:meth:`AttachmentStore.discard` removes one the caller could not
record).

``outputs/`` is written by the host only (the sandbox never sees it); the source is read from a descriptor the
caller opened through :class:`~sandbox_runtime.store.safe_paths.ResultsRoot`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import logging
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from sandbox_runtime.errors import OutputsFull
from sandbox_runtime.policy import ToolsPolicy
from sandbox_runtime.store.capped import CappedReader

__all__ = [
    "AttachmentStore",
    "OutputsLimits",
    "OutputsUsage",
    "StoredAttachment",
]

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 20
_LOCK_NAME = ".lock"
_BLOBS = ".blobs"
_STAGING = ".staging"
_ATTACHMENT_ID = re.compile(r"att-[0-9a-f]{16}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class OutputsLimits(BaseModel):
    """The attachments quota of one conversation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_bytes: PositiveInt = Field(description="Bytes the distinct contents may take (tools.outputs_max_bytes).")
    files_max: PositiveInt = Field(description="Most attachments one conversation keeps (tools.outputs_files_max).")

    @classmethod
    def from_policy(cls, tools: ToolsPolicy) -> OutputsLimits:
        return cls(max_bytes=tools.outputs_max_bytes, files_max=tools.outputs_files_max)


class OutputsUsage(BaseModel):
    """What a conversation's attachments take, beside their limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attachments: int = Field(description="Attachments (folders) on disk; each counts against files_max.")
    contents: int = Field(description="Distinct contents stored (fewer than attachments when some share one).")
    bytes: int = Field(description="Sizes of the distinct contents; counts against max_bytes.")
    max_bytes: int
    files_max: int


class StoredAttachment(BaseModel):
    """An attachment in place: its id, its file, and what the file holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attachment_id: str
    host_path: Path
    bytes: int
    sha256: str
    shared: bool = Field(description="True when the content was stored already (no bytes were added).")


class AttachmentStore:
    """The ``outputs/`` folder of one conversation."""

    def __init__(self, outputs: Path, limits: OutputsLimits) -> None:
        self.outputs = outputs
        self.limits = limits
        self._blobs = outputs / _BLOBS
        self._staging = outputs / _STAGING

    # ------------------------------------------------------------------------------------------ usage
    def usage(self) -> OutputsUsage:
        """The attachments and distinct bytes on disk now (a missing folder: nothing)."""
        attachments = 0
        sizes: dict[tuple[int, int], int] = {}
        for entry in _entries(self.outputs):
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            attachments += 1
            for inner in _entries(Path(entry.path)):
                _count_file(inner, sizes)
        for entry in _entries(self._blobs):
            _count_file(entry, sizes)
        return OutputsUsage(
            attachments=attachments,
            contents=len(sizes),
            bytes=sum(sizes.values()),
            max_bytes=self.limits.max_bytes,
            files_max=self.limits.files_max,
        )

    # ------------------------------------------------------------------------------------------ adding
    def add(self, source: io.FileIO, filename: str, *, max_bytes: int, shown: str) -> StoredAttachment:
        """Store the content read from ``source`` (at most ``max_bytes``) as a new attachment named ``filename``.

        Raises :class:`OutputsFull` (nothing stored) when the quota would be passed, and
        :class:`~sandbox_runtime.errors.FileTooLarge` when the source grows past ``max_bytes`` while it is read.
        ``shown`` names the source in messages.
        """
        if not filename or filename.startswith(".") or "/" in filename or "\0" in filename:
            raise ValueError(f"not a plain file name for an attachment: {filename!r}")
        with self._locked():
            try:
                self._collect_garbage()
                usage = self.usage()
                if usage.attachments >= self.limits.files_max:
                    raise OutputsFull(_files_full(usage))
                size, digest, staged = self._stage_copy(source, max_bytes, shown, self.limits.max_bytes - usage.bytes)
                shared = self._blob_ready(digest, size)
                if shared and staged is not None:
                    os.unlink(staged)  # the content is stored already: the copy is not needed
                elif not shared:
                    if staged is None:
                        raise OutputsFull(_bytes_full(usage, size, shown))
                    self._publish_blob(staged, digest)
                attachment_id, host_path = self._publish_attachment(digest, filename)
            except BaseException:
                self._collect_garbage()
                raise
        logger.info("stored %s as %s (%d bytes, %s)", shown, host_path, size, "shared" if shared else "new")
        return StoredAttachment(
            attachment_id=attachment_id, host_path=host_path, bytes=size, sha256=digest, shared=shared
        )

    def discard(self, attachment_id: str) -> None:
        """Remove one attachment (e.g. one its caller could not record) and its content when no other shares it."""
        if not _ATTACHMENT_ID.fullmatch(attachment_id):
            raise ValueError(f"not an attachment id: {attachment_id!r}")
        with self._locked():
            folder = self.outputs / attachment_id
            if folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder)
                _fsync_dir(self.outputs)
            self._collect_garbage()

    # ------------------------------------------------------------------------------------------ steps
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        for folder in (self.outputs, self._blobs, self._staging):
            folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(self.outputs / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies
            yield
        finally:
            os.close(fd)

    def _collect_garbage(self) -> None:
        """Remove what an interrupted attach left: staged copies and folders, and blobs no attachment links to."""
        for entry in _entries(self._staging):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        for entry in _entries(self._blobs):
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(entry.path, ignore_errors=True)  # never made here: not a content
            elif not stat.S_ISREG(st.st_mode) or st.st_nlink <= 1 or not _DIGEST.fullmatch(entry.name):
                logger.info("removing %s: no attachment links to it", entry.path)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)

    def _stage_copy(
        self, source: io.FileIO, max_bytes: int, shown: str, free_bytes: int
    ) -> tuple[int, str, Path | None]:
        """Read the whole source, hashing it; write it to a staged file while it fits ``free_bytes``.

        Returns (size, sha256, the staged file or None when the content did not fit)."""
        staged = self._staging / f"{secrets.token_hex(8)}.partial"
        out = os.open(staged, _NEW_FILE_FLAGS, 0o600)
        writing = True
        digest = hashlib.sha256()
        size = 0
        reader = CappedReader(source, max_bytes, shown)
        view = memoryview(bytearray(_CHUNK_BYTES))
        try:
            while got := reader.readinto(view):
                chunk = view[:got]
                digest.update(chunk)
                size += got
                if writing and size > free_bytes:
                    writing = False  # past the free bytes: only a content already stored can still be attached
                    os.ftruncate(out, 0)
                    os.unlink(staged)
                if writing:
                    _write_all(out, chunk)
            if writing:
                os.fchmod(out, 0o644)
        finally:
            os.close(out)
        return size, digest.hexdigest(), staged if writing else None

    def _blob_ready(self, digest: str, size: int) -> bool:
        """True when the content is stored already (checked to be a regular file of the right size)."""
        try:
            st = os.stat(self._blobs / digest, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            raise OSError(errno.EIO, f"{self._blobs / digest} is not the content its name says; remove it")
        return True

    def _publish_blob(self, staged: Path, digest: str) -> None:
        fd = os.open(staged, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(staged, self._blobs / digest, follow_symlinks=False)  # never replaces: the lock is held
        os.unlink(staged)
        _fsync_dir(self._blobs)

    def _publish_attachment(self, digest: str, filename: str) -> tuple[str, Path]:
        for _attempt in range(8):
            attachment_id = f"att-{secrets.token_hex(8)}"
            if not os.path.lexists(self.outputs / attachment_id):
                break
        else:
            raise OSError(errno.EEXIST, "every random attachment id was taken")
        building = self._staging / attachment_id
        building.mkdir(mode=0o755)
        os.chmod(building, 0o755)  # noqa: S103  (whatever the umask: the host serves the file from here)
        os.link(self._blobs / digest, building / filename, follow_symlinks=False)
        _fsync_dir(building)
        os.rename(building, self.outputs / attachment_id)  # the folder appears whole, or not at all
        _fsync_dir(self.outputs)
        return attachment_id, self.outputs / attachment_id / filename


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _count_file(entry: os.DirEntry[str], sizes: dict[tuple[int, int], int]) -> None:
    try:
        st = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        sizes[(st.st_dev, st.st_ino)] = st.st_size


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, _DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _attachments(count: int) -> str:
    return f"{count:,} attachment" + ("" if count == 1 else "s")


def _files_full(usage: OutputsUsage) -> str:
    return (
        f"attach_file: this conversation already has {_attachments(usage.attachments)}, the most it may keep "
        f"(tools.outputs_files_max = {usage.files_max:,}); nothing was attached. Bundle the files into one archive "
        "(e.g. a zip under exports/ in the results folder) and attach that, or tell the user the limit is reached."
    )


def _bytes_full(usage: OutputsUsage, size: int, shown: str) -> str:
    return (
        f"attach_file: {shown} ({size:,} bytes) would bring this conversation's attachments to "
        f"{usage.bytes + size:,} bytes, past their quota of {usage.max_bytes:,} bytes (tools.outputs_max_bytes; "
        f"{usage.bytes:,} bytes are used by {_attachments(usage.attachments)}); nothing was attached. Attach a "
        "smaller file (compress it, or export fewer rows or columns), or tell the user the quota is reached."
    )
