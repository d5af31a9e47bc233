"""The resident executor: one preloaded interpreter per sandbox that starts each run as a fresh forked process.

Usage: python -I executor.py NPROC_MAX [LIBRARIES] [--session]   (run by the host as one long ``docker exec``
with stdin attached; LIBRARIES: a comma-separated list of the office libraries to load at once, e.g.
``openpyxl,docx``; ``--session``: a host process, not a sandbox's, whose sweeps end only the processes of its own
session, with every run kept in that session: the fake backend's, see ``run.py``)

The host talks to it over that exec's stdin and stdout, which pass under runc and gVisor alike and are no
network. It imports the standard library's common modules once (and the libraries of LIBRARIES), freezes its
heap (``gc.freeze``: a forked run then copies few pages) and keeps one *spare*: a child forked while no run
exists, waiting for its job. An office library is loaded once a run has used it: a run that ends the way
``python`` ends says which of them it had imported (names only, on a pipe of its own; the executor believes
names it knows and nothing else), and the executor loads those while it waits, for every run after it. So an
idle sandbox that never ran office code holds only the standard library, and one that did has its libraries
ready. A run is the spare: it confines itself as the per-exec runner's script is confined
(``confine.py``: no_new_privs, the seccomp filter, RLIMIT_NPROC), takes the script's argv, working directory and
fresh ``__main__``, runs the script, and exits the way ``python script.py`` would. Nothing a run changes in its
own memory reaches the next run, which is forked from the executor again; the executor itself never runs code.

Host to executor, one JSON object per line::

    {"op": "hello"}                                the first line: the executor says ``R`` once it has read it
    {"op": "run", "nonce": N, "argv": [...], "cwd": "...", "timeout_s": T, "grace_s": G, "caps": [O, E]}
    {"op": "run", ..., "command": true, "env": {...}, "stdin": true|false}   a command (see below)
    {"op": "cancel", "nonce": N}
    {"op": "reply", "nonce": N, "body": {...}}     the answer to the run's oldest unanswered tool call
    {"op": "input", "nonce": N, "data": B64} / {"op": "input", "nonce": N, "end": true}   a command's stdin

Why ``R`` waits for the host's first line: Podman's service can drop what an exec writes before its attach stream
is connected (containers/podman#25855), and a lost ``R`` cost a run the whole start timeout. What the host writes
reaches the executor only through that stream, so once the executor has read it, what it writes is passed on.

A *command* is a program run the same way, confined alike: the spare, once confined, executes ``argv[0]`` found
on PATH in its own place (a shell's 127 when there is none, 126 when it cannot be run), with ``env`` laid over its
environment; with ``stdin`` it reads the host's ``input`` lines (``stdin_feed.py``: streamed, at most 1 MiB held
here), else /dev/null as a script does.

Executor to host: frames of one kind byte, a 4-byte big-endian length and the payload::

    R  ready, with this process's pid          S  started: the nonce; the run is handed over after it
    O  stdout bytes of the run                  E  stderr bytes of the run (at most cap + 1 of each)
    C  bytes the run wrote on its tool-call pipe: JSON lines, one per call (``sandbox_tools``); the host
       answers every line, in order, with a ``reply``, whose body goes to the run as one JSON line
    D  done: "NONCE VERDICT EXIT SIGNAL STREAM KEEP LIBRARIES" (the per-exec runner's record fields, whether
       the executor goes on: "keep" or "end", and the office libraries it loads for the runs after this one,
       comma-separated, or "-"; the host gives them to the sandbox's next executor)

While a tool call is unanswered (a line passed on, its reply not yet come) the run's time limit stands still: the
host bounds the time its calls take. The host judges every call; the executor only passes bytes on.

VERDICT is one of the runner's (``exited``, ``timeout``, ``output_limit``, ``not_started``, ``left_running``) or
``cancelled``. Why a run cannot change what a later run executes or is told:

* It runs as the same uid, so it can kill or stop the executor: the host then sees the stream end (or its own
  deadline pass), ends every process of the uid and starts a fresh executor for the next run. ``S`` is written
  before the job is handed over, so a stream that ends before ``S`` means the run never started.
* It cannot read or write the executor's memory (``ptrace`` is refused by the seccomp filter, the executor is
  non-dumpable, gVisor refuses a parent's memory), so it never learns the nonce: the host makes a new one per
  run, after the spare that runs it was forked. Under gVisor it can open the executor's stdin and stdout
  through ``/proc``; what it writes there cannot carry the nonce. ``D`` is one write of less than PIPE_BUF
  bytes, made after the final sweep found no other process of the uid alive, with the nonce first: a frame the
  host takes for ``D`` with the right nonce is this one.
* Bytes on stdin during a run that are not the host's cancel or reply (with the run's nonce) are the run's: the
  executor says ``end`` in ``D`` and exits, so the next run gets a fresh executor. A reply that comes after its
  run ended is dropped.
* Signals that end a process by default are ignored by the executor (SIGKILL and SIGSTOP excepted) and restored
  in each run.

Standard library only: this file runs inside the executor image.
"""

