"""How the fake backend runs one command: a host process in a session of its own, read with caps and a deadline,
and, for the runner's command, the runner's contract kept on the host (time limit with grace, output caps, the
verdict line at the end of stderr, exit codes 124 and 125).

The real runner (``_data/images/executor/run.py``) cannot run on the host: its sweep signals every process of
its uid (``kill(-1)``), which outside a sandbox is every process of the host's user. Here a run's processes are
its session's process group, ended with ``killpg``; a process that leaves that group is not ended.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, NamedTuple

from sandbox_runtime.control import CallControl
from sandbox_runtime.sandbox.backend import ExecResult
from sandbox_runtime.sandbox.exec_stream import Caller

__all__ = ["RunnerLimits", "end_group", "run_command"]

_WAKE_S = 0.2  # the loop's longest sleep: cancel, progress and limits are looked at this often
_CANCEL_DRAIN_S = 1.0
_TIMEOUT_EXIT, _OUTPUT_LIMIT_EXIT = 124, 125
_VERDICT_MARK = b"\0sandbox-runtime-verdict "


class RunnerLimits(NamedTuple):
    """The runner's own limits, from its command line: time limit and grace in seconds, caps in bytes."""

    timeout_s: float
    grace_s: float
    stdout_max_bytes: int
    stderr_max_bytes: int


def _verdict_line(verdict: str, exit_status: int, signal_number: int | None = None, stream: str | None = None) -> bytes:
    fields = (verdict, str(exit_status), "-" if signal_number is None else str(signal_number), stream or "-")
    return _VERDICT_MARK + " ".join(fields).encode() + b"\n"


def end_group(process: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal every process of the run's session (its process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def run_command(
    argv: Sequence[str],
    *,
    cwd: str,
    environment: Mapping[str, str],
    caps: tuple[int, int],
    deadline_s: float,
    runner: RunnerLimits | None,
    control: CallControl | None,
    track: Callable[[subprocess.Popen[bytes], bool], None],
) -> ExecResult:
    """Run ``argv``; ``runner``: under the runner's contract. ``track(process, True)`` is called once it runs and
    ``track(process, False)`` once it is gone, so that a restart or removal of the container can end it."""
    started = time.monotonic()
    process = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(environment),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
    track(process, True)
    try:
        return _relay(process, started, caps, deadline_s, runner, control)
    finally:
        end_group(process)  # the run's sweep: nothing of its session outlives it
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        track(process, False)


class _Streams:
    """What a run printed: at most ``keep`` bytes of each stream, and how many were seen."""

    def __init__(self, keep: tuple[int, int]) -> None:
        self.keep = keep
        self.data = (bytearray(), bytearray())
        self.seen = [0, 0]

    def add(self, index: int, chunk: bytes) -> None:
        self.seen[index] += len(chunk)
        room = self.keep[index] - len(self.data[index])
        if room > 0:
            self.data[index].extend(chunk[:room])


