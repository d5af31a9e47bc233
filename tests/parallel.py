"""What the suite's parallel workers (pytest-xdist, ``-n``) share, and how they take turns with it.

Each worker is a pytest session of its own: its own session label (so it removes only its own containers), its own
PostgreSQL server on a free port, its own temporary folder. Two things are shared by every worker of a run, and
taken in turn through locks in the run's temporary root (:func:`run_folder`):

- **building the executor image**: one worker builds it, the others wait and then find it (:func:`one_at_a_time`);
- **the engines, against their restart**: a test module that stops and starts an engine service (marked
  ``engine_restart``) holds the engines alone from its first test to its last; every other test that uses an engine
  holds them shared while it runs, or from its module's first test to its last where the module's fixtures keep
  sandboxes between tests (marked ``engines_held_by_module``). A restart waiting for the engines goes before any
  test that asks after it (the gate), so it is never starved, and waits only for the tests running now;
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
    """A module that restarts an engine (``engine_restart``) holds the engines alone from its first test to its
    last; one whose fixtures keep sandboxes from one test to the next (``engines_held_by_module``) holds them shared
    as long. Other modules take their turn test by test (:func:`_engines_held_by_test`)."""
    if request.node.get_closest_marker("engine_restart"):
        with _engines_turn(tmp_path_factory, alone=True):
            yield
    elif request.node.get_closest_marker("engines_held_by_module"):
        with _engines_turn(tmp_path_factory, alone=False):
            yield
    else:
        yield


@pytest.fixture(autouse=True)
def _engines_held_by_test(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test that uses an engine, in a module that holds none, holds the engines shared while it runs (its fixtures'
    set-up and tear-down too): a restart waits at most for the tests running now."""
    module = request.node.getparent(pytest.Module)
    held = module is not None and any(
        module.get_closest_marker(marker) for marker in ("engine_restart", "engines_held_by_module")
    )
    if not held and any(request.node.get_closest_marker(marker) for marker in ENGINE_MARKERS):
        with _engines_turn(tmp_path_factory, alone=False):
            yield
    else:
        yield
