"""The shared state engine: a PostgreSQL server that several runtime replicas (on one host or many) use at once.

Statements run on connections borrowed from a pool (psycopg 3); one idle for over a second is checked before it
is lent, so that a server that restarted is reconnected to by itself; every statement outside a transaction
commits on its own. A write transaction is PostgreSQL's own (read committed: every multi-statement write of the
state is a set of conditional inserts and updates that stay right under it), and migrations take a
transaction-level advisory lock so that replicas starting together migrate once. ``durable=False`` commits with
``synchronous_commit`` off for that one transaction. The schema version is the one row of the ``schema_version``
table.

The named locks (:mod:`~sandbox_runtime.state.locks`: a conversation's claim and run locks) are session-level
advisory locks, all held on one connection of their own: a replica that dies ends its session, and the server
lets go of its locks at once. Should that connection break while a lock is held, the server let go of it too
(logged); the next lock taken opens a new connection.

Every failure to reach the server (it is down, restarting, refuses the login, or the pool found no connection
within ``state.connect_timeout_s``) is :class:`~sandbox_runtime.errors.StateUnavailable`, naming the server
without its password; a transaction it broke is rolled back by the server, so nothing is half-written.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager as ContextManager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg.rows
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from sandbox_runtime.errors import StateUnavailable
from sandbox_runtime.state.engine import EngineKind, Row, Statements
from sandbox_runtime.state.locks import poll_until

__all__ = ["PostgresEngine", "shown_url"]

logger = logging.getLogger(__name__)

# a connection used within this long is lent without a round trip to check it, unless the server was seen away
# since (then every idle connection is checked once): a server restart in that second with no use in between fails
# one statement on it (StateUnavailable), and the connection is replaced
_CHECKED_AFTER_S = 1.0
_MIGRATION_LOCK = 0x73616E64626F78  # the advisory lock migrations take ("sandbox"): one migrates, the rest wait
_TYPES = (
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b"), "BYTEA"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),  # sizes and counts outgrow 32 bits
)


def shown_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


@functools.lru_cache(maxsize=256)
def _placeholders(sql: str) -> str:
    """The portable statement (``?`` marks) as psycopg takes it (``%s``)."""
    if "%" in sql:
        raise ValueError(f"a state statement may not contain '%': {sql[:80]}")
    return sql.replace("?", "%s")


class _Statements:
    """:class:`~sandbox_runtime.state.engine.Statements` on a psycopg connection."""

    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.Connection[Row]) -> None:
        self._conn = conn

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        return self._conn.execute(_placeholders(sql), params).fetchall()

    def row(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        return self._conn.execute(_placeholders(sql), params).fetchone()

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        return self._conn.execute(_placeholders(sql), params).rowcount

    def run_many(self, sql: str, params: Iterable[Sequence[object]]) -> None:
        with self._conn.cursor() as cursor:
            cursor.executemany(_placeholders(sql), params)


def _lock_key(name: str) -> int:
    """The advisory lock's 64-bit key for a lock name."""
    digest = hashlib.sha256(b"sandbox-runtime lock\0" + name.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class _LockSession:
    """The one connection that holds this engine's advisory locks (see the module's text). Its ``generation``
    moves on with every new connection: a lock taken on an earlier one is gone already."""

    def __init__(
        self, connect: Callable[[], psycopg.Connection[Row]], mapped: Callable[[], ContextManager[None]]
    ) -> None:
        self._connect = connect
        self._mapped = mapped
        self._guard = threading.Lock()
        self._conn: psycopg.Connection[Row] | None = None
        self.generation = 0

    def try_lock(self, key: int) -> int | None:
        """The generation it was taken in, or None when another session holds it."""
        with self._guard, self._mapped():
            for fresh in (False, True):  # a connection the server ended (it restarted) is opened again, once
                if fresh or self._conn is None or self._conn.closed or self._conn.broken:
                    if self._conn is not None:
                        self._conn.close()
                    self._conn = self._connect()
                    self.generation += 1
                try:
                    row = self._conn.execute("SELECT pg_try_advisory_lock(%s) AS taken", (key,)).fetchone()
                except psycopg.OperationalError:
                    if fresh:
                        raise
                    continue
                return self.generation if row is not None and row["taken"] else None
            return None  # not reached: the second round returns or raises

    def unlock(self, key: int, generation: int) -> None:
        with self._guard:
            if generation != self.generation or self._conn is None or self._conn.closed:
                logger.warning("a state lock's connection broke while it was held: the server let go of it earlier")
                return
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                logger.warning("a state lock's connection broke while it was held (%s)", type(exc).__name__)

    def close(self) -> None:
        with self._guard:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class _AdvisoryLock:
    """One named lock (:class:`~sandbox_runtime.state.locks.OuterLock`) on the engine's lock session."""

    def __init__(self, session: _LockSession, name: str) -> None:
        self._session = session
        self._key = _lock_key(name)
        self._generation: int | None = None

    def take(self, deadline: float) -> bool:
        def attempt() -> bool:
            self._generation = self._session.try_lock(self._key)
            return self._generation is not None

        return poll_until(deadline, attempt)

    def give_back(self) -> None:
        if self._generation is not None:
            self._session.unlock(self._key, self._generation)
            self._generation = None

    def forget(self) -> None:
        """Nothing is kept for a name."""


class PostgresEngine:
    """The state on a PostgreSQL server (see the module's text). Opening it connects once (a server that does not
    answer is :class:`StateUnavailable` at once)."""

    kind: EngineKind = "postgresql"
    insertion_order = "seq"

    def __init__(self, url: str, *, connections_max: int, connect_timeout_s: float) -> None:
        self.shown = shown_url(url)
        self._password = urlsplit(url).password
        self._timeout_s = connect_timeout_s
        connection_settings: dict[str, Any] = {
            "autocommit": True,
            "row_factory": psycopg.rows.dict_row,
            "connect_timeout": max(1, round(connect_timeout_s)),
            "application_name": "sandbox-runtime",
        }
        self._url, self._connections_max, self._settings = url, connections_max, connection_settings
        self._locks = _LockSession(
            functools.partial(psycopg.Connection.connect, url, **connection_settings), self._mapped
        )
        self._pool_guard = threading.Lock()
        self._used: weakref.WeakKeyDictionary[psycopg.Connection[Row], float] = weakref.WeakKeyDictionary()
        self._pool: ConnectionPool[psycopg.Connection[Row]] = self._opened_pool()

    def _opened_pool(self) -> ConnectionPool[psycopg.Connection[Row]]:
        """A new pool, its first connection made (or :class:`StateUnavailable`)."""
        pool: ConnectionPool[psycopg.Connection[Row]] = ConnectionPool(
            self._url,
            min_size=1,
            max_size=self._connections_max,
            open=False,
            timeout=self._timeout_s,
            check=self._check,
            name="sandbox-runtime-state",
            kwargs=self._settings,
        )
        with self._mapped():
            try:
                pool.open(wait=True, timeout=self._timeout_s)
            except BaseException:
                pool.close()
                raise
        return pool

    def _open_pool(self) -> ConnectionPool[psycopg.Connection[Row]]:
        """The pool, opened again after :meth:`close` (a later use opens new connections, as SQLite's does)."""
        if self._pool.closed:
            with self._pool_guard:
                if self._pool.closed:
                    self._pool = self._opened_pool()
        return self._pool

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[None]:
        """The one place psycopg's failures to reach the server become :class:`StateUnavailable`."""
        try:
            yield
        except PoolTimeout:
            self._used.clear()  # (see below)
            raise StateUnavailable(
                f"the state database {self.shown} is not available: no connection within {self._timeout_s:g} s "
                "(the server is down or unreachable, refuses the login, or every connection is busy)"
            ) from None
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            # the server went away (or may have): every connection idle in the pool is checked before it is lent
            # again, however recently it was used (one the server ended would fail the first call once it is back)
            self._used.clear()
            said = str(exc).strip() or type(exc).__name__
            if self._password:
                said = said.replace(self._password, "***")
            raise StateUnavailable(f"the state database {self.shown} is not available: {said}") from None

    def _check(self, conn: psycopg.Connection[Row]) -> None:
        """Before a connection is lent: one idle for longer than :data:`_CHECKED_AFTER_S` is checked with a round
        trip (one the server ended is replaced); one used just now is lent as it is."""
        if time.monotonic() - self._used.get(conn, 0.0) > _CHECKED_AFTER_S:
            ConnectionPool.check_connection(conn)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Row]]:
        with self._mapped():
            pool = self._open_pool()
            try:
                conn = pool.getconn()
            except PoolTimeout:
                pool = self._restarted(pool)
                conn = pool.getconn()
            except PoolClosed:
                if pool is self._pool:
                    raise
                pool = self._open_pool()  # another thread replaced the pool this one waited on: the new one
                conn = pool.getconn()
            try:
                yield conn
            finally:
                self._used[conn] = time.monotonic()
                pool.putconn(conn)  # one the server broke, or left in a transaction, is not lent again

    def _restarted(self, pool: ConnectionPool[psycopg.Connection[Row]]) -> ConnectionPool[psycopg.Connection[Row]]:
        """A pool that lost its connections (the server went away) waits out a growing back-off before it tries
        again: once the server is back, a new pool connects at once. One with all its connections lent is only
        busy: its :class:`PoolTimeout` stands."""
        if pool.get_stats().get("pool_size", 0) >= self._connections_max:
            raise PoolTimeout("every connection is busy")
        psycopg.Connection.connect(self._url, **self._settings).close()  # still away: its own error, at once
        with self._pool_guard:
            if self._pool is pool:
                self._pool = self._opened_pool()
                pool.close(timeout=0)
            return self._pool

    @contextlib.contextmanager
    def statements(self) -> Iterator[Statements]:
        with self._connection() as conn:
            yield _Statements(conn)

    @contextlib.contextmanager
    def transaction(self, *, durable: bool = True, exclusive: bool = False) -> Iterator[Statements]:
        with self._connection() as conn, conn.transaction():
            tx = _Statements(conn)
            if exclusive:
                tx.run("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            if not durable:
                tx.run("SET LOCAL synchronous_commit TO OFF")
            yield tx

    def schema_version(self, tx: Statements) -> int | None:
        if (tx.row("SELECT to_regclass('schema_version') IS NOT NULL AS present") or {})["present"]:
            row = tx.row("SELECT version FROM schema_version")
            return 0 if row is None else int(row["version"])
        known = tx.row("SELECT to_regclass('conversations') IS NOT NULL AS present") or {}
        return 0 if known["present"] else None

    def set_schema_version(self, tx: Statements, version: int) -> None:
        tx.run("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
        tx.run("DELETE FROM schema_version")
        tx.run("INSERT INTO schema_version(version) VALUES (?)", (version,))

    def columns(self, tx: Statements, table: str) -> set[str]:
        rows = tx.rows(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ?",
            (table,),
        )
        return {row["column_name"] for row in rows}

    def ddl(self, statement: str) -> str:
        for pattern, spelled in _TYPES:
            statement = pattern.sub(spelled, statement)
        return statement

    def lock(self, name: str) -> _AdvisoryLock:
        return _AdvisoryLock(self._locks, name)

    def open_connections(self) -> int:
        return int(self._pool.get_stats().get("pool_size", 0))

    def close(self) -> None:
        self._locks.close()
        self._pool.close()