import atexit
import builtins
import contextlib
import gc
import importlib
import importlib.machinery
import json
import os
import select
import signal
import struct
import sys
import threading
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import confine
import run as runner
from stdin_feed import Feed

FRAME = struct.Struct(">cI")
PIPE_BUF = 4096
READ_CHUNK = 65536
REQUEST_MAX_BYTES = 4 << 20  # a command's words and variables are up to [run] command_line_max_bytes (3 MiB)
REPLIES_MAX_BYTES = 8 << 20  # replies a run has not read; past this it gets none any more (its pipe is closed)
CANCELLED_EXIT = 130
EXECUTOR_NAME = "sr-executor"  # the executor's process name (``/proc/<pid>/comm``), and a new spare's until it renames
SPARE_NAME = "sr-spare"  # the spare's process name until it runs its job
_IGNORED = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGTSTP,
    signal.SIGTTIN,
    signal.SIGTTOU,
    signal.SIGPIPE,
)
# the imports below begin this long after the executor's start (a run before then goes without them): a burst of
# new sandboxes reaches its first results before their executors take the CPU for imports no run waits for yet
IMPORTS_AFTER_S = 1.0
# imported once, while no request waits: the standard library's common modules (and the scripts' tool module)
STANDARD = (  # noqa: SIM905  (seventy names read better as words)
    "abc argparse array base64 bisect calendar codecs collections collections.abc contextlib copy csv ctypes "
    "dataclasses datetime decimal difflib email enum fractions functools glob gzip hashlib heapq hmac html "
    "html.parser io itertools json locale logging math numbers operator os pathlib pickle pprint random re "
    "shutil sqlite3 statistics string struct tempfile textwrap time traceback typing unicodedata urllib.parse "
    "uuid warnings xml.dom.minidom xml.etree.ElementTree zipfile zlib sandbox_tools"
).split()
# the office libraries, each loaded once a run of this sandbox has used it (by its top-level name)
LIBRARIES = {
    "openpyxl": ("openpyxl", "openpyxl.styles", "openpyxl.utils", "openpyxl.chart"),
    "docx": ("docx", "docx.shared", "docx.enum.text"),
    "pptx": ("pptx", "pptx.util", "pptx.chart.data"),
    "xlsxwriter": ("xlsxwriter",),
    "lxml": ("lxml.etree",),
    "PIL": ("PIL.Image",),
    "defusedxml": ("defusedxml",),
}


