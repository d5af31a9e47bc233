"""A host points the runtime at a state directory SQLite cannot use: a typed error says why, nothing is half made.

SQLite's unix VFS opens paths of at most 512 bytes (its journal adds 8 to the database's name), so a deep state
directory (a long CI workspace, a generated temp path) fails on its first statement with a bare
``sqlite3.OperationalError: unable to open database file``; a state database that is not a file fails the same
way. Both are :class:`StateUnavailable`, raised before any sandbox or engine is touched.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_runtime import Runtime, StateUnavailable
from sandbox_runtime.state.database import STATE_PATH_MAX_BYTES, StateDB


def _state_dir_for(base: Path, database_bytes: int) -> Path:
    """A folder under ``base`` whose ``state.sqlite3`` has a path of exactly ``database_bytes`` bytes."""
    rest = database_bytes - len(os.fsencode(base.resolve())) - len("/state.sqlite3")
    folder = base.resolve()
    while rest > 0:
        step = min(rest, 200)
        if rest - step == 1:  # a last part of length 0 cannot be: make this one shorter
            step -= 1
        folder /= "d" * (step - 1)
        rest -= step
    folder.mkdir(parents=True)
    assert len(os.fsencode(folder / "state.sqlite3")) == database_bytes
    return folder


@pytest.mark.parametrize("extra_bytes", [1, 8, 100, 3000])
def test_a_state_directory_too_deep_for_sqlite_is_refused_with_the_length_and_the_way_out(
    tmp_path: Path, extra_bytes: int
) -> None:
    state_dir = _state_dir_for(tmp_path, STATE_PATH_MAX_BYTES + extra_bytes)
    with pytest.raises(StateUnavailable, match=r"bytes long, and SQLite opens paths of at most 504") as refused:
        Runtime(state_dir, reap_interval_s=None, retention_interval_s=None)
    assert "--state-dir or SANDBOX_RUNTIME_STATE_DIR" in str(refused.value)
    assert list(state_dir.iterdir()) == []  # no database, nothing else made


def test_the_deepest_state_directory_sqlite_opens_works(tmp_path: Path) -> None:
    state_dir = _state_dir_for(tmp_path, STATE_PATH_MAX_BYTES)
    state = StateDB(state_dir / "state.sqlite3")
    try:
        state.ensure_conversation("deep", "measured", 1024)
        assert state.conversation("deep") is not None
    finally:
        state.close()


def test_a_state_database_that_is_not_a_file_is_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / "state.sqlite3").mkdir()
    with pytest.raises(StateUnavailable, match="cannot open the state database"):
        Runtime(tmp_path, reap_interval_s=None, retention_interval_s=None)
