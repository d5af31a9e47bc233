"""The host's end of one resident executor (``_data/images/executor/executor.py``): a long exec with its stdin
attached, requests written to it as lines, its frames read from its stdout inside Docker's attach stream.

The executor's docstring has the protocol and why a run cannot forge what the host is told: the host makes a
fresh nonce for every run, believes ``D`` (done) only with that nonce after ``S`` (started) with it, and takes
anything else on the channel (an unknown or oversized frame, a nonce it did not send, a second ``S``) for a
broken channel, which is then ended. No engine client here: the engine's side comes in as a socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import select
import struct
import time
from typing import Any, Literal, NamedTuple

from sandbox_runtime.sandbox.backend import RunRequest
from sandbox_runtime.sandbox.exec_stream import Caller, Demux, Watch

__all__ = ["Channel", "Done", "Exchange"]

_FRAME = struct.Struct(">cI")
_FRAME_MAX_BYTES = 1 << 17  # the executor's largest frame is one read of 64 KiB
_DIAGNOSTICS_MAX_BYTES = 8192  # what the executor itself writes on its stderr, kept for the log
_STDOUT, _STDERR = 1, 2
_WATCH_INTERVAL_S = 0.2
_CANCEL_WAIT_S = 2.0  # a cancel the executor does not answer in this time is done by ending every process
_DONE = re.compile(
    rb"(?P<nonce>[0-9a-f]{32}) (?P<verdict>exited|timeout|output_limit|not_started|left_running|cancelled) "
    rb"(?P<exit>\d{1,3}) (?P<signal>\d{1,2}|-) (?P<stream>stdout|stderr|-) (?P<keep>keep|end)\Z"
)

Stop = Literal["done", "eof", "cap", "deadline", "died", "broken"]


class Done(NamedTuple):
    """The executor's ``D``: how it says the run ended, and whether it goes on."""

    verdict: str
    exit_code: int
    signal: int | None
    stream: Literal["stdout", "stderr"] | None
    keep: bool


class Exchange(NamedTuple):
    """What one run over the channel came to."""

    started: bool  # the executor said ``S``: the run may have begun
    done: Done | None
    stdout: bytes
    stderr: bytes
    totals: tuple[int, int]
    over_cap: Literal["stdout", "stderr"] | None  # the host's own backstop cut the stream
    stop: Stop
    cancelled: bool  # the caller cancelled (the cancel was sent)


class _Broken(Exception):
    """The channel carried something the executor does not send."""