class Stream:
    """The executor's end of the host channel: requests in (lines), frames out."""

    def __init__(self):
        self.pending = bytearray()
        self.tampered = False
        self.ended = False  # the host closed stdin

    def send(self, kind, payload=b""):
        runner._write_all(1, FRAME.pack(kind, len(payload)) + payload)

    def waiting(self, until=None):
        """Whether a request (or the end of the stream) is waiting to be read; with ``until`` (a monotonic time),
        waits for one until then."""
        if b"\n" in self.pending:
            return True
        wait_s = 0 if until is None else max(0.0, until - time.monotonic())
        return bool(select.select([0], [], [], wait_s)[0])

    def read_request(self):
        """The next request (a dict), blocking; None at the end of the stream or on a line that is not one.
        A reply or input line between runs (its run ended before it came) is dropped: only the host writes here
        then."""
        while True:
            while b"\n" not in self.pending:
                chunk = os.read(0, READ_CHUNK)
                if not chunk or len(self.pending) > REQUEST_MAX_BYTES:
                    return None
                self.pending += chunk
            line, _, self.pending = self.pending.partition(b"\n")
            try:
                request = json.loads(line)
            except ValueError:
                return None
            if not isinstance(request, dict):
                return None
            if request.get("op") not in ("reply", "input"):
                return request

    def take_input(self, nonce, replies, final=False, feed=None):
        """Read what stdin holds now (while ``feed``, a command's stdin, has room): True when the host cancelled
        the run. The bodies of the host's replies are added to ``replies`` (each a JSON line), its input lines go
        to ``feed``; anything else marks tampering, and so does a part of a line left when the run is over
        (``final``), unless the host was still sending the command's input then."""
        cancelled = False
        while True:
            cancelled = self._take_lines(nonce, replies, feed) or cancelled
            if self.ended or (feed is not None and feed.full) or not select.select([0], [], [], 0)[0]:
                break
            chunk = os.read(0, READ_CHUNK)
            if not chunk:
                self.tampered = self.ended = True
                break
            self.pending += chunk
        if self.pending and (self.ended or (final and (feed is None or feed.ended))):
            self.tampered = True  # the host writes whole lines, and none after the run's end
        return cancelled

    def _take_lines(self, nonce, replies, feed):
        """Take the whole lines ``pending`` holds (see :meth:`take_input`); True when one is the host's cancel."""
        cancelled = False
        start = 0
        while True:
            end = self.pending.find(b"\n", start)
            if end < 0:
                break
            try:
                request = json.loads(self.pending[start:end])
            except ValueError:
                request = None
            start = end + 1
            if request == {"op": "cancel", "nonce": nonce}:
                cancelled = True
            elif (
                isinstance(request, dict)
                and request.keys() == {"op", "nonce", "body"}
                and (request["op"] == "reply" and request["nonce"] == nonce)
            ):
                replies.append(json.dumps(request["body"]).encode() + b"\n")
            elif isinstance(request, dict) and request.get("op") == "input" and request.get("nonce") == nonce:
                if feed is None or not feed.take(request):
                    self.tampered = True
            else:
                self.tampered = True
        del self.pending[:start]
        return cancelled


class Spare:
    """A child forked while no run exists, waiting for its job: the run's pipes are made with it (output, the
    job, the confinement's word, and the tool calls: the run's calls out, the host's replies in).

    In the child, ``pid`` is 0 and only its own ends are open (stdin is /dev/null; a command whose job gives it
    input gets the stdin pipe's end instead)."""

    def __init__(self):
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        job_read, job_write = os.pipe()
        ctl_read, ctl_write = os.pipe()
        call_read, call_write = os.pipe()
        reply_read, reply_write = os.pipe()
        used_read, used_write = os.pipe()
        in_read, in_write = os.pipe()  # a command's stdin, when its job asks for it
        self.pid = os.fork()
        if self.pid == 0:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_write, 1)
            os.dup2(err_write, 2)
            for fd in _open_fds():
                if fd not in (0, 1, 2, job_read, ctl_write, call_write, reply_read, used_write, in_read):
                    _close(fd)
            self.job_read, self.ctl_write, self.in_read = job_read, ctl_write, in_read
            self.call_write, self.reply_read = call_write, reply_read
            self.used_write = used_write
            return
        for fd in (out_write, err_write, job_read, ctl_write, call_write, reply_read, used_write, in_read):
            os.close(fd)
        os.set_blocking(in_write, False)
        self.in_write = in_write
        os.set_blocking(used_read, False)
        self.used_read = used_read
        os.set_blocking(reply_write, False)  # a run that does not read its replies never holds the executor up
        self.out_read, self.err_read, self.job_write, self.ctl_read = out_read, err_read, job_write, ctl_read
        self.call_read, self.reply_write = call_read, reply_write

    def hand_over(self, job):
        """Give the child its job; the reason it could not confine itself, or "" once it runs the script."""
        runner._write_all(self.job_write, json.dumps(job).encode() + b"\n")
        os.close(self.job_write)
        failure = b""
        while len(failure) < PIPE_BUF:
            chunk = os.read(self.ctl_read, PIPE_BUF)
            if not chunk:
                break
            failure += chunk
        os.close(self.ctl_read)
        return failure.decode(errors="replace")

    def end(self):
        """End a spare that gets no job (the executor ends, or replaces it by one forked once loaded)."""
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        for fd in (
            self.out_read,
            self.err_read,
            self.job_write,
            self.ctl_read,
            self.call_read,
            self.reply_write,
            self.used_read,
            self.in_write,
        ):
            _close(fd)

    def libraries_used(self):
        """The names of LIBRARIES the run said it imported (read once it ended: nothing of it writes any more);
        whatever else it wrote there is ignored."""
        try:
            said = os.read(self.used_read, PIPE_BUF)
        except OSError:
            said = b""
        _close(self.used_read)
        return {name for name in said.decode("ascii", "replace").split() if name in LIBRARIES}


