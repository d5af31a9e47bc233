"""Per-conversation folders on the host and their disk quota.

::

    STATE_DIR/
      state.sqlite3
      volumes/<conversation>.ext4          the results filesystem (quota mode "loop")
      canary/<lease>/                      one process's self-check folder, while it checks
      pool/<lease>/                        one process's warm pool slots (sandbox_runtime.conversations.pool_slots)
      conversations/<conversation>/
        results/    mounted read-write into the sandbox; spill/ errors/ args/ exports/ scripts/
        outputs/    attachments; never mounted, outside retention, within their own quota (bytes of distinct
                    content, attachments): .blobs/<sha256> once per content, att-<id>/<filename> linked to it
                    (see sandbox_runtime.store.outputs)

In quota mode "loop" the results filesystem is mounted only while its conversation is in use: ``prepare``
mounts it (again) when needed, ``release`` unmounts it and detaches its loop device.

The results folder is hostile once a sandbox has seen it; the sub-folders are made only while it is new
(or through directory descriptors), never by following a path the sandbox could have changed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.models import QuotaMode
from sandbox_runtime.policy import Policy
from sandbox_runtime.store.outputs import AttachmentStore, OutputsLimits, OutputsUsage
from sandbox_runtime.store.quota import (
    QuotaUsage,
    mount_loop_quota,
    release_loop_quota,
    resolve_quota_mode,
    statvfs_usage,
    unmount_loop_quota,
)
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tenancy import validate_conversation_key

__all__ = [
    "RESULT_SUBFOLDERS",
    "ConversationFolders",
    "ConversationStore",
]

logger = logging.getLogger(__name__)

RESULT_SUBFOLDERS = ("spill", "errors", "args", "exports", "scripts")


class ConversationFolders(BaseModel):
    """Where one conversation's files are on the host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    root: Path
    results: Path
    outputs: Path
    volume: Path
    quota_mode: QuotaMode
    quota_bytes: int


