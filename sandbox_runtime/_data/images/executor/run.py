"""In-sandbox runner: start one script in its own session, enforce its wall-clock limit, leave no process.

Usage: run.py TIMEOUT_S GRACE_S STDOUT_MAX_BYTES STDERR_MAX_BYTES NPROC_MAX PROGRAM [ARG...]

The container's own command (the keeper) runs under a different uid from the code, so ``kill(-1, ...)``
from here reaches every process of the code's uid except this runner: processes left by an earlier run
(a double-forked daemon) are ended before the script starts, and everything the script started is ended
after it returns. The runner relays stdout and stderr through pipes of its own and stops at cap + 1 bytes,
so the host never has to cut the stream.

Before the script starts, the runner confines itself (``confine.py``: no_new_privs, a seccomp filter that
refuses ``ptrace`` and ``process_vm_writev`` among others, RLIMIT_NPROC when NPROC_MAX > 0) and the script
inherits that confinement; it also makes itself non-dumpable, which the script's ``exec`` does not inherit.

The verdict: the exit status is the script's own (128 + signal number when a signal ended it), and the
runner's record of how the run ended is the last line of stderr::

    \\0sandbox-runtime-verdict VERDICT EXIT SIGNAL STREAM\\n

VERDICT is ``exited`` (EXIT is the script's status, SIGNAL the signal that ended it or ``-``), ``timeout``
(EXIT 124: this runner stopped it at its time limit), ``output_limit`` (EXIT 125; STREAM names the stream
that passed its cap), ``not_started`` (EXIT 126: the confinement failed, the script never ran; the reason
is on stderr before the record) or ``left_running`` (EXIT 127: a process of the code's uid outlived the
final sweep). The host believes a record only when it is the last bytes of stderr and EXIT is the exec's
exit status; it believes ``timeout``, ``output_limit``, ``not_started`` and ``left_running`` only with
their own EXIT. Without a record every exit status is the script's own. Why the script cannot forge one:

* The exec's exit status is set by this process alone. The script runs as the same uid, so it can end this
  runner with a signal (the status is then 128 + N, at least 129: none of the runner's own codes, and
  without a record), but it cannot make it exit with a status of its choosing: ``ptrace`` and
  ``process_vm_writev`` are refused by the seccomp filter, and ``/proc/<runner>/mem`` cannot be opened
  (this runner is non-dumpable, which also closes its ``/proc`` descriptors under runc; gVisor refuses a
  process its parent's memory either way). The script has no capabilities and no other uid to become.
  ``tests/test_run_verdict.py`` tries each of these from inside, under both runtimes.
* The record is written after the final sweep found no other process of the code's uid alive, so nothing
  but this runner can write to the exec's stderr after it: the script can put lines that look like records
  into its output (even straight into the runner's stderr, where gVisor lets it open ``/proc/<runner>/fd``),
  but always before the real record, never after it. When a process outlives the sweep the runner exits
  127 with ``left_running``: a record that process appends can then only say ``exited 127`` or
  ``left_running 127``, both of them errors.
* A script that exits 124, 125 or 126 itself gets ``exited 124`` (etc.) from the runner; a record it
  printed and then ended the runner by a signal carries an EXIT that is not the exec's status.

Outside a sandbox (the fake backend runs the resident executor as a host process) a sweep by uid would end
every process of the host's user, so there the executor sets ``SESSION_ONLY``: a sweep then ends the processes
of this process's session only (a process that leaves it is not ended; the fake backend says so).

Standard library only: this file runs inside the executor image.
"""

import os
import select
import sys
import time

SIGKILL, SIGTERM = 9, 15  # plain numbers: importing `signal` costs milliseconds on every run
TIMEOUT_EXIT = 124
OUTPUT_LIMIT_EXIT = 125
NOT_STARTED_EXIT = 126
LEFT_RUNNING_EXIT = 127
RECORD_MARK = b"\0sandbox-runtime-verdict "
SESSION_ONLY = False  # a sweep ends this session's processes, not the uid's (a host process: see the docstring)


def _others():
    """The pids of the processes a sweep ends, other than this one, that are alive (zombies excepted): every
    process of this uid, or of this session with ``SESSION_ONLY``. Never pid 1, which ``kill(-1)`` does not reach
    either: the container's init (in a pod, the keeper, under the code's uid)."""
    me, uid = os.getpid(), os.getuid()
    session = os.getsid(0) if SESSION_ONLY else None
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (me, 1):
            continue
        try:
            if os.stat("/proc/" + name).st_uid != uid:
                continue
            with open("/proc/" + name + "/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it ended while we looked
        if fields[0] not in (b"Z", b"X") and (session is None or int(fields[3]) == session):
            found.append(int(name))
    return found


def _others_exist():
    """Whether any process a sweep ends is alive, other than this one (zombies excepted)."""
    return bool(_others())


def _signal_all(sig):
    for pid in _others() if SESSION_ONLY else (-1,):
        try:
            os.kill(pid, sig)
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
    """SIGTERM every other process of this uid, SIGKILL what is left after grace_s; bounded in time.

    True when no other process of this uid is left alive."""
    if not _others_exist():
        return True
    if grace_s > 0:
        _signal_all(SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            _reap_children()
            if not _others_exist():
                return True
            time.sleep(0.01)
    for _ in range(200):
        _signal_all(SIGKILL)
        _reap_children()
        if not _others_exist():
            return True
        time.sleep(0.005)
    return False


def record(verdict, exit_status, signal_number=None, stream=None):
    """The verdict record: the last line this runner writes to stderr (see the module's docstring)."""
    fields = (verdict, str(exit_status), "-" if signal_number is None else str(signal_number), stream or "-")
    return RECORD_MARK + " ".join(fields).encode() + b"\n"


def script_status(wait_status):
    """The exit status and ending signal (or None) of a script from its wait status."""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status), os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status), None