class _Pipes:
    """The run's two pipes, read without blocking until each reaches its end."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._selector = selectors.DefaultSelector()
        self.open: dict[int, int] = {}  # descriptor: stream index
        for index, pipe in enumerate((process.stdout, process.stderr)):
            if pipe is not None:
                os.set_blocking(pipe.fileno(), False)
                self._selector.register(pipe.fileno(), selectors.EVENT_READ)
                self.open[pipe.fileno()] = index

    def read(self, streams: _Streams, limits: tuple[int, int], wait_s: float) -> int | None:
        """Read what is ready within ``wait_s``; the index of a stream that passed its limit, else None."""
        for key, _ in self._selector.select(timeout=wait_s):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                self._selector.unregister(key.fd)
                del self.open[key.fd]
                continue
            index = self.open[key.fd]
            streams.add(index, chunk)
            if streams.seen[index] > limits[index]:
                return index
        return None

    def close(self) -> None:
        self._selector.close()


def _relay(
    process: subprocess.Popen[bytes],
    started: float,
    caps: tuple[int, int],
    deadline_s: float,
    runner: RunnerLimits | None,
    control: CallControl | None,
) -> ExecResult:
    # the runner passes on at most cap + 1 bytes of a stream; without it the host's own caps apply
    limits = (runner.stdout_max_bytes, runner.stderr_max_bytes) if runner else caps
    streams = _Streams((min(limits[0] + 1, caps[0]), min(limits[1] + 1, caps[1])) if runner else caps)
    caller = Caller(control, started, deadline_s, lambda: end_group(process)) if control else None
    pipes = _Pipes(process)
    host_deadline = started + deadline_s
    run_deadline = started + runner.timeout_s if runner else float("inf")
    cancelled = False
    outcome: Literal["exited", "timeout", "cap", "deadline"] = "exited"
    over: int | None = None
    try:
        while pipes.open or process.poll() is None:
            now = time.monotonic()
            if caller is not None and not cancelled and caller.cancelled():
                cancelled = True
                caller.end_all()
                host_deadline = min(host_deadline, now + _CANCEL_DRAIN_S)
            elif caller is not None and not cancelled:
                caller.pace(sum(streams.seen))
            if now >= min(host_deadline, run_deadline if not cancelled else host_deadline):
                outcome = "timeout" if now >= run_deadline and not cancelled else "deadline"
                break
            wait_s = min(_WAKE_S, max(host_deadline - now, 0.01))
            if not pipes.open:  # the output is read to its end: wait for the exit, a little at a time
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=wait_s)
                continue
            over = pipes.read(streams, limits, wait_s)
            if over is not None:
                outcome = "cap"
                break
            if process.poll() is not None and pipes.open:
                end_group(process)  # the script ended: a process it left holding the pipes must not keep them open
    finally:
        pipes.close()
    return _result(process, started, streams, outcome, over, runner, cancelled)


def _result(
    process: subprocess.Popen[bytes],
    started: float,
    streams: _Streams,
    outcome: Literal["exited", "timeout", "cap", "deadline"],
    over: int | None,
    runner: RunnerLimits | None,
    cancelled: bool,
) -> ExecResult:
    stream_name: Literal["stdout", "stderr"] | None = None if over is None else ("stdout", "stderr")[over]
    exit_code: int | None
    verdict_line = b""
    if outcome == "timeout" and runner is not None:
        end_group(process, signal.SIGTERM)  # then SIGKILL after the grace, as the run ends (run_command)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=runner.grace_s)
        exit_code, verdict_line = _TIMEOUT_EXIT, _verdict_line("timeout", _TIMEOUT_EXIT)
    elif outcome == "cap" and runner is not None:
        exit_code, verdict_line = (
            _OUTPUT_LIMIT_EXIT,
            _verdict_line("output_limit", _OUTPUT_LIMIT_EXIT, stream=stream_name),
        )
        stream_name = None  # the runner stopped it: the host's own cap was not passed
    elif outcome in ("cap", "deadline"):
        exit_code = None  # the run's sweep ends it (run_command)
    else:
        code = process.wait()
        exit_code = 128 - code if code < 0 else code
        if runner is not None and not cancelled:
            verdict_line = _verdict_line("exited", exit_code, -code if code < 0 else None)
    if cancelled:
        exit_code, verdict_line = (None if process.poll() is None else 128 + signal.SIGKILL), b""
    stderr = bytes(streams.data[1]) + verdict_line
    seen = (min(streams.seen[0], streams.keep[0]), min(streams.seen[1], streams.keep[1])) if runner else streams.seen
    return ExecResult(
        exit_code=exit_code,
        stdout=bytes(streams.data[0]),
        stderr=stderr,
        stdout_bytes_total=seen[0],
        stderr_bytes_total=seen[1] + len(verdict_line),
        over_cap=stream_name if outcome == "cap" else None,
        deadline_hit=outcome == "deadline",
        cancelled=cancelled,
        duration_s=time.monotonic() - started,
    )