class ConversationStore:
    """Creates, mounts, measures and deletes conversation folders under one state directory."""

    def __init__(self, state_dir: Path, policy: Policy) -> None:
        self.state_dir = state_dir
        self.policy = policy
        self.quota_mode: QuotaMode = resolve_quota_mode(policy.store.quota_mode)

    def folders(self, conversation_id: str, quota_mode: QuotaMode | None = None) -> ConversationFolders:
        validate_conversation_key(conversation_id)
        root = self.state_dir / "conversations" / conversation_id
        return ConversationFolders(
            conversation_id=conversation_id,
            root=root,
            results=root / "results",
            outputs=root / "outputs",
            volume=self.state_dir / "volumes" / f"{conversation_id}.ext4",
            quota_mode=quota_mode or self.quota_mode,
            quota_bytes=self.policy.store.quota_bytes,
        )

    def canary_folders(self, quota_bytes: int, lease_id: str) -> ConversationFolders:
        """Folders for one process's self-check canary (``canary/<lease>/``), apart from every conversation's (no
        id can name them) and from every other process's."""
        root = self.state_dir / "canary" / lease_id
        return ConversationFolders(
            conversation_id="canary",
            root=root,
            results=root / "results",
            outputs=root / "outputs",
            volume=root / "canary.ext4",
            quota_mode=self.quota_mode,
            quota_bytes=quota_bytes,
        )

    def prepare(self, folders: ConversationFolders) -> None:
        """Make the folders (once) and mount the quota filesystem (when not mounted); idempotent."""
        folders.outputs.mkdir(parents=True, exist_ok=True, mode=0o755)
        uid, gid = self.policy.sandbox.uid, self.policy.sandbox.gid
        if folders.quota_mode == "loop":
            made = mount_loop_quota(folders.volume, folders.results, folders.quota_bytes, uid, gid)
        else:
            made = not folders.results.exists()
            folders.results.mkdir(parents=True, exist_ok=True, mode=0o755)
            if made:
                self._give_to_sandbox_user(folders.results, uid, gid)
        if made:
            self._make_subfolders(folders.results, uid, gid)

    def release(self, folders: ConversationFolders, *, detach: bool = True) -> bool:
        """Unmount the quota filesystem and detach its loop device; the folders stay and the next ``prepare``
        mounts them again. False (still mounted, logged) when the filesystem is busy; True in measured mode.
        The caller makes sure no sandbox uses the folder, or says ``detach=False`` (a sandbox keeps its own mount,
        and the device stays for it)."""
        if folders.quota_mode != "loop":
            return True
        released = release_loop_quota(folders.volume, folders.results, detach=detach)
        if released:
            logger.info("released the quota volume of %s", folders.conversation_id)
        return released

    @staticmethod
    def _give_to_sandbox_user(path: Path, uid: int, gid: int) -> None:
        try:
            os.chown(path, uid, gid)  # a folder we just made; the sandbox has never seen it
        except PermissionError:
            os.chmod(path, 0o777)  # noqa: S103  (not root: the sandbox uid must still be able to write)
            logger.warning("not root: %s is made world-writable so the sandbox user can write to it", path)

    @staticmethod
    def _make_subfolders(results: Path, uid: int, gid: int) -> None:
        root_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for name in RESULT_SUBFOLDERS:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=root_fd)
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
                try:
                    with contextlib.suppress(PermissionError):
                        os.fchown(fd, uid, gid)
                finally:
                    os.close(fd)
        finally:
            os.close(root_fd)

    def results_root(self, folders: ConversationFolders) -> ResultsRoot:
        return ResultsRoot(
            folders.results,
            self.policy.sandbox.results_mount_path,
            owner=(self.policy.sandbox.uid, self.policy.sandbox.gid),
        )

    def usage(self, folders: ConversationFolders) -> QuotaUsage:
        """Bytes used against the quota: the filesystem's counters, or a bounded walk in measured mode."""
        if folders.quota_mode == "loop":
            return statvfs_usage(folders.results, folders.quota_bytes)
        measured = self.results_root(folders).measure_usage()
        return QuotaUsage(
            mode="measured",
            used_bytes=measured.bytes_used,
            limit_bytes=folders.quota_bytes,
            free_bytes=max(folders.quota_bytes - measured.bytes_used, 0),
            complete=measured.complete,
        )

    def outputs_limits(self) -> OutputsLimits:
        """The attachments quota of every conversation, from the policy."""
        return OutputsLimits.from_policy(self.policy.tools)

    def attachments(self, folders: ConversationFolders) -> AttachmentStore:
        """The conversation's ``outputs/`` under the policy's attachments quota."""
        return AttachmentStore(folders.outputs, self.outputs_limits())

    def held_bytes(self, folders: ConversationFolders) -> int:
        """Bytes a conversation's results folder holds on the host disk, without mounting anything: the blocks its
        quota volume has allocated (loop), else a bounded walk of the folder."""
        if folders.quota_mode == "loop":
            try:
                return os.stat(folders.volume).st_blocks * 512
            except FileNotFoundError:
                return 0
        if not folders.results.is_dir():
            return 0
        return self.results_root(folders).measure_usage().bytes_used

    def outputs_usage(self, folders: ConversationFolders) -> OutputsUsage:
        """Attachments and bytes of distinct content in ``outputs/``, with their limits (needs no mount)."""
        return self.attachments(folders).usage()

    def delete(self, folders: ConversationFolders) -> None:
        """Unmount and delete everything of one conversation (its sandbox must be gone first)."""
        if folders.quota_mode == "loop":
            unmount_loop_quota(folders.results, folders.volume)
            folders.volume.unlink(missing_ok=True)
        if folders.root.exists():
            shutil.rmtree(folders.root)  # fd-based on Linux: never follows a link the sandbox planted