def verdict_of(outcome, detail):
    """(exit status, record) for how ``_relay`` ended: ``detail`` is the wait status, or the capped stream."""
    if outcome == "timeout":
        return TIMEOUT_EXIT, record("timeout", TIMEOUT_EXIT)
    if outcome == "output_limit":
        return OUTPUT_LIMIT_EXIT, record("output_limit", OUTPUT_LIMIT_EXIT, stream=detail)
    status, signal_number = script_status(detail)
    return status, record("exited", status, signal_number)


class ChildExit:
    """A child's exit, watched through a pidfd where the kernel has them (a poll then wakes the moment it ends;
    without one, an old kernel or gVisor, the caller polls every 10 ms)."""

    def __init__(self, child, poller):
        self.child, self.poller, self.status = child, poller, None
        try:
            self.fd = os.pidfd_open(child)
        except (AttributeError, OSError):
            self.fd = None
        else:
            poller.register(self.fd, select.POLLIN)

    def seen(self):
        """True once the child has exited (its wait status is then ``status``); the first time, ``sweep(0.0)``
        ends what it left holding its pipes, so they close."""
        if self.status is not None:
            return True
        pid, raw = os.waitpid(self.child, os.WNOHANG)
        if pid != self.child:
            return False
        self.status = raw
        if self.fd is not None:
            self.poller.unregister(self.fd)
        sweep(0.0)
        return True

    def wait_s(self):
        """How long a poll may sleep before the exit is looked at again."""
        return 0.01 if self.fd is None and self.status is None else 0.5

    def close(self):
        if self.fd is not None:
            os.close(self.fd)


def _relay(child, timeout_s, out_fd, err_fd, caps):
    """Copy the child's output to ours until it exits, a cap is passed, or the time is up.

    Returns ("exited", wait status), ("output_limit", "stdout" or "stderr") or ("timeout", None). At most
    cap + 1 bytes of a stream are passed on, so the host sees the cap was passed without reading further.
    """
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    pipes = {out_fd: (1, 0), err_fd: (2, 1)}
    for fd in pipes:
        poller.register(fd, select.POLLIN)
    exit_watch = ChildExit(child, poller)
    sent = [0, 0]
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", None
            if exit_watch.seen() and not pipes:
                return "exited", exit_watch.status
            for fd, _event in poller.poll(1000 * min(left, exit_watch.wait_s())):
                if fd in pipes and _forward(poller, fd, pipes, sent, caps):
                    return "output_limit", ("stdout", "stderr")[pipes[fd][1]]
    finally:
        exit_watch.close()


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


def _confine_self(nproc_max):
    """Confine this runner (the script inherits it) and make it non-dumpable; the reason when that fails."""
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import confine

        confine.install(nproc_max)
        confine.forbid_inspection()
    except Exception as exc:
        return str(exc) or type(exc).__name__
    return None


def _start(program, out_write, err_write, closing):
    """Fork the script's process: its own session, the runner's pipes as stdout and stderr."""
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            os.dup2(out_write, 1)
            os.dup2(err_write, 2)
            for fd in closing:
                os.close(fd)
            os.execv(program[0], program)
        except BaseException as exc:
            os.write(2, f"sandbox-runtime: the script could not be started: {exc}\n".encode())
        finally:
            os._exit(127)
    return child


def main(argv):
    timeout_s = float(argv[1])
    grace_s = float(argv[2])
    caps = (int(argv[3]), int(argv[4]))
    nproc_max = int(argv[5])
    program = argv[6:]
    sweep(0.0)
    failure = _confine_self(nproc_max)
    if failure is not None:
        message = f"sandbox-runtime: the sandbox could not confine the script, so it did not run: {failure}\n"
        _write_all(2, message.encode() + record("not_started", NOT_STARTED_EXIT))
        os._exit(NOT_STARTED_EXIT)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    child = _start(program, out_write, err_write, (out_read, out_write, err_read, err_write))
    os.close(out_write)
    os.close(err_write)
    outcome, detail = _relay(child, timeout_s, out_read, err_read, caps)
    exit_status, verdict = verdict_of(outcome, detail)
    if not sweep(grace_s if outcome == "timeout" else 0.0 if outcome == "output_limit" else 0.2):
        exit_status, verdict = LEFT_RUNNING_EXIT, record("left_running", LEFT_RUNNING_EXIT)
    _write_all(2, verdict)
    os._exit(exit_status)


if __name__ == "__main__":
    main(sys.argv)
