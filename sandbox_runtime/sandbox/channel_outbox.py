"""What the host writes to a resident executor while a run goes on (:mod:`~sandbox_runtime.sandbox.executor_channel`):
whole lines, written as the executor takes them, never blocking the loop that reads the run's frames.

Three kinds of line go this way: replies to the run's tool calls, the caller's cancel, and a command's input
(``input`` lines: the caller's bytes in base64, then the end). A line is never cut by another: a cancel goes right
after the line being written (the input not yet begun is dropped, a cancelled command needs none), and when the run
ends the input not yet begun is dropped too (the executor drops input lines between runs; only the line being
written is finished, so the next request starts on a line of its own). Replies are never dropped.

The input is read from the caller's chunks only as the executor takes it: at most :data:`INPUT_AHEAD_BYTES` wait
here, so a command's input of any size is never held whole on the host.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import select
import time

from sandbox_runtime.sandbox.backend import CommandInput

__all__ = ["INPUT_AHEAD_BYTES", "InputFeed", "Outbox", "OutboxBroken"]

OUTBOX_MAX_BYTES = 16 << 20  # replies the executor has not taken in: more means it no longer reads its stdin
INPUT_AHEAD_BYTES = 256 << 10  # input lines waiting for the executor to take them
_INPUT_PIECE_BYTES = 48 << 10  # the caller's bytes per input line (64 KiB of base64)


class OutboxBroken(Exception):
    """A line could not be written (the executor's end is closed), or the executor no longer takes them in."""


class Outbox:
    """Lines on their way to the executor over ``fd`` (a socket's, non-blocking)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lines: collections.deque[tuple[bytes, bool]] = collections.deque()  # (line, is input)
        self._sent = 0  # bytes of the first line already written
        self._bytes = 0
        self.input_bytes = 0

    @property
    def pending(self) -> bool:
        return bool(self._lines)

    def add(self, line: bytes, *, is_input: bool = False) -> None:
        """Queue a whole line (ending in a newline) and write what the executor takes now."""
        self._lines.append((line, is_input))
        self._bytes += len(line)
        self.input_bytes += len(line) if is_input else 0
        if self._bytes > OUTBOX_MAX_BYTES:
            raise OutboxBroken("the executor does not take its lines in")
        self.send_some()

    def drop_input(self) -> None:
        """Drop the input lines not begun (the one being written is finished)."""
        kept: collections.deque[tuple[bytes, bool]] = collections.deque()
        for index, (line, is_input) in enumerate(self._lines):
            if is_input and not (index == 0 and self._sent):
                self._bytes -= len(line)
                self.input_bytes -= len(line)
            else:
                kept.append((line, is_input))
        self._lines = kept

    def send_some(self) -> None:
        while self._lines:
            line, is_input = self._lines[0]
            try:
                sent = os.write(self._fd, line[self._sent :])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise OutboxBroken(f"a line could not be sent: {exc}") from exc
            self._sent += sent
            self._bytes -= sent
            self.input_bytes -= sent if is_input else 0
            if self._sent < len(line):
                return
            self._lines.popleft()
            self._sent = 0

    def flush(self, timeout_s: float) -> bool:
        """Send the rest within ``timeout_s``; False when it could not be."""
        end = time.monotonic() + timeout_s
        while self._lines:
            left = end - time.monotonic()
            if left <= 0:
                return False
            _, writable, _ = select.select([], [self._fd], [], left)
            if writable:
                try:
                    self.send_some()
                except OutboxBroken:
                    return False
        return True


class InputFeed:
    """A command's input for one run: the caller's chunks turned into ``input`` lines as the outbox has room.

    A source that raises ends the feeding; the error is kept (:attr:`error`) for the caller, and the run is then
    cancelled by the channel (a command must not go on with part of its input taken for the whole)."""

    def __init__(self, nonce: str, chunks: CommandInput) -> None:
        self._nonce = nonce
        self._chunks = chunks
        self._rest = memoryview(b"")  # what is left of the chunk being sent (a view: never copied whole again)
        self.ended = False
        self.error: Exception | None = None

    def top_up(self, outbox: Outbox) -> None:
        """Add input lines while fewer than INPUT_AHEAD_BYTES wait; the end line once the chunks are over."""
        while not self.ended and outbox.input_bytes < INPUT_AHEAD_BYTES:
            if not self._rest:
                try:
                    self._rest = memoryview(next(self._chunks))
                except StopIteration:
                    self.ended = True
                    outbox.add(self._line({"end": True}), is_input=True)
                    return
                except Exception as exc:  # the caller's source failed: its error goes back to the caller
                    self.ended, self.error = True, exc
                    return
                continue
            piece, self._rest = self._rest[:_INPUT_PIECE_BYTES], self._rest[_INPUT_PIECE_BYTES:]
            outbox.add(self._line({"data": base64.b64encode(piece).decode("ascii")}), is_input=True)

    def _line(self, body: dict[str, object]) -> bytes:
        return json.dumps({"op": "input", "nonce": self._nonce, **body}).encode() + b"\n"
