"""The one owner of a runtime's threads.

:class:`Workers` holds a bounded pool for the calls a runtime runs in parallel (the built-in calls of a turn, MCP
tasks), the background jobs (the reaper, retention, the warm pool; a job can be woken early) and the services
started with the runtime (a gateway's event loop): they are started by it and stopped with it, in one place.
``close`` stops the jobs, then the services (in the reverse of the order they were given), then the pool: calls
still waiting for a worker are cancelled, and calls that run are waited for up to ``_CALLS_STOP_WAIT_S`` (a script
still running after that ends with its sandbox, which outlives the runtime). Every wait is bounded.

A call that runs in the pool and asks the pool for more work (a turn inside a task) runs that work in its own
thread instead: a full pool never waits on itself.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol, TypeVar

__all__ = ["Closeable", "Workers"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
_JOB_STOP_WAIT_S = 10.0  # a background job's round is short (a reap, a retention sweep); longer: logged, left
_CALLS_STOP_WAIT_S = 10.0  # how long close waits for the calls that run (queued ones are cancelled)


class Closeable(Protocol):
    def close(self) -> None: ...


class Workers:
    """A runtime's threads: the call pool (``calls_max`` at once), background jobs, owned services."""

    def __init__(self, calls_max: int, name: str = "sandbox-runtime") -> None:
        self._name = name
        self._pool = ThreadPoolExecutor(max_workers=calls_max, thread_name_prefix=f"{name}-call")
        self._in_pool = threading.local()
        self._running = 0
        self._idle = threading.Condition()
        self._stop = threading.Event()
        self._jobs: list[tuple[threading.Thread, threading.Event]] = []
        self._services: list[Closeable] = []
        self._guard = threading.Lock()
        self._closed = False

    # the call pool ---------------------------------------------------------------------------------------
    def _marked(self, fn: Callable[[T], R]) -> Callable[[T], R]:
        """``fn`` counted as running, in the caller's context (its current span and log fields follow it)."""
        context = contextvars.copy_context()

        def run(item: T) -> R:
            self._in_pool.active = True
            with self._idle:
                self._running += 1
            try:
                return context.copy().run(fn, item)
            finally:
                self._in_pool.active = False
                with self._idle:
                    self._running -= 1
                    self._idle.notify_all()

        return run

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``fn`` over ``items`` in the pool, results in order (from a pool thread: in this thread, in order)."""
        if getattr(self._in_pool, "active", False):
            return [fn(item) for item in items]
        return list(self._pool.map(self._marked(fn), items))

    def submit(self, fn: Callable[[], R]) -> Future[R]:
        """Run ``fn`` in the pool (it waits for a free worker when all are busy)."""
        return self._pool.submit(self._marked(lambda _none: fn()), None)

    # background jobs --------------------------------------------------------------------------------------
    def every(
        self, interval_s: float, name: str, job: Callable[[], object], *, first_now: bool = False
    ) -> Callable[[], None]:
        """Run ``job`` every ``interval_s`` seconds until ``close`` (``first_now``: the first round at once); a
        failed round is logged and tried again. Returns a function that asks for the next round now (a round
        asked for while one runs follows it)."""
        wake = threading.Event()
        if first_now:
            wake.set()

        def loop() -> None:
            while True:
                wake.wait(interval_s)
                wake.clear()
                if self._stop.is_set():
                    return
                try:
                    job()
                except Exception:
                    logger.exception("the %s job failed; trying again in %s s", name, interval_s)

        thread = threading.Thread(target=loop, name=f"{self._name}-{name}", daemon=True)
        with self._guard:
            self._jobs.append((thread, wake))
        thread.start()
        return wake.set

    # owned services ---------------------------------------------------------------------------------------
    def own(self, service: Closeable) -> None:
        """Close ``service`` (e.g. a gateway and its event loop) when the workers close, before the pool."""
        with self._guard:
            self._services.append(service)

    def close(self) -> None:
        """Stop the jobs, close the services (last given, first closed), then end the pool (running calls finish
        first). Closing twice does nothing."""
        with self._guard:
            if self._closed:
                return
            self._closed = True
            jobs, services = list(self._jobs), list(reversed(self._services))
        self._stop.set()
        for _, wake in jobs:
            wake.set()
        for thread, _ in jobs:
            thread.join(timeout=_JOB_STOP_WAIT_S)
            if thread.is_alive():
                logger.warning("the %s job did not stop within %s s", thread.name, _JOB_STOP_WAIT_S)
        for service in services:
            try:
                service.close()
            except Exception:
                logger.exception("closing %s failed", type(service).__name__)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._idle:
            if not self._idle.wait_for(lambda: self._running == 0, timeout=_CALLS_STOP_WAIT_S):
                logger.warning(
                    "%d calls still run after %s s; the runtime closes without them", self._running, _CALLS_STOP_WAIT_S
                )

    @property
    def thread_prefix(self) -> str:
        """The start of the name of every thread these workers start."""
        return self._name
