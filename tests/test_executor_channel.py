"""The host's end of a resident executor believes only what the executor sends: a done frame after ``S``, with
the nonce of the run the host sent; everything else breaks the channel (then the host ends every process of the
run and starts a fresh executor). Played here over a socket pair standing in for Docker's attach stream, with no
engine: the executor's side is written by the test, frame by frame, after it read the host's greeting and request.
The image's own executor is run on this host to show it says ready only once it was greeted.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime.sandbox.backend import RunRequest, ScriptCalls
from sandbox_runtime.sandbox.exec_stream import Watch
from sandbox_runtime.sandbox.executor_channel import Channel, Exchange
from sandbox_runtime.sandbox.fake.executors import executor_path

REQUEST = RunRequest(
    program=("/opt/venv/bin/python", "/mnt/results/s.py"),
    user="10001:10001",
    timeout_s=5,
    grace_s=0,
    deadline_margin_s=15,
    executor_start_timeout_s=30,
    stdout_max_bytes=100,
    stderr_max_bytes=100,
    nproc_max=0,
)
Executor = Callable[[str], list[bytes]]  # the nonce of the request -> the frames the "executor" answers with


def _mux(payload: bytes, stream: int = 1) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


def _frame(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


def _watch() -> Watch:
    return Watch(0, False, lambda: None, lambda: None)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    host, executor = socket.socketpair()
    yield host, executor
    host.close()
    executor.close()


def _exchange(
    pair: tuple[socket.socket, socket.socket], answer: Executor, calls: ScriptCalls | None = None
) -> Exchange:
    host, executor = pair

    greetings: list[object] = []

    def serve() -> None:
        pending = bytearray()

        def line() -> Any:
            while b"\n" not in pending:
                pending.extend(executor.recv(65536))
            taken, _, rest = bytes(pending).partition(b"\n")
            pending[:] = rest
            return json.loads(taken)

        greetings.append(line())  # as the executor does: ready only once the host's first line came
        executor.sendall(_mux(_frame(b"R", b"7")))
        for chunk in answer(line()["nonce"]):
            executor.sendall(chunk)
        executor.shutdown(socket.SHUT_WR)  # the executor's end: its stream ends after its last frame

    thread = threading.Thread(target=serve)
    thread.start()
    channel = Channel(host, "exec-id", ())
    try:
        assert channel.ready(_deadline(), _watch())
        assert (channel.pid, greetings) == (7, [{"op": "hello"}])
        return channel.run(REQUEST, _deadline(), _watch(), None, calls)
    finally:
        thread.join(timeout=10)


def _deadline() -> float:
    return time.monotonic() + 10


def _done(nonce: str, fields: str = "exited 0 - - keep -") -> bytes:
    return _frame(b"D", f"{nonce} {fields}".encode())


def test_a_run_the_executor_sees_through_is_believed(pair: tuple[socket.socket, socket.socket]) -> None:
    def answer(nonce: str) -> list[bytes]:
        return [
            _mux(_frame(b"S", nonce.encode()) + _frame(b"O", b"hello\n")),
            _mux(b"a diagnostic line of the executor's own\n", stream=2),
            _mux(_frame(b"E", b"warn\n") + _done(nonce, "exited 3 - - keep openpyxl,docx")),
        ]

    exchange = _exchange(pair, answer)
    assert exchange.stop == "done"
    assert (exchange.stdout, exchange.stderr, exchange.totals) == (b"hello\n", b"warn\n", (6, 5))
    assert exchange.done is not None
    assert (exchange.done.verdict, exchange.done.exit_code, exchange.done.keep) == ("exited", 3, True)
    assert exchange.done.libraries == ("openpyxl", "docx")  # what the sandbox's next executor loads at once


def test_frames_split_anywhere_across_reads_are_put_back_together(pair: tuple[socket.socket, socket.socket]) -> None:
    def answer(nonce: str) -> list[bytes]:
        stream = _mux(_frame(b"S", nonce.encode()) + _frame(b"O", b"x" * 50) + _done(nonce))
        return [stream[i : i + 3] for i in range(0, len(stream), 3)]

    exchange = _exchange(pair, answer)
    assert (exchange.stop, exchange.stdout) == ("done", b"x" * 50)


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(lambda nonce: [_mux(_frame(b"S", nonce.encode()) + _done("0" * 32))], id="another-nonce"),
        pytest.param(lambda nonce: [_mux(_done(nonce))], id="done-before-started"),
        pytest.param(lambda nonce: [_mux(_frame(b"O", b"early") + _done(nonce))], id="output-before-started"),
        pytest.param(
            lambda nonce: [_mux(_frame(b"S", nonce.encode()) + _frame(b"S", nonce.encode()))], id="second-started"
        ),
        pytest.param(lambda nonce: [_mux(_frame(b"S", nonce.encode()) + _frame(b"X", b""))], id="unknown-kind"),
        pytest.param(lambda nonce: [_mux(b"D" + struct.pack(">I", 1 << 30))], id="oversized-frame"),
        pytest.param(
            lambda nonce: [_mux(_frame(b"S", nonce.encode()) + _done(nonce, "exited 0 - - keep - trailing"))],
            id="done-with-more-fields",
        ),
        pytest.param(
            lambda nonce: [_mux(_frame(b"S", nonce.encode()) + _done(nonce, "exited 0 - - keep ../lib;rm"))],
            id="done-naming-no-library",
        ),
    ],
)
def test_anything_the_executor_does_not_send_breaks_the_channel(
    pair: tuple[socket.socket, socket.socket], forged: Executor
) -> None:
    exchange = _exchange(pair, forged)
    assert exchange.stop == "broken"
    assert exchange.done is None


def test_the_hosts_own_cap_holds_against_an_executor_that_passes_its_cap(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    def answer(nonce: str) -> list[bytes]:
        return [_mux(_frame(b"S", nonce.encode()))] + [_mux(_frame(b"O", b"y" * 60000)) for _ in range(3)]

    exchange = _exchange(pair, answer)
    assert (exchange.stop, exchange.over_cap) == ("cap", "stdout")
    assert len(exchange.stdout) == REQUEST.host_caps[0]


def test_a_stream_that_ends_before_started_says_the_run_never_began(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    exchange = _exchange(pair, lambda nonce: [])
    assert (exchange.stop, exchange.started) == ("eof", False)


class _Calls:
    """The run's tool calls as the host's side answers them: every line kept, each answered ok."""

    line_max_bytes = 1024

    def __init__(self) -> None:
        self.lines: list[bytes | None] = []

    def answer(self, line: bytes | None) -> dict[str, Any]:
        self.lines.append(line)
        return {"ok": True, "result": len(self.lines)}


CALL_LINE = b'{"id": 1, "op": "call", "tool": "note", "arguments": {}}\n'


@pytest.mark.parametrize(
    "end",
    [
        pytest.param(lambda nonce: _done(nonce, "exited 3 - - keep -"), id="the-run-exits"),
        pytest.param(lambda nonce: _frame(b"O", b"z" * (REQUEST.host_caps[0] + 1)), id="the-run-passes-the-hosts-cap"),
    ],
)
def test_a_call_the_run_completed_in_the_same_read_as_its_end_is_made(
    pair: tuple[socket.socket, socket.socket], end: Callable[[str], bytes]
) -> None:
    calls = _Calls()

    def answer(nonce: str) -> list[bytes]:  # one write: the host takes the call and the end in one read
        return [_mux(_frame(b"S", nonce.encode()) + _frame(b"C", CALL_LINE) + end(nonce))]

    exchange = _exchange(pair, answer, calls)
    assert exchange.stop in ("done", "cap")
    assert calls.lines == [CALL_LINE.rstrip(b"\n")]  # made exactly as if the run had waited for its reply


def test_a_call_line_the_run_left_unfinished_at_its_end_is_not_made(pair: tuple[socket.socket, socket.socket]) -> None:
    calls = _Calls()

    def answer(nonce: str) -> list[bytes]:
        return [_mux(_frame(b"S", nonce.encode()) + _frame(b"C", CALL_LINE[:20]) + _done(nonce))]

    exchange = _exchange(pair, answer, calls)
    assert exchange.stop == "done"
    assert calls.lines == []  # no newline: the run never finished writing it


@pytest.mark.process  # the image's executor, run on this host as the fake backend runs it
@pytest.mark.parametrize("first_line", [b"", b'{"op": "run", "nonce": "x"}\n', b"not json\n"])
def test_the_image_executor_says_ready_only_to_the_hosts_greeting_and_ends_at_once_on_anything_else(
    first_line: bytes, tmp_path: Path
) -> None:
    # ready said before the greeting could be lost on Podman's attach stream (containers/podman#25855)
    executor = [sys.executable, "-I", executor_path(), "0", "--session"]  # its sweeps end its own session only
    options: dict[str, Any] = {"capture_output": True, "cwd": tmp_path, "timeout": 60, "start_new_session": True}
    ended = subprocess.run(executor, input=first_line, check=False, **options)
    assert (ended.returncode, ended.stdout) == (0, b"")
    greeted = subprocess.run(executor, input=b'{"op": "hello"}\n', check=True, **options)
    kind, length = struct.unpack(">cI", greeted.stdout[:5])
    assert (kind, greeted.stdout[5 : 5 + length].isdigit()) == (b"R", True)  # then its stdin ended: it exits
