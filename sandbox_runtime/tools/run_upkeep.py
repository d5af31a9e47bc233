"""What every run in a conversation's sandbox needs around it, a script's (``run_python``) or a command's
(``Conversation.exec``): the conversation's lock taken so that a cancel is heard while waiting, progress reported
against the run's own time limit, the sandbox tended after the run (forgotten, restarted or touched), and a
breach of the results folder's quota told apart from a full ``/tmp``."""

from __future__ import annotations

import logging
import re
from typing import Protocol

from sandbox_runtime.control import CallControl
from sandbox_runtime.conversations.handle import SandboxHandle
from sandbox_runtime.sandbox.manager_models import Sandbox
from sandbox_runtime.sandbox.runs import ExecResult, RunnerVerdict
from sandbox_runtime.store.quota import QuotaUsage
from sandbox_runtime.tools.run_result import decode

__all__ = ["acquire_run_lock", "exec_control", "quota_breach", "tend_sandbox"]

logger = logging.getLogger(__name__)

_NO_SPACE = re.compile(r"\[Errno 28\]|No space left on device")
# ext4 refuses a large write while its delayed allocation still holds reservations, so the folder reads
# "nearly full" rather than full when the script fails: within 5 % of the quota (at least 4 MiB)
_NEARLY_FULL_BYTES = 4 * 1024 * 1024
_LOCK_POLL_S = 0.2  # a cancelled call that waits for its conversation's lock gives up within this
_TOUCH_AFTER_S = 1.0  # a run this long records its end as the sandbox's last use too


class _Lock(Protocol):
    """The conversation's run lock (its handle's): taken as a ``threading.RLock`` is."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...

    def release(self) -> None: ...


def acquire_run_lock(lock: _Lock, control: CallControl | None) -> bool:
    """Take the conversation's lock; False (and not held) when the call is cancelled before it got it."""
    if control is None:
        lock.acquire()
        return True
    while not lock.acquire(timeout=_LOCK_POLL_S):
        if control.is_cancelled:
            return False
    if control.is_cancelled:
        lock.release()
        return False
    return True


def exec_control(control: CallControl | None, timeout_s: float) -> CallControl | None:
    """The control the backend gets: the same cancel; progress given against the run's own time limit (the
    backend's total is its deadline, which has the host's margins on top)."""
    if control is None or control.progress is None:
        return control

    def report(progress: float, _total: float | None, message: str | None) -> None:
        control.report(progress, timeout_s, message)

    return CallControl(cancelled=control.cancelled, progress=report)


def tend_sandbox(
    handle: SandboxHandle,
    sandbox: Sandbox,
    result: ExecResult,
    verdict: RunnerVerdict | None,
    run_number: int,
    *,
    removed: bool,
) -> None:
    """Leave the sandbox fit for the next run: forget a removed or ended one, restart one the run got around."""
    if removed:
        handle.discard(sandbox, f"removed from outside during run {run_number}")
    elif result.container_died:
        # gVisor ends its whole sandbox when the code exhausts memory or processes
        handle.discard(sandbox, f"the sandbox ended during run {run_number}")
    elif (
        result.over_cap is not None
        or result.deadline_hit
        or (verdict is not None and verdict.verdict == "left_running")
    ):
        # the runner did not stop the run itself (the code got around it, or a cancel's kill could not run), or
        # a process of the run outlived the runner's sweep: end every process at once
        logger.warning(
            "run %d in %s passed the host's backstop (%s); restarting the sandbox",
            run_number,
            sandbox.conversation_id,
            result.over_cap
            or ("cancel" if result.cancelled else "deadline" if result.deadline_hit else "left running"),
        )
        handle.restart(sandbox)
    if not (result.container_died or removed) and result.duration_s >= _TOUCH_AFTER_S:
        handle.touch(sandbox)  # idle time counts from the run's end (a short run's start was recorded)


def quota_breach(handle: SandboxHandle, result: ExecResult) -> QuotaUsage | None:
    """The folder's usage when the run ran into the disk quota, else None.

    ``loop``: the script failed on ENOSPC and the results filesystem is nearly full — a full ``/tmp`` gives
    the same error, but leaves the results folder with room. ``measured``: the folder is over the quota after
    the run (writes during it were not stopped).
    """
    if handle.folders.quota_mode == "measured":
        usage = handle.usage()
        return usage if usage.used_bytes > usage.limit_bytes else None
    if result.exit_code == 0 or not _NO_SPACE.search(decode(result.stderr[-8192:])):
        return None
    usage = handle.usage()
    return usage if usage.free_bytes <= max(_NEARLY_FULL_BYTES, usage.limit_bytes // 20) else None
