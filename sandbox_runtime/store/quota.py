"""Per-conversation disk quotas.

``loop`` (needs root): each conversation's results folder is its own ext4 filesystem in a sparse image file,
loop-mounted ``nosuid,nodev,noexec``. The kernel enforces the quota: a write past it fails with ENOSPC and not
one byte lands beyond it. The image outlives the runtime process; a restart finds the mount (or remounts it).

``measured`` (no root needed): a plain folder whose usage (allocated blocks, so sparse files count what they
really take) is measured after every run; every run that leaves the folder over the quota is reported as
``quota_exceeded`` until space is freed. Writes *during* a run are not stopped: this mode reports, it does not
enforce, and ``doctor`` says so.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.errors import QuotaError

__all__ = [
    "QuotaMode",
    "QuotaUsage",
    "loop_quota_unavailable_reason",
    "mount_loop_quota",
    "resolve_quota_mode",
    "statvfs_usage",
    "unmount_loop_quota",
]

logger = logging.getLogger(__name__)

QuotaMode = Literal["loop", "measured"]
_COMMAND_TIMEOUT_S = 60
_MOUNT_OPTIONS = "loop,nosuid,nodev,noexec,noatime"


class QuotaUsage(BaseModel):
    """Disk use of one results folder, in bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: QuotaMode
    used_bytes: int
    limit_bytes: int
    free_bytes: int
    complete: bool = True


def loop_quota_unavailable_reason() -> str | None:
    """Why kernel-enforced quotas cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "not running as root (loop mounts need root)"
    for tool in ("mkfs.ext4", "mount", "umount", "losetup"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install -y e2fsprogs mount)"
    if not Path("/dev/loop-control").exists():
        return "/dev/loop-control is missing (no loop device support)"
    return None


def resolve_quota_mode(requested: Literal["auto", "loop", "measured"]) -> QuotaMode:
    """The mode in force: ``auto`` becomes ``loop`` where possible; ``loop`` fails where impossible."""
    if requested == "measured":
        return "measured"
    reason = loop_quota_unavailable_reason()
    if reason is None:
        return "loop"
    if requested == "loop":
        raise QuotaError(f"the policy asks for kernel-enforced quotas (quota_mode = 'loop'), but {reason}")
    logger.warning("disk quotas fall back to 'measured': %s", reason)
    return "measured"


def _run(command: list[str]) -> None:
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise QuotaError(f"{command[0]} failed: {exc}") from exc
    if completed.returncode != 0:
        raise QuotaError(f"{' '.join(command)} failed: {completed.stderr.strip() or completed.stdout.strip()}")


def mount_loop_quota(image: Path, mountpoint: Path, size_bytes: int, uid: int, gid: int) -> bool:
    """Make (once) and mount (when not mounted) the conversation's filesystem; True when newly made."""
    if os.path.ismount(mountpoint):
        return False
    made = False
    if not image.exists():
        image.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size_bytes)
        finally:
            os.close(fd)
        try:
            _run(
                [
                    "mkfs.ext4",
                    "-q",
                    "-F",
                    "-m",
                    "0",
                    "-L",
                    "sbrt-results",
                    "-E",
                    f"root_owner={uid}:{gid},lazy_itable_init=0,lazy_journal_init=0",
                    str(image),
                ]
            )
        except QuotaError:
            image.unlink(missing_ok=True)
            raise
        made = True
    mountpoint.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-t", "ext4", "-o", _MOUNT_OPTIONS, str(image), str(mountpoint)])
    lost = mountpoint / "lost+found"
    if made and lost.is_dir() and not lost.is_symlink():
        os.rmdir(lost)  # the sandbox has not seen this filesystem yet: nothing in it is hostile
    return made


def unmount_loop_quota(mountpoint: Path) -> None:
    """Unmount (the loop device is released with it); no error when it is not mounted."""
    if os.path.ismount(mountpoint):
        _run(["umount", str(mountpoint)])


def statvfs_usage(mountpoint: Path, limit_bytes: int) -> QuotaUsage:
    """Usage of a loop-mounted results folder from the filesystem's own counters."""
    try:
        stats = os.statvfs(mountpoint)
    except OSError as exc:
        raise QuotaError(f"cannot read disk usage of {mountpoint}: {exc}") from exc
    used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
    return QuotaUsage(mode="loop", used_bytes=used, limit_bytes=limit_bytes, free_bytes=stats.f_bavail * stats.f_frsize)
