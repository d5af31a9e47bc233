"""``sql_query``: one read-only SQL statement over the configured SQLite database; the rows are a table.

The database is opened read-only (``mode=ro``), with ``PRAGMA query_only`` on and an authorizer that allows only
reading: no ``ATTACH`` (which could create a file), no ``PRAGMA`` that changes anything, no writes of any kind,
whatever the text says. A query runs at most ``sql.timeout_s`` (interrupted by SQLite's progress handler) and
returns at most ``sql.rows_max`` rows. The rows stream into the spill as a
:class:`~sandbox_runtime.spill.streamed.TableStream`, so a large result becomes a typed table file (row count,
columns, types) whatever its size, without being held in memory.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.errors import QueryFailed
from sandbox_runtime.policy import Policy, SqlPolicy
from sandbox_runtime.spill.shown import spill_threshold_chars
from sandbox_runtime.spill.streamed import TableStream

__all__ = ["SqlQueryArgs", "sql_query", "sql_query_description"]

logger = logging.getLogger(__name__)


def sql_query_description(policy: Policy) -> str:
    """What the model is told of ``sql_query``, with the policy's spill threshold."""
    threshold = spill_threshold_chars(policy.spill, "sql_query")
    return (
        "Run one read-only SQL query (SQLite dialect) on the configured database and get the rows as a table. "
        f"Results over {threshold:,} characters are saved to a file: you get its path, the row count and the column "
        "names. "
        "Pass that path to export_table (CSV/XLSX), render_table or a run_python script instead of copying rows. "
        "To filter, sort or aggregate, write that into the SQL and query again (WHERE, ORDER BY, GROUP BY, LIMIT) "
        "rather than reading rows yourself. Use `params` for values (? placeholders). Writes are impossible."
    )


_PROGRESS_STEPS = 10_000  # SQLite virtual-machine steps between two looks at the clock
_FETCH_ROWS = 1_000
# SQLite authorizer actions that only read (see https://www.sqlite.org/c3ref/c_alter_table.html)
_READ_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION})
_RECURSIVE = getattr(sqlite3, "SQLITE_RECURSIVE", 33)
_READ_PRAGMAS = frozenset({"table_info", "table_xinfo", "index_list", "index_info", "foreign_key_list"})

Scalar = str | int | float | bool | None


class SqlQueryArgs(BaseModel):
    """Arguments of ``sql_query``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(description="One SQL statement that reads (SELECT / WITH … SELECT).", min_length=1)
    params: list[Scalar] = Field(default_factory=list, description="Values for the ? placeholders, in order.")


def _authorize(action: int, arg1: str | None, _arg2: str | None, _db: str | None, _trigger: str | None) -> int:
    if action in _READ_ACTIONS or action == _RECURSIVE:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _READ_PRAGMAS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def open_read_only(path: str | Path) -> sqlite3.Connection:
    """The database at ``path``, opened so that nothing can be written through the connection."""
    target = Path(path)
    if not target.is_file():
        raise QueryFailed(f"the configured database {target} does not exist or is not a file")
    uri = f"file:{urllib.parse.quote(str(target.resolve()))}?mode=ro"
    connection = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    connection.execute("PRAGMA query_only = ON")
    connection.set_authorizer(_authorize)
    return connection


def sql_query(policy: SqlPolicy, args: SqlQueryArgs) -> TableStream:
    """Start the query; return its rows as a stream (whose ``notes`` say so if the rows are cut).

    Errors before the first row (syntax, a refused statement, a timeout while sorting) raise
    :class:`QueryFailed`; the stream stops with the same error type if one comes later.
    """
    if policy.database_path is None:
        raise QueryFailed("no database is configured (policy sql.database_path)")
    if len(args.query) > policy.query_max_chars:
        raise QueryFailed(f"the query is {len(args.query):,} characters; at most {policy.query_max_chars:,}")
    connection = open_read_only(policy.database_path)
    deadline = time.monotonic() + policy.timeout_s
    connection.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
    try:
        cursor = connection.execute(args.query, args.params)
    except (sqlite3.Error, sqlite3.Warning) as exc:
        connection.close()
        raise QueryFailed(_explain(exc, policy)) from exc
    if cursor.description is None:
        connection.close()
        raise QueryFailed("the statement returns no rows; sql_query runs queries that read (SELECT)")
    columns = [str(d[0]) for d in cursor.description]
    notes: list[str] = []
    return TableStream(columns, _rows(connection, cursor, policy, notes), notes)


def _rows(
    connection: sqlite3.Connection, cursor: sqlite3.Cursor, policy: SqlPolicy, notes: list[str]
) -> Iterator[Sequence[Any]]:
    count = 0
    try:
        while batch := cursor.fetchmany(_FETCH_ROWS):
            for row in batch:
                if count == policy.rows_max:
                    notes.append(
                        f"[cut at sql.rows_max = {policy.rows_max:,} rows: narrow the query (WHERE, LIMIT) or "
                        f"aggregate in SQL]"
                    )
                    return
                count += 1
                yield row
    except (sqlite3.Error, sqlite3.Warning) as exc:
        raise QueryFailed(f"{_explain(exc, policy)} (after {count:,} rows)") from exc
    finally:
        connection.close()


def _explain(exc: BaseException, policy: SqlPolicy) -> str:
    text = str(exc)
    if text == "interrupted":
        return f"the query ran longer than sql.timeout_s = {policy.timeout_s:g} s and was stopped"
    if "not authorized" in text:
        return "sql_query only reads: this statement would write or change the database, and was refused"
    return f"SQLite: {text}"
