"""The seam between the state's records and the database that keeps them.

:class:`~sandbox_runtime.state.database.StateDB` and :class:`~sandbox_runtime.state.leases.Leases` write one set of
portable SQL (``?`` placeholders, ``ON CONFLICT``, ``RETURNING``) and run it through a :class:`StateEngine`:
SQLite in the state directory (:mod:`~sandbox_runtime.state.sqlite`, the embedded default) or a PostgreSQL server
that several runtime replicas share (:mod:`~sandbox_runtime.state.postgresql`). An engine hands out
:class:`Statements` (rows come back as dicts, read before the block ends), runs transactions, knows how its schema
version is kept and how the schema's few engine-specific words are spelled, and maps its driver's errors to
:class:`~sandbox_runtime.errors.StateUnavailable` at its own boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

from sandbox_runtime.state.locks import OuterLock

__all__ = ["EngineKind", "Row", "StateEngine", "Statements"]

Row = dict[str, Any]
EngineKind = Literal["sqlite", "postgresql"]


class Statements(Protocol):
    """Statements on one connection (in a transaction, or each committed by itself)."""

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[Row]:
        """Every row the statement gives."""
        ...

    def row(self, sql: str, params: Sequence[object] = ()) -> Row | None:
        """The statement's first row (None when it gives none)."""
        ...

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run a statement that gives no rows; how many rows it changed."""
        ...

    def run_many(self, sql: str, params: Iterable[Sequence[object]]) -> None:
        """Run one statement once for each set of parameters."""
        ...


class StateEngine(Protocol):
    """One database the state lives in."""

    kind: EngineKind
    shown: str  # where the database is, for logs and ``doctor`` (a password never shown)
    insertion_order: str  # the column that orders a table's rows as they were inserted

    def statements(self) -> AbstractContextManager[Statements]:
        """Statements that are each committed on their own."""
        ...

    def transaction(self, *, durable: bool = True, exclusive: bool = False) -> AbstractContextManager[Statements]:
        """One transaction: committed when the block ends, else rolled back. ``durable=False`` may commit before
        the disk has it (a crash of the server's machine may lose it until a later durable commit);
        ``exclusive`` keeps every other exclusive transaction out until it ends (schema migrations)."""
        ...

    def schema_version(self, tx: Statements) -> int | None:
        """The schema version recorded in the database; None for a database with no tables yet."""
        ...

    def set_schema_version(self, tx: Statements, version: int) -> None: ...

    def columns(self, tx: Statements, table: str) -> set[str]:
        """The names of a table's columns."""
        ...

    def ddl(self, statement: str) -> str:
        """A schema statement (written for SQLite) as this engine spells it."""
        ...

    def lock(self, name: str) -> OuterLock:
        """The lock of this name across the processes that share the state (a new holder object each call)."""
        ...

    def open_connections(self) -> int:
        """How many connections the engine has open now."""
        ...

    def close(self) -> None:
        """Close every connection (a later use opens new ones)."""
        ...