def _close(fd):
    try:
        os.close(fd)
    except OSError:
        pass


def _open_fds():
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))


class _Calls:
    """The run's tool calls in flight: lines passed on to the host, replies passed back, and the time they took
    (the run's time limit stands still meanwhile)."""

    def __init__(self, spare, poller):
        self.spare, self.poller = spare, poller
        self.unanswered = 0
        self.out = bytearray()  # replies from the host the run has not read yet
        self.writing = False  # the reply pipe is watched for room
        self.since = None  # when the oldest unanswered call was passed on
        self.paused_s = 0.0

    def sent(self, chunk):
        """A chunk of the run's calls went to the host: every newline ends one call."""
        if self.unanswered == 0 and b"\n" in chunk:
            self.since = time.monotonic()
        self.unanswered += chunk.count(b"\n")

    def answered(self, replies):
        """The host answered: the replies go to the run; the clock goes on once no call is unanswered. A run
        that leaves more than REPLIES_MAX_BYTES unread gets no more (its pipe is closed: its next read ends)."""
        self.unanswered = max(0, self.unanswered - len(replies))
        if self.unanswered == 0:
            self._resume()
        if self.spare.reply_write is None or not replies:
            return
        for reply in replies:
            self.out += reply
        if len(self.out) > REPLIES_MAX_BYTES:
            self._stop_replies()
        elif not self.writing:
            self.poller.register(self.spare.reply_write, select.POLLOUT)
            self.writing = True

    def host_gone(self):
        """No reply can come any more (stdin ended): the clock goes on."""
        self.unanswered = 0
        self._resume()

    def _resume(self):
        if self.since is not None:
            self.paused_s += time.monotonic() - self.since
            self.since = None

    def paused(self):
        """Seconds the run's clock stood still, this pause included."""
        return self.paused_s + (time.monotonic() - self.since if self.since is not None else 0.0)

    def _stop_replies(self):
        if self.writing:
            self.poller.unregister(self.spare.reply_write)
            self.writing = False
        _close(self.spare.reply_write)
        self.spare.reply_write = None
        self.out.clear()

    def write(self):
        """Pass what the run may read on (never blocking); a run that closed its end gets no more."""
        try:
            written = os.write(self.spare.reply_write, self.out)
        except BlockingIOError:
            return
        except OSError:
            self._stop_replies()
            return
        del self.out[:written]
        if not self.out:
            self.poller.unregister(self.spare.reply_write)
            self.writing = False


def _relay(stream, spare, nonce, timeout_s, caps, with_input):
    """Pass the run's output and tool calls on as frames, and the host's replies back (and a command's input, when
    ``with_input``), until it exits, a cap is passed, the time is up or the host cancels.

    Returns ("exited", wait status), ("output_limit", stream name), ("timeout", None) or ("cancelled", None).
    Closes the run's pipes."""
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    pipes = {spare.out_read: (b"O", 0), spare.err_read: (b"E", 1), spare.call_read: (b"C", None)}
    for fd in (*pipes, 0):
        poller.register(fd, select.POLLIN)
    listening = True  # fd 0 is on the poller
    exit_watch = runner.ChildExit(spare.pid, poller)
    calls = _Calls(spare, poller)
    feed = Feed(spare.in_write, poller) if with_input else None
    spare.in_write = None  # the feed's now
    sent = [0, 0]
    try:
        while True:
            left = deadline + calls.paused() - time.monotonic()
            if left <= 0:
                return "timeout", None
            if exit_watch.seen() and not pipes:
                return "exited", exit_watch.status
            wait_s = exit_watch.wait_s() if calls.since is not None else min(left, exit_watch.wait_s())
            for fd, _event in poller.poll(1000 * wait_s):
                if fd == 0:
                    replies = []
                    cancelled = stream.take_input(nonce, replies, feed=feed)
                    calls.answered(replies)
                    if cancelled and not stream.tampered:
                        return "cancelled", None
                    if feed is not None:
                        feed.settle()
                    if stream.tampered or (feed is not None and feed.full):
                        poller.unregister(0)  # tampered: the run is seen through, the executor ends after it
                        listening = False
                    if stream.tampered:
                        calls.host_gone()
                elif feed is not None and fd == feed.fd:
                    feed.write()
                    if not listening and not feed.full and not stream.tampered:
                        poller.register(0, select.POLLIN)
                        listening = True
                elif fd == spare.reply_write:
                    calls.write()
                elif fd in pipes and _forward(stream, poller, fd, pipes, sent, caps, calls):
                    return "output_limit", ("stdout", "stderr")[pipes[fd][1]]
    finally:
        exit_watch.close()
        for fd in pipes:
            os.close(fd)
        if spare.reply_write is not None:
            _close(spare.reply_write)
        if feed is not None:
            feed.close()


