"""Per-conversation disk quotas.

``loop`` (needs root): each conversation's results folder is its own ext4 filesystem in a sparse image file,
loop-mounted ``nosuid,nodev,noexec``. The kernel enforces the quota: a write past it fails with ENOSPC and not
one byte lands beyond it. The image outlives the runtime process; a restart finds the mount (or remounts it).

A conversation's filesystem is mounted only while the conversation is in use: :func:`release_loop_quota`
unmounts it and detaches its loop device (refusing, and saying so, while anything still has a file open in it),
and the next use mounts it again.

``measured`` (no root needed): a plain folder whose usage (allocated blocks, so sparse files count what they
really take) is measured after every run; every run that leaves the folder over the quota is reported as
``quota_exceeded`` until space is freed. Writes *during* a run are not stopped: this mode reports, it does not
enforce, and ``doctor`` says so.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.errors import QuotaError
from sandbox_runtime.models import QuotaMode

__all__ = [
    "QuotaUsage",
    "attached_loop_images",
    "loop_devices",
    "loop_quota_unavailable_reason",
    "mount_loop_quota",
    "release_loop_quota",
    "resolve_quota_mode",
    "statvfs_usage",
    "unmount_loop_quota",
]

logger = logging.getLogger(__name__)

_COMMAND_TIMEOUT_S = 60
# noinit_itable: the kernel does not zero the unused inode tables in the background (mkfs left them to be made
# when used), so an idle volume stays as small on the host as it was made
_MOUNT_OPTIONS = "loop,nosuid,nodev,noexec,noatime,noinit_itable"
_SYS_BLOCK = Path("/sys/block")
_MAX_STACKED_MOUNTS = 8  # a mount point mounted more than once (a race of an older version) is unmounted this often
_AUTOCLEAR_WAIT_S = 0.5  # the kernel may finish the auto-clear of a loop device a moment after the unmount
_C_LOCALE = {**os.environ, "LC_ALL": "C"}  # umount's messages are matched ("target is busy")


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
    completed = _attempt(command)
    if completed.returncode != 0:
        raise QuotaError(f"{' '.join(command)} failed: {_said(completed)}")


def _attempt(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False, env=_C_LOCALE
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise QuotaError(f"{command[0]} failed: {exc}") from exc


def _said(completed: subprocess.CompletedProcess[str]) -> str:
    return completed.stderr.strip() or completed.stdout.strip() or f"exit code {completed.returncode}"


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
                    # the image is a new sparse file that reads as zeros: neither the inode tables nor the journal
                    # need zeroing, so nothing is written (and no host disk taken) until the sandbox writes
                    f"root_owner={uid}:{gid},lazy_itable_init=1,lazy_journal_init=1",
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


def unmount_loop_quota(mountpoint: Path, image: Path) -> None:
    """Unmount and detach the image's loop devices; no error when it is not mounted; a mount that is in use
    raises :class:`QuotaError`."""
    if not release_loop_quota(image, mountpoint):
        raise QuotaError(f"{mountpoint} is in use (target is busy): close what has files open in it and try again")


def release_loop_quota(image: Path, mountpoint: Path, *, detach: bool = True) -> bool:
    """Unmount the conversation's filesystem and detach every loop device backed by its image.

    False (nothing changed, and logged) when the filesystem is busy: something still has a file open in it, so
    it stays mounted. True when it is not mounted any more (a loop device that some other mount namespace still
    uses cannot be detached from here: that is logged). A mount at ``mountpoint`` that is not this image's loop
    device is never touched (raises :class:`QuotaError`). ``detach=False``: only the host's mount goes, for a
    filesystem a running sandbox still has mounted (its loop device clears itself when that ends, and a mount of
    the image meanwhile uses the same device: one filesystem, never two)."""
    for _ in range(_MAX_STACKED_MOUNTS):
        if not os.path.ismount(mountpoint):
            break
        devices = loop_devices(image)
        source = _mount_source(mountpoint)
        if source is not None and source not in devices:
            raise QuotaError(f"{mountpoint} is mounted from {source}, not from the loop device of {image}; left alone")
        completed = _attempt(["umount", str(mountpoint)])
        if completed.returncode != 0:
            said = _said(completed)
            if "busy" in said.lower():
                logger.warning("left %s mounted: it is in use (%s)", mountpoint, said)
                return False
            raise QuotaError(f"umount {mountpoint} failed: {said}")
    else:
        raise QuotaError(f"{mountpoint} is still mounted after {_MAX_STACKED_MOUNTS} unmounts")
    if detach:
        _detach(image)
    return True


def _detach(image: Path) -> bool:
    """Make sure the image has no loop device left. The kernel auto-clears the device at the unmount (on some
    kernels a moment later: a short bounded wait); one still attached then is detached with ``losetup -d``. A
    device another mount namespace still uses is only marked to clear itself when that ends: logged, and False."""
    deadline = time.monotonic() + _AUTOCLEAR_WAIT_S
    pause = 0.005
    while (devices := loop_devices(image)) and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
    for device in devices:
        completed = _attempt(["losetup", "-d", device])
        if completed.returncode != 0:
            logger.warning("could not detach %s (%s): %s", device, image, _said(completed))
    left = loop_devices(image) if devices else []
    if left:
        logger.warning("loop device %s of %s is still attached (in use elsewhere)", ", ".join(left), image)
    return not left


def loop_devices(image: Path) -> list[str]:
    """The loop devices (``/dev/loopN``) whose backing file is ``image``."""
    return attached_loop_images().get(os.path.realpath(image), [])


def attached_loop_images() -> dict[str, list[str]]:
    """Every attached loop device by the real path of its backing file, read from sysfs (no subprocess)."""
    try:
        entries = sorted(os.listdir(_SYS_BLOCK))
    except OSError:
        return {}
    found: dict[str, list[str]] = {}
    for name in entries:
        if not name.startswith("loop"):
            continue
        try:
            backing = (_SYS_BLOCK / name / "loop" / "backing_file").read_text().rstrip("\n")
        except OSError:
            continue  # not attached
        found.setdefault(backing.removesuffix(" (deleted)"), []).append(f"/dev/{name}")
    return found


def _mount_source(mountpoint: Path) -> str | None:
    """The source device of the topmost mount at ``mountpoint`` (from /proc/self/mountinfo), if readable."""
    target = os.path.realpath(mountpoint)
    source = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or "-" not in fields:
            continue
        if _unescape(fields[4]) == target:
            source = _unescape(fields[fields.index("-", 6) + 2])
    return source


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def statvfs_usage(mountpoint: Path, limit_bytes: int) -> QuotaUsage:
    """Usage of a loop-mounted results folder from the filesystem's own counters."""
    try:
        stats = os.statvfs(mountpoint)
    except OSError as exc:
        raise QuotaError(f"cannot read disk usage of {mountpoint}: {exc}") from exc
    used = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
    return QuotaUsage(mode="loop", used_bytes=used, limit_bytes=limit_bytes, free_bytes=stats.f_bavail * stats.f_frsize)
