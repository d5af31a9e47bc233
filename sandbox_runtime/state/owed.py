"""Writes the state owes: a row written before some work must be cleared or ended after it, or it outlives the
work. A call id's claim that its live runtime seems to hold keeps every retry of the call waiting
(:mod:`~sandbox_runtime.state.claims`); an MCP task left ``working`` seems to run for ever
(:mod:`~sandbox_runtime.state.tasks`). When the state is away at that moment (a PostgreSQL server restarted, a
transaction cut off half-way), the write that clears the row fails with the work it follows. It is kept here and
made again as soon as the state answers: before the runtime's next claim, and at every renewal of its lease.

Each owed write is idempotent (a claim deleted by its own token, a task ended only if it has not been), so one
made twice, or made after the row is gone, does no harm.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from sandbox_runtime.errors import StateUnavailable

__all__ = ["OwedWrites"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class OwedWrites:
    """The writes one runtime owes its state (in memory: a runtime that dies owes nothing, its lease ends and
    whatever it left is taken over)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owed: dict[str, Callable[[], object]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._owed)

    def owe(self, key: str, write: Callable[[], object]) -> None:
        """Keep ``write`` to be made by :meth:`settle` (one write per ``key``: a newer one replaces it)."""
        with self._lock:
            self._owed[key] = write

    def make(self, key: str, write: Callable[[], T], *, undo: Callable[[], object] | None = None) -> T:
        """Make ``write`` now; when it fails (the failure is raised), it is owed, or rather ``undo`` is when given:
        the write that clears what a failed ``write`` may have made all the same."""
        try:
            return write()
        except Exception:
            self.owe(key, write if undo is None else undo)
            raise

    def settle(self) -> None:
        """Make the owed writes, oldest first, while the state answers; those it refuses stay owed (the caller's
        own work meets the state's absence by itself). A write that fails for another reason is logged and
        dropped: it would fail again."""
        with self._lock:
            owed = list(self._owed.items())
        for key, write in owed:
            try:
                write()
            except StateUnavailable:
                return
            except Exception:
                logger.exception("an owed state write (%s) failed: dropped", key)
            with self._lock:
                if self._owed.get(key) is write:
                    del self._owed[key]