def _forward(stream, poller, fd, pipes, sent, caps, calls):
    """Pass one chunk of the run's output (at most cap + 1 bytes in all) or of its calls on; True once a cap is
    passed."""
    chunk = os.read(fd, READ_CHUNK)
    if not chunk:
        poller.unregister(fd)
        del pipes[fd]
        os.close(fd)
        return False
    kind, index = pipes[fd]
    if index is None:
        stream.send(kind, chunk)
        calls.sent(chunk)
        return False
    room = caps[index] + 1 - sent[index]
    if room > 0:
        stream.send(kind, chunk[:room])
        sent[index] += min(len(chunk), room)
    return sent[index] > caps[index]


def _verdict(outcome, detail):
    """(verdict, exit status, signal, stream) of how the relay ended."""
    if outcome == "cancelled":
        return "cancelled", CANCELLED_EXIT, None, None
    if outcome == "timeout":
        return "timeout", runner.TIMEOUT_EXIT, None, None
    if outcome == "output_limit":
        return "output_limit", runner.OUTPUT_LIMIT_EXIT, None, detail
    status, signal_number = runner.script_status(detail)
    return "exited", status, signal_number, None


def _job(request):
    """The validated run request as (nonce, job for the spare, timeout_s, grace_s, caps), or None.

    A script's job is ``argv`` = the interpreter, the script, its arguments; a ``command``'s is the program (found
    on PATH) and its arguments, with ``env`` laid over the executor's environment and, with ``stdin``, the
    run's input lines on its standard input (else it reads /dev/null, as a script does)."""
    try:
        nonce, argv, cwd = request["nonce"], request["argv"], request["cwd"]
        timeout_s, grace_s = float(request["timeout_s"]), float(request["grace_s"])
        caps = (int(request["caps"][0]), int(request["caps"][1]))
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    command, env, stdin = request.get("command", False), request.get("env", {}), request.get("stdin", False)
    if not (isinstance(nonce, str) and nonce.isalnum() and 16 <= len(nonce) <= 64 and isinstance(cwd, str)):
        return None
    shortest = 1 if command is True else 2
    if not (isinstance(argv, list) and len(argv) >= shortest and all(isinstance(a, str) for a in argv)):
        return None
    if not (
        timeout_s > 0
        and grace_s >= 0
        and min(caps) > 0
        and command in (True, False)
        and stdin in (True, False)
        and (command or not (env or stdin))
        and isinstance(env, dict)
        and all(_variable(name, value) for name, value in env.items())
    ):
        return None
    job = {"argv": argv, "cwd": cwd, "command": command, "env": env, "stdin": stdin}
    return nonce, job, timeout_s, grace_s, caps


def _variable(name, value):
    """Whether ``name=value`` can be an environment entry."""
    return (
        isinstance(name, str)
        and isinstance(value, str)
        and name != ""
        and "=" not in name
        and "\0" not in name
        and "\0" not in value
    )


