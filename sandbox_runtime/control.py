"""What the caller of a call can do while it runs: cancel it, and hear how far it has got.

One :class:`CallControl` goes with one call from the interface that received it (an MCP request, a host's own
thread) down to the tool and the sandbox backend. ``cancelled`` is set by the caller (a client's
``notifications/cancelled``, an HTTP request that went away); a long run polls it and ends every process it
started. ``progress`` is called from the worker thread at most about once a second with
``(progress, total, message)`` — MCP's own progress triple: for a run, the seconds elapsed, the time limit, and a
line naming the output so far. A progress callback must not block for long and must not raise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["CallControl", "ProgressReport"]

ProgressReport = Callable[[float, float | None, str | None], None]


@dataclass(frozen=True)
class CallControl:
    """Cancellation and progress for one call (see the module text)."""

    cancelled: threading.Event = field(default_factory=threading.Event)
    progress: ProgressReport | None = None

    def cancel(self) -> None:
        """Ask the call to stop; a run ends every process it started."""
        self.cancelled.set()

    @property
    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()

    def report(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Pass progress on to the caller, if it listens; a failing listener never fails the call."""
        if self.progress is None:
            return
        try:
            self.progress(progress, total, message)
        except Exception:  # a listener that went away must not end the run
            return
