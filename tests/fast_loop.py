"""The fast loop: the tests that need no engine, no database and no process of their own, for a contributor's
edit-and-check round (``pytest -m fast``, about a minute on two cores; docs/how-to/contributing.md).

A test is *fast* unless it is marked ``docker``, ``podman`` or ``postgresql`` (conftest.py marks those by their
fixtures), or ``process``: it starts a process of its own — ``sandbox-runtime``'s command or server, an MCP client
or upstream server, a tool such as ruff, mypy, promtool or mkdocs, or a Python interpreter running a script of the
test's. What the package itself starts (on the fake backend the image's executor and runner run as host processes;
a quota volume is made with ``mkfs.ext4``, ``mount`` and ``losetup``) is the code under test and keeps a test fast:
a process counts as the test's own when no code of the package is on the stack that starts it.

The marker is kept true: a test that is neither marked ``process`` nor an engine or database test, yet starts such
a process, fails and says what to mark. The module holds no ``assert``, so pytest need not rewrite it
(PYTEST_DONT_REWRITE).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import sandbox_runtime

__all__ = ["SLOW_MARKERS", "mark_fast"]

SLOW_MARKERS = ("docker", "podman", "postgresql", "process")
_PACKAGE = Path(sandbox_runtime.__file__).parent


def mark_fast(items: list[pytest.Item]) -> None:
    """Mark every test that none of the slow markers names ``fast`` (conftest.py calls it once it has marked the
    engine tests, before ``-m`` selects)."""
    for item in items:
        if not any(item.get_closest_marker(marker) for marker in SLOW_MARKERS):
            item.add_marker(pytest.mark.fast)


def _started_by_the_product() -> bool:
    """Whether the process being started is the product's own: code of the package is on the stack."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if Path(frame.f_code.co_filename).is_relative_to(_PACKAGE):
            return True
        frame = frame.f_back
    return False


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fast test that starts a process of its own fails, naming the marker it lacks."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    started = subprocess.Popen.__init__

    def refusing(process: subprocess.Popen[Any], args: Any, *rest: Any, **options: Any) -> None:
        if not _started_by_the_product():
            argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
            shown = [os.fsdecode(part)[:60] for part in argv[:3]]
            raise pytest.fail.Exception(
                f"{request.node.nodeid} starts {shown}: mark it @pytest.mark.process (tests/fast_loop.py)"
            )
        started(process, args, *rest, **options)

    monkeypatch.setattr(subprocess.Popen, "__init__", refusing)
    yield
