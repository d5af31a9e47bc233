"""The client process of a stdio server, and ending its conversation's sandbox once that client has exited.

Over stdio, a server's default conversation belongs to its *client process* (the server's parent), so a client
that starts a new server process for every call keeps one conversation and one sandbox. When a session ends
(stdin closes) the server cannot tell a client that exits from one that will start the next session in a moment,
and a client that exits normally waits for its server to exit first. So:

- when the client is already gone, the server ends the conversation's sandbox itself before it exits;
- otherwise it leaves a small detached watcher (``sandbox-runtime … release-when-client-exits``, at most one
  per conversation, held by a lock file) that waits for the client process to exit — a pidfd, no polling — and
  then ends the sandbox. The folders stay for a later start; a client that starts another session meanwhile
  simply finds its sandbox still running.

A client is a pid together with its start time (``/proc/<pid>/stat``), so a reused pid is never taken for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandbox_runtime.processes import process_start
from sandbox_runtime.state.locks import try_flock

__all__ = ["ClientProcess", "release_when_client_exits", "start_watcher"]

logger = logging.getLogger(__name__)

WATCH_COMMAND = "release-when-client-exits"
_POLL_FALLBACK_S = 1.0  # where pidfds are missing, the client's liveness is checked this often


@dataclass(frozen=True)
class ClientProcess:
    """A process, named by its pid and start time."""

    pid: int
    start: str | None

    @classmethod
    def parent(cls) -> ClientProcess:
        """This process's parent: the client of a stdio server."""
        pid = os.getppid()
        return cls(pid, process_start(pid))

    def alive(self) -> bool:
        """Whether the same process still runs (a pid reused by another process does not count)."""
        return self.pid > 1 and process_start(self.pid) == self.start

    def wait_for_exit(self, timeout_s: float) -> bool:
        """Block until the process has exited or ``timeout_s`` passed; whether it has exited."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return True
        except (AttributeError, OSError):
            pidfd = None  # no pidfds here: look every second instead
        try:
            if not self.alive():  # checked after the pidfd was opened: it cannot name a reused pid now
                return True
            if pidfd is None:
                return self._poll_for_exit(timeout_s)
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            return bool(poller.poll(int(timeout_s * 1000)))
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _poll_for_exit(self, timeout_s: float) -> bool:
        waited = 0.0
        while self.alive():
            if waited >= timeout_s:
                return False
            select.select([], [], [], _POLL_FALLBACK_S)
            waited += _POLL_FALLBACK_S
        return True


def start_watcher(state_dir: Path, policy: str, client: ClientProcess, conversation_id: str) -> None:
    """Leave a detached watcher that ends the conversation's sandbox once ``client`` exits (see the module text)."""
    command = [
        sys.executable,
        "-m",
        "sandbox_runtime",
        "--state-dir",
        str(state_dir),
        "--policy",
        policy,
        WATCH_COMMAND,
        "--pid",
        str(client.pid),
        "--start",
        client.start or "",
        "--conversation",
        conversation_id,
    ]
    subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not in the client's process group: its exit does not end the watcher
        close_fds=True,
    )


@contextlib.contextmanager
def _watch_lock(state_dir: Path, conversation_id: str) -> Iterator[bool]:
    """Whether this process is the conversation's one watcher (the lock is held while the block runs)."""
    folder = state_dir / "watchers"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(folder / f"{conversation_id}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        yield try_flock(fd)
    finally:
        os.close(fd)


def _still_known(state_dir: Path, policy: str, conversation_id: str) -> bool:
    """Whether the state database still knows the conversation (never made again by looking)."""
    from sandbox_runtime.policy import load_policy  # noqa: PLC0415  (the client's own start stays light)
    from sandbox_runtime.state.database import StateDB  # noqa: PLC0415  (the same)
    from sandbox_runtime.state.location import open_engine, state_dir_in_use, state_url  # noqa: PLC0415  (the same)

    if not state_dir_in_use(state_dir):
        return False
    settings = load_policy(policy).state
    state = StateDB(open_engine(state_dir, state_url(None, settings), settings))
    try:
        return state.conversation(conversation_id) is not None
    finally:
        state.close()


def release_when_client_exits(
    state_dir: Path, policy: str, client: ClientProcess, conversation_id: str, *, max_wait_s: float
) -> bool:
    """The watcher: wait (at most ``max_wait_s``) for ``client`` to exit, then end the conversation's sandbox.
    False when another watcher already waits for it, or the client outlived the wait."""
    with _watch_lock(state_dir, conversation_id) as mine:
        if not mine:
            return False
        if not client.wait_for_exit(max_wait_s):
            return False
        if not _still_known(state_dir, policy, conversation_id):
            return True  # the state directory or the conversation was removed meanwhile: nothing is left to end
        from sandbox_runtime.api.runtime import Runtime  # noqa: PLC0415  (only once there is something to end)

        with Runtime(state_dir, policy, sweep_on_start=False, reap_interval_s=None, retention_interval_s=None) as rt:
            closed = rt.conversation(conversation_id).close()
        logger.info("client %d exited: the sandbox of %s %s", client.pid, conversation_id, "ended" if closed else "")
        return True
