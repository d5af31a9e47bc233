"""The host's end of one resident executor (``_data/images/executor/executor.py``): a long exec with its stdin
attached, requests written to it as lines, its frames read from its stdout: inside Docker's attach stream
(``muxed``: stdout and stderr interleaved under 8-byte headers), or as a plain stream of its stdout alone.

The executor's docstring has the protocol and why a run cannot forge what the host is told: the host makes a
fresh nonce for every run, believes ``D`` (done) only with that nonce after ``S`` (started) with it, and takes
anything else on the channel (an unknown or oversized frame, a nonce it did not send, a second ``S``) for a
broken channel, which is then ended. No engine client here: the engine's side comes in as a socket.

A run's tool calls come as ``C`` frames: the bytes the run wrote on its call pipe, one JSON line per call. Each
line is handed to the run's :class:`~sandbox_runtime.sandbox.backend.ScriptCalls` as it is complete (a line over
its ``line_max_bytes`` is not kept: it is answered as too long), in this thread, while the run's deadline stands
still; the answer goes back as a ``reply`` line, written without blocking (the executor may be busy writing the
run's output, which this loop goes on reading). A reply the executor cannot take in time ends the channel.
Every line the run completed before its end (``D``, or the host's output cap) is answered, however the frames
fell into reads: a call the run sent and did not wait for is made all the same (the executor drops a reply that
comes after its run). Only a broken channel answers nothing more.
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

from sandbox_runtime.sandbox.backend import CommandStreams, OutputSink, RunRequest, ScriptCalls
from sandbox_runtime.sandbox.channel_outbox import InputFeed, Outbox, OutboxBroken
from sandbox_runtime.sandbox.exec_stream import Caller, Demux, Watch

__all__ = ["Channel", "Done", "Exchange"]

_FRAME = struct.Struct(">cI")
_FRAME_MAX_BYTES = 1 << 17  # the executor's largest frame is one read of 64 KiB
_DIAGNOSTICS_MAX_BYTES = 8192  # what the executor itself writes on its stderr, kept for the log
_STDOUT, _STDERR = 1, 2
_WATCH_INTERVAL_S = 0.2
_GREETING = b'{"op": "hello"}\n'  # the host's first line; the executor says R only once it has read it
_CANCEL_WAIT_S = 2.0  # a cancel the executor does not answer in this time is done by ending every process
_FLUSH_WAIT_S = 5.0  # the rest of a reply already begun, sent after the run's end (the next request follows it)
_UNANSWERED_LINE_MAX_BYTES = 4096  # with no ScriptCalls, a call line is not read, only answered
_NO_CALLS: dict[str, object] = {
    "ok": False,
    "error": "unavailable",
    "message": "tool calls cannot be made from this run (the host gave it none)",
}
_DONE = re.compile(
    rb"(?P<nonce>[0-9a-f]{32}) (?P<verdict>exited|timeout|output_limit|not_started|left_running|cancelled) "
    rb"(?P<exit>\d{1,3}) (?P<signal>\d{1,2}|-) (?P<stream>stdout|stderr|-) (?P<keep>keep|end) "
    rb"(?P<libraries>[A-Za-z_]{1,32}(?:,[A-Za-z_]{1,32}){0,15}|-)\Z"
)

Stop = Literal["done", "eof", "cap", "deadline", "died", "broken"]


class Done(NamedTuple):
    """The executor's ``D``: how it says the run ended, and whether it goes on."""

    verdict: str
    exit_code: int
    signal: int | None
    stream: Literal["stdout", "stderr"] | None
    keep: bool
    libraries: tuple[str, ...] = ()  # the office libraries the executor loads for the runs after this one


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
    input_error: Exception | None = None  # the command's input source raised: the run was cancelled
    output_error: Exception | None = None  # the command's output sink raised: the run was cancelled


class _Broken(Exception):
    """The channel carried something the executor does not send."""