def _serve_one(stream, spare, job, libraries):
    """Run one job in the spare and say how it ended; False when the executor must end after it. ``libraries``
    (the names this executor loads) gains those the run used."""
    nonce, work, timeout_s, grace_s, caps = job
    stream.send(b"S", nonce.encode())
    failure = spare.hand_over(work)
    if not work["stdin"] or failure:
        os.close(spare.in_write)
        spare.in_write = None
    if failure:
        for fd in (spare.out_read, spare.err_read, spare.call_read, spare.reply_write, spare.used_read):
            os.close(fd)
        os.waitpid(spare.pid, 0)
        reason = f"sandbox-runtime: the sandbox could not confine the script, so it did not run: {failure}\n"
        stream.send(b"E", reason.encode())
        verdict = ("not_started", runner.NOT_STARTED_EXIT, None, None)
    else:
        outcome, detail = _relay(stream, spare, nonce, timeout_s, caps, work["stdin"])
        verdict = _verdict(outcome, detail)
        settle = grace_s if outcome == "timeout" else 0.0 if outcome in ("output_limit", "cancelled") else 0.2
        if not runner.sweep(settle):
            verdict = ("left_running", runner.LEFT_RUNNING_EXIT, None, None)
        libraries |= spare.libraries_used()
    # after the sweep nothing of the run is left to write to stdin (the host may still be sending its input)
    stream.take_input(nonce, [], final=True, feed=Feed(None, None) if work["stdin"] else None)
    keep = not stream.tampered and verdict[0] != "left_running"
    name, exit_status, signal_number, which = verdict
    fields = (nonce, name, str(exit_status), "-" if signal_number is None else str(signal_number), which or "-")
    loaded = ",".join(sorted(libraries)) or "-"
    stream.send(b"D", " ".join((*fields, "keep" if keep else "end", loaded)).encode())
    return keep


def _serve(libraries):
    """The executor's loop; returns (in a spare only) that spare, once the executor has forked it.

    From ``IMPORTS_AFTER_S`` after its start, the modules are imported one at a time while no request waits (and
    one before each request, so that runs back to back still get them); once they all are, the heap is frozen and
    the spare forked before that is replaced by one that has them. A library a run used is loaded the same way
    after it."""
    stream = Stream()
    greeting = stream.read_request()
    if greeting is None or greeting.get("op") != "hello":
        os._exit(0)  # not the host (or it went away): nothing was started
    stream.send(b"R", str(os.getpid()).encode())
    imports_from = time.monotonic() + IMPORTS_AFTER_S
    loading = [*STANDARD, *(module for name in sorted(libraries) for module in LIBRARIES[name])]
    while True:
        spare = Spare()
        if spare.pid == 0:
            return spare
        if loading and (time.monotonic() >= imports_from or not stream.waiting(until=imports_from)):
            _import(loading.pop(0))  # at least one each time round: runs back to back still get them loaded
            while loading and not stream.waiting():
                _import(loading.pop(0))
            if not loading:
                gc.collect()
                gc.freeze()
                spare.end()
                continue  # a spare forked from the loaded executor
        request = stream.read_request()
        job = _job(request) if request is not None and request.get("op") == "run" else None
        if job is None:  # the end of the stream, or not a request: the host starts a fresh executor
            spare.end()
            os._exit(0)
        before = set(libraries)
        if not _serve_one(stream, spare, job, libraries):
            runner.sweep(0.0)
            os._exit(0)
        loading += [module for name in sorted(libraries - before) for module in LIBRARIES[name]]


def _prepare(spare, nproc_max):
    """In a spare, before its job: confine this process and set it up as ``python`` sets up a script's.

    The reason confinement failed goes to the executor (the spare then ends; the job never runs)."""
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at start-up
    try:
        confine.set_name(SPARE_NAME)
        if not runner.SESSION_ONLY:
            os.setsid()
        confine.install(nproc_max)
        confine.allow_inspection()  # as a script that ``python`` started: its own children may debug it
    except Exception as exc:
        runner._write_all(spare.ctl_write, (str(exc) or type(exc).__name__).encode())
        os._exit(runner.NOT_STARTED_EXIT)
    os.close(spare.ctl_write)
    try:
        tools = importlib.import_module("sandbox_tools")  # preloaded: the run's way to call the host's tools
    except ImportError:
        for fd in (spare.call_write, spare.reply_read):
            _close(fd)
    else:
        tools._connect(spare.call_write, spare.reply_read)
    sys.dont_write_bytecode = True
    for handle in (sys.stdout, sys.stderr):
        handle.reconfigure(encoding="utf-8", errors="backslashreplace")
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()


