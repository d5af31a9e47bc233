"""The embedded state engine: ``STATE_DIR/state.sqlite3``, for the processes of one host.

Every write is one transaction (``BEGIN IMMEDIATE``: writers take turns, across the processes that share the
file); WAL mode keeps readers from blocking the writer. Each thread has its own connection, closed when the
thread ends (a host that serves each request on a thread of its own keeps no descriptor of the threads that are
gone) and, for every thread, when the engine closes. The schema version is ``PRAGMA user_version``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sandbox_runtime.errors import StateUnavailable
from sandbox_runtime.state.engine import EngineKind, Row, Statements
from sandbox_runtime.state.locks import FileLock

__all__ = ["STATE_PATH_MAX_BYTES", "SqliteEngine"]

# SQLite's unix VFS opens paths of at most 512 bytes; the rollback journal adds "-journal" to the name
STATE_PATH_MAX_BYTES = 512 - len("-journal")


def _dict_row(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> Row:
    return {column[0]: value for column, value in zip(cursor.description, values, strict=True)}


class _Statements:
    """:class:`~sandbox_runtime.state.engine.Statements` on a SQLite connection."""

    __slots__ = ("_db",)

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        return self._db.execute(sql, params).fetchall()

    def row(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        row: Row | None = self._db.execute(sql, params).fetchone()
        return row

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        return self._db.execute(sql, params).rowcount

    def run_many(self, sql: str, params: Iterable[Sequence[object]]) -> None:
        self._db.executemany(sql, params)


class _Slot:
    """A thread's connection, kept in the engine's thread-local storage: when the thread ends, its storage goes
    and so does the slot, whose finalizer closes the connection."""

    __slots__ = ("__weakref__", "generation", "statements")

    def __init__(self, db: sqlite3.Connection, generation: int) -> None:
        self.statements = _Statements(db)
        self.generation = generation


def _close_tracked(tracked: dict[int, sqlite3.Connection], guard: threading.Lock, key: int) -> None:
    """Close one tracked connection unless it was closed already (a finalizer: holds no engine)."""
    with guard:
        db = tracked.pop(key, None)
    if db is not None:
        db.close()


def _check_path_length(path: Path) -> None:
    """SQLite opens files by paths of at most 512 bytes (its unix VFS), and its journal's name is 8 bytes longer."""
    full = len(os.fsencode(path.resolve()))
    if full > STATE_PATH_MAX_BYTES:
        raise StateUnavailable(
            f"the state database's path is {full:,} bytes long, and SQLite opens paths of at most "
            f"{STATE_PATH_MAX_BYTES} bytes (with its journal's suffix): choose a state directory with a shorter path "
            f"(--state-dir or SANDBOX_RUNTIME_STATE_DIR): {str(path)[:120]}..."
        )


class SqliteEngine:
    """The state in one SQLite file (see the module's text)."""

    kind: EngineKind = "sqlite"
    insertion_order = "rowid"

    def __init__(self, path: Path) -> None:
        _check_path_length(path)
        self.path = path
        self.shown = str(path)
        self._local = threading.local()
        self._tracked: dict[int, sqlite3.Connection] = {}  # every open connection, by slot number
        self._tracked_guard = threading.Lock()
        self._numbers = itertools.count()
        self._generation = 0  # close() moves it on: a slot of an earlier generation holds a closed connection

    def _connection(self) -> _Statements:
        """This thread's connection, opened on its first use (again after :meth:`close`)."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is not None and slot.generation == self._generation:
            return slot.statements
        # not tied to its thread, so that close() (or a finalizer) can close it from another one; only its own
        # thread ever runs statements on it
        try:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        except sqlite3.OperationalError as exc:
            raise StateUnavailable(f"cannot open the state database {self.path}: {exc}") from exc
        try:
            db.row_factory = _dict_row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA foreign_keys=ON")
        except sqlite3.OperationalError as exc:
            db.close()
            raise StateUnavailable(f"cannot use the state database {self.path}: {exc}") from exc
        except BaseException:
            db.close()
            raise
        key = next(self._numbers)
        with self._tracked_guard:
            self._tracked[key] = db
            slot = _Slot(db, self._generation)
        weakref.finalize(slot, _close_tracked, self._tracked, self._tracked_guard, key)
        self._local.slot = slot
        return slot.statements

    @contextlib.contextmanager
    def statements(self) -> Iterator[_Statements]:
        yield self._connection()

    @contextlib.contextmanager
    def transaction(self, *, durable: bool = True, exclusive: bool = False) -> Iterator[_Statements]:
        """Every SQLite write transaction is exclusive (``BEGIN IMMEDIATE``); ``durable=False`` commits with
        ``synchronous=NORMAL``: a process that crashes keeps it, a power cut may lose it until the next durable
        commit (of any thread or process) makes it durable with its own."""
        del exclusive
        db = self._connection()
        if not durable:
            db.run("PRAGMA synchronous=NORMAL")
        try:
            db.run("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.run("ROLLBACK")
                raise
            db.run("COMMIT")
        finally:
            if not durable:
                db.run("PRAGMA synchronous=FULL")

    def schema_version(self, tx: Statements) -> int | None:
        if (tx.row("SELECT count(*) AS n FROM sqlite_master") or {"n": 0})["n"] == 0:
            return None
        return int((tx.row("PRAGMA user_version") or {"user_version": 0})["user_version"])

    def set_schema_version(self, tx: Statements, version: int) -> None:
        tx.run(f"PRAGMA user_version = {int(version)}")

    def columns(self, tx: Statements, table: str) -> set[str]:
        return {row["name"] for row in tx.rows("SELECT name FROM pragma_table_info(?)", (table,))}

    def ddl(self, statement: str) -> str:
        return statement

    def lock(self, name: str) -> FileLock:
        """A file under ``STATE_DIR/locks`` (the state's processes share this host)."""
        folder = self.path.parent / "locks"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return FileLock(folder / name)

    def open_connections(self) -> int:
        """How many connections are open now (one per thread that used the database and is still running)."""
        with self._tracked_guard:
            return len(self._tracked)

    def close(self) -> None:
        """Close the connection of every thread (call it when no other thread is inside a state operation); a
        thread that uses the database afterwards opens a new one."""
        with self._tracked_guard:
            self._generation += 1
            closing = list(self._tracked.values())
            self._tracked.clear()
        for db in closing:
            db.close()