class Channel:
    """One resident executor, reached through ``stream`` (the exec's attach stream, stdin included: a socket, or
    the engine client's wrapper of one; ``muxed``: in Docker's framing, else the executor's stdout as it is)."""

    def __init__(self, stream: Any, exec_id: str, key: tuple[object, ...], *, muxed: bool = True) -> None:
        self._stream = stream
        self._sock = getattr(stream, "_sock", stream)
        self._fd = self._sock.fileno()
        # every write goes through an Outbox, never blocking this loop (a socket with a timeout would wait in
        # send() for room while the executor waits for its output to be read)
        os.set_blocking(self._fd, False)
        self.exec_id = exec_id
        self.key = key
        self.pid: int | None = None
        self.last_used = time.monotonic()
        self.busy = False
        self._demux = Demux() if muxed else None
        self._inner = bytearray()
        self.diagnostics = bytearray()
        self.silent = True  # nothing at all came over the stream yet

    def ready(self, deadline: float, watch: Watch) -> bool:
        """Greet the executor and wait for its ``R`` (sent once it has read the greeting: see the executor's
        docstring); False when the stream ended (or the sandbox did) before it."""
        try:
            os.write(self._fd, _GREETING)  # a few bytes into the fresh stream's empty buffer: written whole
        except OSError:
            return False
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

    def run(
        self,
        request: RunRequest,
        deadline: float,
        watch: Watch,
        caller: Caller | None,
        calls: ScriptCalls | None = None,
        streams: CommandStreams | None = None,
    ) -> Exchange:
        """Send one run and read it through: until ``D``, the end of the stream, the host's cap or deadline, the
        sandbox's end, or a broken channel. With a caller, its cancel is sent on and its progress reported;
        ``calls`` answers the run's tool calls (the deadline moves on by the time each answer took); a command
        that reads input gets ``streams.stdin``'s chunks once the executor has started it (none are read before),
        and ``streams.stdout`` takes its output as it comes. A source or a sink that raises cancels the run."""
        nonce = secrets.token_hex(16)
        line: dict[str, object] = {
            "op": "run",
            "nonce": nonce,
            "argv": list(request.program),
            "cwd": request.working_dir,
            "timeout_s": request.timeout_s,
            "grace_s": request.grace_s,
            "caps": [request.stdout_max_bytes, request.stderr_max_bytes],
        }
        if request.command:
            line.update(command=True, env=request.command_environment, stdin=request.with_input)
        streams = streams or CommandStreams()
        feed = InputFeed(nonce, streams.stdin or iter(())) if request.with_input else None
        caps = request.host_caps
        line_max_bytes = _UNANSWERED_LINE_MAX_BYTES if calls is None else calls.line_max_bytes
        state = _Reading(nonce, caps, line_max_bytes, streams.stdout)
        outbox = Outbox(self._fd)
        try:
            outbox.add(json.dumps(line).encode() + b"\n")
        except OutboxBroken:
            return state.exchange("eof")
        while True:
            try:
                if not state.cancelled and (
                    (caller is not None and caller.cancelled())
                    or (feed is not None and feed.error is not None)
                    or state.sink_error is not None
                ):
                    state.cancelled = True
                    outbox.drop_input()  # a cancelled command needs no more input; the cancel goes next
                    outbox.add(json.dumps({"op": "cancel", "nonce": nonce}).encode() + b"\n")
                    deadline = min(deadline, time.monotonic() + _CANCEL_WAIT_S)
                elif caller is not None and not state.cancelled:
                    caller.pace(state.totals[0] + state.totals[1])
                left = deadline - time.monotonic()
                if left <= 0:
                    return state.exchange("deadline", feed)
                if watch.due() and not watch.sample():
                    return state.exchange("died", feed)
                if feed is not None and state.started and not state.cancelled:
                    feed.top_up(outbox)
                wants_room = feed is not None and state.started and not feed.ended and not state.cancelled
                frames = self._read(min(left, _WATCH_INTERVAL_S), outbox, wants_room)
                if frames is None:
                    return state.exchange("eof", feed)
                stop = state.take_all(frames)
                # the call lines the run completed before its end are made as if it had waited for them, whether
                # the end came in a later read or in this one
                deadline += self._answer(state, outbox, calls)
                if stop is not None:
                    self.last_used = time.monotonic()
                    outbox.drop_input()  # the executor drops input lines between runs: only the one begun goes
                    if not outbox.flush(_FLUSH_WAIT_S) and state.done is not None:
                        state.done = state.done._replace(keep=False)  # a reply cut short: not reused
                    return state.exchange(stop, feed)
            except (_Broken, OutboxBroken):
                return state.exchange("broken", feed)

    def _answer(self, state: _Reading, outbox: Outbox, calls: ScriptCalls | None) -> float:
        """Answer the call lines that are complete; the seconds that took (the run's clock stood still)."""
        began = time.monotonic()
        for line in state.take_lines():
            body = _NO_CALLS if calls is None else calls.answer(line)
            outbox.add(json.dumps({"op": "reply", "nonce": state.nonce.decode(), "body": body}).encode() + b"\n")
        return time.monotonic() - began

    def _read(
        self, timeout_s: float, outbox: Outbox | None = None, wants_room: bool = False
    ) -> list[tuple[bytes, bytes]] | None:
        """The executor's frames that arrived within ``timeout_s`` (maybe none); None at the end of the stream.
        Meanwhile what ``outbox`` holds is written as the executor takes it; ``wants_room``: the wait also ends
        when the executor could take more (a command's input is being fed)."""
        sending = [self._fd] if outbox is not None and (outbox.pending or wants_room) else []
        ready, writable, _ = select.select([self._fd], sending, [], timeout_s)
        if writable and outbox is not None:
            outbox.send_some()
        if not ready:
            return []
        chunk = os.read(self._fd, 65536)
        if not chunk:
            return None
        self.silent = False
        for stream, payload in self._demux.feed(chunk) if self._demux is not None else [(_STDOUT, chunk)]:
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
    """One run's frames as they arrive: its output (capped), its tool call lines, and the check of every frame
    against the nonce."""

    def __init__(self, nonce: str, caps: tuple[int, int], line_max_bytes: int, sink: OutputSink | None = None) -> None:
        self.nonce = nonce.encode()
        self.caps = caps
        self.sink = sink  # takes stdout in place of ``out[0]``
        self.sink_error: Exception | None = None
        self.line_max_bytes = line_max_bytes
        self._line = bytearray()
        self._line_over = False
        self._lines: list[bytes | None] = []
        self.started = False
        self.done: Done | None = None
        self.out = (bytearray(), bytearray())
        self.kept = [0, 0]  # bytes of each stream kept (or given to the sink), within the cap
        self.totals = [0, 0]
        self.over_cap: Literal["stdout", "stderr"] | None = None
        self.cancelled = False

    def take_all(self, frames: list[tuple[bytes, bytes]]) -> Stop | None:
        """Take frames in order up to the first that makes a stop (the rest of the read is not the run's); that
        stop, if any."""
        for kind, payload in frames:
            stop = self.take(kind, payload)
            if stop is not None:
                return stop
        return None

    def take(self, kind: bytes, payload: bytes) -> Stop | None:
        """Take one frame; the stop it makes, if any. A frame the executor does not send raises _Broken."""
        if kind == b"S" and not self.started and payload == self.nonce:
            self.started = True
            return None
        if kind in (b"O", b"E") and self.started:
            index = 0 if kind == b"O" else 1
            self.totals[index] += len(payload)
            kept = payload[: max(self.caps[index] - self.kept[index], 0)]
            self.kept[index] += len(kept)
            if index == 0 and self.sink is not None:
                self._to_sink(self.sink, kept)
            else:
                self.out[index].extend(kept)
            if self.totals[index] > self.caps[index]:
                self.over_cap = "stdout" if index == 0 else "stderr"
                return "cap"
            return None
        if kind == b"C" and self.started:
            self._take_call_bytes(payload)
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
                libraries=() if match["libraries"] == b"-" else tuple(match["libraries"].decode().split(",")),
            )
            return "done"
        raise _Broken(f"an unexpected {kind!r} frame")

    def _to_sink(self, sink: OutputSink, piece: bytes) -> None:
        """Give ``piece`` to the sink; once it raised, the rest is dropped (the run is being cancelled for it)."""
        if self.sink_error is not None or not piece:
            return
        try:
            sink(piece)
        except Exception as exc:  # the caller's sink failed: its error goes back to the caller
            self.sink_error = exc

    def _take_call_bytes(self, payload: bytes) -> None:
        """Collect call lines; one longer than ``line_max_bytes`` is dropped as it comes, its end kept as None."""
        while True:
            head, newline, payload = payload.partition(b"\n")
            if not self._line_over:
                if len(self._line) + len(head) > self.line_max_bytes:
                    self._line_over = True
                    self._line.clear()
                else:
                    self._line += head
            if not newline:
                return
            self._lines.append(None if self._line_over else bytes(self._line))
            self._line.clear()
            self._line_over = False

    def take_lines(self) -> list[bytes | None]:
        """The call lines complete since the last time (None for one that was too long)."""
        lines, self._lines = self._lines, []
        return lines

    def exchange(self, stop: Stop, feed: InputFeed | None = None) -> Exchange:
        return Exchange(
            started=self.started,
            done=self.done,
            stdout=bytes(self.out[0]),
            stderr=bytes(self.out[1]),
            totals=(self.totals[0], self.totals[1]),
            over_cap=self.over_cap,
            stop=stop,
            cancelled=self.cancelled,
            input_error=None if feed is None else feed.error,
            output_error=self.sink_error,
        )