def _take_job(spare):
    """In a spare: wait for the job the executor hands over."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(spare.job_read, READ_CHUNK)
        if not chunk:  # the executor ended without handing one over
            os._exit(0)
        line += chunk
    os.close(spare.job_read)
    return json.loads(line)


def _become_main(argv, cwd, used_write):
    """Run ``argv`` (the interpreter's path, the script's path, its arguments) as the main program; as it ends,
    it says on ``used_write`` which of LIBRARIES it imported."""
    confine.set_name("python")  # as ``python script.py`` is named
    os.chdir(cwd)
    script = argv[1]
    sys.argv = list(argv[1:])
    sys.path[:] = [os.path.dirname(os.path.abspath(script)), *BASE_PATH]
    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__builtins__ = builtins
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    main.__spec__ = None
    sys.modules["__main__"] = main
    try:
        with open(script, "rb") as handle:
            source = handle.read()
    except OSError as exc:
        sys.stderr.write(f"{argv[0]}: can't open file {script!r}: [Errno {exc.errno}] {exc.strerror}\n")
        raise SystemExit(2) from None
    try:
        code = compile(source, script, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        # as ``python script.py`` shows it: the error alone, no frame (the hook prints the exception's own
        # traceback, so this frame is taken off the exception itself, not only off the argument)
        sys.excepthook(type(exc), exc.with_traceback(None), None)
        raise SystemExit(1) from None
    try:
        exec(code, main.__dict__)  # noqa: S102  (this is the run: the script's code, in its own process)
    except SystemExit as exc:
        _exit(exc.code, used_write)
    except BaseException as exc:
        # the script's frames only, from its module on: this function's frame is not the script's
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        _exit(130 if isinstance(exc, KeyboardInterrupt) else 1, used_write)
    _exit(0, used_write)


def _become_command(argv, cwd, env):
    """Run a program in place of this process, as a shell would: found on PATH, the signals a shell leaves at
    their defaults, 127 when there is no such program, 126 when it cannot be run (or ``cwd`` cannot be entered)."""
    for sig in (signal.SIGPIPE, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.chdir(cwd)
    except OSError as exc:
        os.write(2, f"sandbox-runtime: cannot enter {cwd}: {exc.strerror}\n".encode(errors="backslashreplace"))
        os._exit(126)
    os.environ.update(env)
    try:
        os.execvpe(argv[0], argv, os.environ)
    except FileNotFoundError:
        said, status = "command not found", 127
    except OSError as exc:
        said, status = exc.strerror or type(exc).__name__, 126
    os.write(2, f"{argv[0]}: {said}\n".encode(errors="backslashreplace"))
    os._exit(status)


def _exit(code, used_write):
    """End the run as the interpreter would (threads joined, atexit run, streams flushed), without tearing the
    preloaded modules down one by one: that costs tens of milliseconds and dirties every page of the heap."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        with contextlib.suppress(Exception):
            sys.stderr.write(f"{code}\n")
        status = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # the script's threads, joined as at the interpreter's exit
    atexit._run_exitfuncs()
    for handle in (sys.stdout, sys.stderr):
        try:
            handle.flush()
        except Exception:
            status = 120 if status == 0 else status
    used = " ".join(name for name in LIBRARIES if name in sys.modules)  # names only, in one short write
    with contextlib.suppress(OSError):  # never blocks: a script that filled the pipe has said enough
        os.set_blocking(used_write, False)
        os.write(used_write, used.encode()[:PIPE_BUF])
    os._exit(status)


def _import(name):
    with contextlib.suppress(Exception):  # an image without one of them still serves; a script's import says why
        importlib.import_module(name)


BASE_PATH = [entry for entry in sys.path if entry and entry != os.path.dirname(os.path.abspath(__file__))]


def main(argv):
    words = [word for word in argv[1:] if not word.startswith("--")]
    runner.SESSION_ONLY = "--session" in argv[1:]
    nproc_max = int(words[0])
    libraries = {name for name in (words[1] if len(words) > 1 else "").split(",") if name in LIBRARIES}
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    runner.sweep(0.0)  # a spare or a run left by an earlier executor
    confine.forbid_inspection()
    confine.set_name(EXECUTOR_NAME)  # a spare is never named as a run is, not even between its fork and its rename
    spare = _serve(libraries)
    _prepare(spare, nproc_max)
    job = _take_job(spare)
    if job["stdin"]:
        os.dup2(spare.in_read, 0)
    os.close(spare.in_read)
    if job["command"]:
        _become_command(job["argv"], job["cwd"], job["env"])
    _become_main(job["argv"], job["cwd"], spare.used_write)


if __name__ == "__main__":
    main(sys.argv)
