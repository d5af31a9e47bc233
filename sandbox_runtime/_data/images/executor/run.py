"""In-sandbox runner: start one script in its own session, enforce its wall-clock limit, leave no process.

Usage: run.py TIMEOUT_S GRACE_S STDOUT_MAX_BYTES STDERR_MAX_BYTES NPROC_MAX PROGRAM [ARG...]

Before the script starts, its process is confined (``confine.py``: no_new_privs, a seccomp filter, and
RLIMIT_NPROC when NPROC_MAX > 0); if that fails the script does not run and the exit status is 126.

The container's own command (the keeper) runs under a different uid from the code, so ``kill(-1, ...)``
from here reaches every process of the code's uid except this runner: processes left by an earlier run
(a double-forked daemon) are ended before the script starts, and everything the script started is ended
after it returns. The exit status is the script's (128 + signal number when a signal ended it); 124 means
this runner stopped it at its time limit, 125 that it passed an output cap (the runner relays stdout and
stderr through pipes of its own and stops at cap + 1 bytes, so the host never has to cut the stream).
Standard library only: this file runs inside the executor image.
"""

import os
import select
import sys
import time

SIGKILL, SIGTERM = 9, 15  # plain numbers: importing `signal` costs milliseconds on every run
TIMEOUT_EXIT = 124
OUTPUT_LIMIT_EXIT = 125
CONFINE_FAILED_EXIT = 126


def _others_exist():
    """Whether any process of this uid other than this one is alive (zombies excepted)."""
    me, uid = os.getpid(), os.getuid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat("/proc/" + name).st_uid != uid:
                continue
            with open("/proc/" + name + "/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # it ended while we looked
        if state not in (b"Z", b"X"):
            return True
    return False


def _signal_all(sig):
    try:
        os.kill(-1, sig)
    except ProcessLookupError:
        pass


def _reap_children():
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(grace_s):
    """SIGTERM every other process of this uid, SIGKILL what is left after grace_s; bounded in time."""
    if not _others_exist():
        return
    if grace_s > 0:
        _signal_all(SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            _reap_children()
            if not _others_exist():
                return
            time.sleep(0.01)
    for _ in range(200):
        _signal_all(SIGKILL)
        _reap_children()
        if not _others_exist():
            return
        time.sleep(0.005)


def _relay(child, timeout_s, out_fd, err_fd, caps):
    """Copy the child's output to ours until it exits, a cap is passed, or the time is up.

    Returns ("exited", status), ("output_limit", None) or ("timeout", None). At most cap + 1 bytes of a
    stream are passed on, so the host sees the cap was passed without reading further. The child's exit is
    watched through a pidfd where the kernel has them, so the loop wakes the moment it ends.
    """
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    pipes = {out_fd: (1, 0), err_fd: (2, 1)}
    for fd in pipes:
        poller.register(fd, select.POLLIN)
    try:
        exit_fd = os.pidfd_open(child)
    except (AttributeError, OSError):
        exit_fd = None  # no pidfds (an old kernel or gVisor): poll for the exit instead
    else:
        poller.register(exit_fd, select.POLLIN)
    sent = [0, 0]
    status = None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", None
            if status is None:
                pid, raw = os.waitpid(child, os.WNOHANG)
                if pid == child:
                    status = raw
                    if exit_fd is not None:
                        poller.unregister(exit_fd)
                    sweep(0.0)  # the script is gone: what it left holding its pipes is ended so they close
            if status is not None and not pipes:
                return "exited", status
            wait_s = 0.01 if exit_fd is None and status is None else 0.5
            for fd, _event in poller.poll(1000 * min(left, wait_s)):
                if fd in pipes and _forward(poller, fd, pipes, sent, caps):
                    return "output_limit", None
    finally:
        if exit_fd is not None:
            os.close(exit_fd)


def _forward(poller, fd, pipes, sent, caps):
    """Pass one chunk from the child's pipe on (at most cap + 1 bytes in all); True once a cap is passed."""
    chunk = os.read(fd, 65536)
    if not chunk:
        poller.unregister(fd)
        del pipes[fd]
        os.close(fd)
        return False
    out, index = pipes[fd]
    room = caps[index] + 1 - sent[index]
    _write_all(out, chunk[:room])
    sent[index] += min(len(chunk), room)
    return sent[index] > caps[index]


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def main(argv):
    timeout_s = float(argv[1])
    grace_s = float(argv[2])
    caps = (int(argv[3]), int(argv[4]))
    nproc_max = int(argv[5])
    program = argv[6:]
    sweep(0.0)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            os.dup2(out_write, 1)
            os.dup2(err_write, 2)
            for fd in (out_read, out_write, err_read, err_write):
                os.close(fd)
            try:
                sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
                import confine  # only the child pays for ctypes

                confine.install(nproc_max)
            except Exception as exc:
                os.write(2, f"sandbox-runtime: the sandbox could not confine the script: {exc}\n".encode())
                os._exit(CONFINE_FAILED_EXIT)
            os.execv(program[0], program)
        finally:
            os._exit(127)
    os.close(out_write)
    os.close(err_write)
    outcome, status = _relay(child, timeout_s, out_read, err_read, caps)
    if outcome == "timeout":
        sweep(grace_s)
        os._exit(TIMEOUT_EXIT)
    if outcome == "output_limit":
        sweep(0.0)
        os._exit(OUTPUT_LIMIT_EXIT)
    sweep(0.2)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main(sys.argv)
