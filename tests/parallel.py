"""What the suite's parallel workers (pytest-xdist, ``-n``) share, and how they take turns with it.

Each worker is a pytest session of its own: its own session label (so it removes only its own containers), its own
PostgreSQL server on a free port, its own temporary folder. Two things are shared by every worker of a run, and
taken in turn through locks in the run's temporary root (:func:`run_folder`):

- **building the executor image**: one worker builds it, the others wait and then find it (:func:`one_at_a_time`);
- **the engines, against their restart**: a test module that stops and starts an engine service (marked
  ``engine_restart``) holds the engines alone, every other engine-using module holds them shared. A module holds its
  turn from its first test to its last (a module's runtime may keep sandboxes between its tests), and a module
  waiting to restart an engine goes before any module that asks after it (the gate), so it is never starved;
- nothing else: servers listen on ports the system chooses, every folder is a temporary one.

Without xdist the same locks are taken by the one session, uncontended. The module holds no ``assert``, so pytest
need not rewrite it (PYTEST_DONT_REWRITE): naming it as a plugin after conftest imported it is then no error.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["one_at_a_time", "run_folder"]

ENGINE_MARKERS = ("docker", "podman")


def run_folder(temp: pytest.TempPathFactory) -> Path:
    """A folder every worker of this run shares: the run's temporary root (a worker's own folder is below it)."""
    own = temp.getbasetemp()
    return own.parent if os.environ.get("PYTEST_XDIST_WORKER") else own


@contextlib.contextmanager
def _locked(temp: pytest.TempPathFactory, name: str, operation: int) -> Iterator[None]:
    """Hold the run's lock ``name`` (``fcntl.LOCK_EX`` or ``LOCK_SH``) in the block; the system drops it if the
    process dies."""
    with (run_folder(temp) / f"{name}.lock").open("a") as handle:
        fcntl.flock(handle, operation)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def one_at_a_time(temp: pytest.TempPathFactory, name: str) -> contextlib.AbstractContextManager[None]:
    """The block runs in one worker at a time, across the run."""
    return _locked(temp, name, fcntl.LOCK_EX)


@contextlib.contextmanager
def _engines_turn(temp: pytest.TempPathFactory, alone: bool) -> Iterator[None]:
    """The engines, alone (to restart one) or shared with the other workers' engine tests. The gate lets a worker
    that waits to be alone go before workers that ask after it."""
    if alone:
        with _locked(temp, "engines-gate", fcntl.LOCK_EX), _locked(temp, "engines", fcntl.LOCK_EX):
            yield
        return
    with _locked(temp, "engines-gate", fcntl.LOCK_SH):
        pass
    with _locked(temp, "engines", fcntl.LOCK_SH):
        yield


@pytest.fixture(scope="module", autouse=True)
def _engines_held_by_module(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A module whose tests use an engine holds it from its first test to its last (alone if marked
    ``engine_restart``); other modules take no turn."""
    items = [item for item in request.session.items if item.getparent(pytest.Module) is request.node]
    if any(item.get_closest_marker("engine_restart") for item in items):
        with _engines_turn(tmp_path_factory, alone=True):
            yield
    elif any(item.get_closest_marker(marker) for item in items for marker in ENGINE_MARKERS):
        with _engines_turn(tmp_path_factory, alone=False):
            yield
    else:
        yield
