"""Process identity on this host: a pid together with its start time (``/proc/<pid>/stat``), so that a reused pid
is never taken for the process that had it before."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pid_exists", "process_start"]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_GONE_STATES = frozenset("ZXx")  # a zombie (killed, not yet waited for) or a dead task is no longer running


def _start_ticks(pid: int) -> str | None:
    """When a running process started (clock ticks since boot, ``/proc/<pid>/stat`` field 22); None when the
    process does not exist, is a zombie, or ``/proc`` cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name (in parentheses) may hold spaces
    if len(fields) < 20 or fields[0] in _GONE_STATES:
        return None
    return fields[19]


def process_start(pid: int) -> str | None:
    """``<boot id>:<start time in clock ticks>`` of a running process (None as for :func:`_start_ticks`). Two
    processes that ever had the same pid on one host never have the same value."""
    ticks = _start_ticks(pid)
    return None if ticks is None else f"{_boot_id()}:{ticks}"


def pid_exists(pid: int) -> bool:
    """Whether a process of this pid exists (whichever it is)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return "-"
