"""What the command says on stderr comes in whole lines, however busy its other threads are: a supervisor (or a
test) that reads ``serving MCP at URL`` gets the URL, not the URL with another thread's log record glued to it."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator

import pytest

from sandbox_runtime.cli.common import say

SAID_COUNT = 2_000


@pytest.fixture
def threads_switch_often() -> Iterator[None]:
    """The interpreter hands the lock between threads every microsecond (not every 5 ms), so two writes that
    can be split are split within the test's few thousand lines."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_a_line_said_while_another_thread_logs_is_never_split(
    threads_switch_often: None, capfd: pytest.CaptureFixture[str]
) -> None:
    handler = logging.StreamHandler(sys.stderr)  # the records of the runtime's threads, on the same stderr
    logger = logging.getLogger("tests.cli_lines")
    logger.addHandler(handler)
    logger.propagate = False
    stop = threading.Event()

    def log_meanwhile() -> None:
        while not stop.is_set():
            logger.warning("a record of another thread")

    other = threading.Thread(target=log_meanwhile)
    other.start()
    try:
        for n in range(SAID_COUNT):
            say(f"serving MCP at http://127.0.0.1:{n}/mcp")
    finally:
        stop.set()
        other.join(timeout=10)
        logger.removeHandler(handler)
    lines = capfd.readouterr().err.splitlines()
    said = [line for line in lines if line.startswith("serving MCP at ")]
    assert said == [f"serving MCP at http://127.0.0.1:{n}/mcp" for n in range(SAID_COUNT)]
    assert set(lines) - set(said) <= {"a record of another thread"}
