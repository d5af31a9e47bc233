"""What the suite's parallel workers (pytest-xdist, ``-n``) share, and how they take turns with it.

Each worker is a pytest session of its own: its own session label (so it removes only its own containers), its own
PostgreSQL server on a free port, its own temporary folder. One thing is shared by every worker of a run, and taken
in turn through a lock in the run's temporary root (:func:`run_folder`):

- **building the executor image**: one worker builds it, the others wait and then find it (:func:`one_at_a_time`);
- nothing else: servers listen on ports the system chooses, every folder is a temporary one, and the engines are
  used side by side: no test stops or restarts the machine's engines. The tests that restart an engine service
  restart one of their own (a private dockerd, a private Podman service: tests/engine_services.py), which no other
  test uses, so no module waits for another.

Without xdist the same lock is taken by the one session, uncontended.

The suite's longest tests (marked ``first``) are handed out before the rest, so that none of them is still running
alone at the end of the run while the other workers have nothing left to do. The module holds no ``assert``, so
pytest need not rewrite it (PYTEST_DONT_REWRITE).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["one_at_a_time", "pytest_collection_modifyitems", "run_folder"]


def run_folder(temp: pytest.TempPathFactory) -> Path:
    """A folder every worker of this run shares: the run's temporary root (a worker's own folder is below it)."""
    own = temp.getbasetemp()
    return own.parent if os.environ.get("PYTEST_XDIST_WORKER") else own


@contextlib.contextmanager
def one_at_a_time(temp: pytest.TempPathFactory, name: str) -> Iterator[None]:
    """The block runs in one worker at a time, across the run (an exclusive lock, ``name``, in the run's folder;
    the system drops it if the process dies)."""
    with (run_folder(temp) / f"{name}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.hookimpl(trylast=True)  # after pytest's own ordering and -m's selection
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``first`` at the front, the rest in their order (every worker collects the same order)."""
    items.sort(key=lambda item: item.get_closest_marker("first") is None)