class Channel:
    """One resident executor, reached through ``stream`` (the exec's attach stream, stdin included: a socket, or
    the engine client's wrapper of one)."""

    def __init__(self, stream: Any, exec_id: str, key: tuple[object, ...]) -> None:
        self._stream = stream
        self._sock = getattr(stream, "_sock", stream)
        self._fd = self._sock.fileno()
        self.exec_id = exec_id
        self.key = key
        self.pid: int | None = None
        self.last_used = time.monotonic()
        self.busy = False
        self._demux = Demux()
        self._inner = bytearray()
        self.diagnostics = bytearray()

    def ready(self, deadline: float, watch: Watch) -> bool:
        """Wait for the executor's ``R``; False when the stream ended (or the sandbox did) before it."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (watch.due() and not watch.sample()):
                return False
            try:
                frames = self._read(min(left, _WATCH_INTERVAL_S))
            except _Broken:
                return False
            if frames is None:
                return False
            for kind, payload in frames:
                if kind != b"R" or not payload.isdigit():
                    return False
                self.pid = int(payload)
                return True

    def run(self, request: RunRequest, deadline: float, watch: Watch, caller: Caller | None) -> Exchange:
        """Send one run and read it through: until ``D``, the end of the stream, the host's cap or deadline, the
        sandbox's end, or a broken channel. With a caller, its cancel is sent on and its progress reported."""
        nonce = secrets.token_hex(16)
        line = {
            "op": "run",
            "nonce": nonce,
            "argv": list(request.program),
            "cwd": request.working_dir,
            "timeout_s": request.timeout_s,
            "grace_s": request.grace_s,
            "caps": [request.stdout_max_bytes, request.stderr_max_bytes],
        }
        caps = request.host_caps
        state = _Reading(nonce, caps)
        if not self._send(line):
            return state.exchange("eof")
        while True:
            if caller is not None and not state.cancelled:
                if caller.cancelled():
                    state.cancelled = True
                    self._send({"op": "cancel", "nonce": nonce})
                    deadline = min(deadline, time.monotonic() + _CANCEL_WAIT_S)
                else:
                    caller.pace(state.totals[0] + state.totals[1])
            left = deadline - time.monotonic()
            if left <= 0:
                return state.exchange("deadline")
            if watch.due() and not watch.sample():
                return state.exchange("died")
            try:
                frames = self._read(min(left, _WATCH_INTERVAL_S))
                if frames is None:
                    return state.exchange("eof")
                for kind, payload in frames:
                    stop = state.take(kind, payload)
                    if stop is not None:
                        self.last_used = time.monotonic()
                        return state.exchange(stop)
            except _Broken:
                return state.exchange("broken")

    def _send(self, message: dict[str, object]) -> bool:
        try:
            self._sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            return False
        return True

    def _read(self, timeout_s: float) -> list[tuple[bytes, bytes]] | None:
        """The executor's frames that arrived within ``timeout_s`` (maybe none); None at the end of the stream."""
        ready, _, _ = select.select([self._fd], [], [], timeout_s)
        if not ready:
            return []
        chunk = os.read(self._fd, 65536)
        if not chunk:
            return None
        for stream, payload in self._demux.feed(chunk):
            if stream == _STDOUT:
                self._inner += payload
            elif stream == _STDERR and len(self.diagnostics) < _DIAGNOSTICS_MAX_BYTES:
                self.diagnostics += payload[: _DIAGNOSTICS_MAX_BYTES - len(self.diagnostics)]
        frames: list[tuple[bytes, bytes]] = []
        while len(self._inner) >= _FRAME.size:
            kind, size = _FRAME.unpack_from(self._inner)
            if size > _FRAME_MAX_BYTES:
                raise _Broken(f"a frame of {size} bytes")
            if len(self._inner) < _FRAME.size + size:
                break
            frames.append((kind, bytes(self._inner[_FRAME.size : _FRAME.size + size])))
            del self._inner[: _FRAME.size + size]
        return frames

    def close(self) -> None:
        """End the channel: the executor sees its stdin end and exits (its spare with it)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(2)
        for handle in (self._stream, self._sock):
            with contextlib.suppress(OSError):
                handle.close()


class _Reading:
    """One run's frames as they arrive: its output (capped) and the check of every frame against the nonce."""

    def __init__(self, nonce: str, caps: tuple[int, int]) -> None:
        self.nonce = nonce.encode()
        self.caps = caps
        self.started = False
        self.done: Done | None = None
        self.out = (bytearray(), bytearray())
        self.totals = [0, 0]
        self.over_cap: Literal["stdout", "stderr"] | None = None
        self.cancelled = False

    def take(self, kind: bytes, payload: bytes) -> Stop | None:
        """Take one frame; the stop it makes, if any. A frame the executor does not send raises _Broken."""
        if kind == b"S" and not self.started and payload == self.nonce:
            self.started = True
            return None
        if kind in (b"O", b"E") and self.started:
            index = 0 if kind == b"O" else 1
            self.totals[index] += len(payload)
            room = self.caps[index] - len(self.out[index])
            self.out[index].extend(payload[: max(room, 0)])
            if self.totals[index] > self.caps[index]:
                self.over_cap = "stdout" if index == 0 else "stderr"
                return "cap"
            return None
        if kind == b"D" and self.started:
            match = _DONE.fullmatch(payload)
            if match is None or match["nonce"] != self.nonce:
                raise _Broken("a done frame that is not the executor's")
            self.done = Done(
                verdict=match["verdict"].decode(),
                exit_code=int(match["exit"]),
                signal=None if match["signal"] == b"-" else int(match["signal"]),
                stream=None if match["stream"] == b"-" else "stdout" if match["stream"] == b"stdout" else "stderr",
                keep=match["keep"] == b"keep",
            )
            return "done"
        raise _Broken(f"an unexpected {kind!r} frame")

    def exchange(self, stop: Stop) -> Exchange:
        return Exchange(
            started=self.started,
            done=self.done,
            stdout=bytes(self.out[0]),
            stderr=bytes(self.out[1]),
            totals=(self.totals[0], self.totals[1]),
            over_cap=self.over_cap,
            stop=stop,
            cancelled=self.cancelled,
        )
