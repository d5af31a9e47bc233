"""Stopping a server the way an operator expects: on SIGTERM or SIGINT, drain, cancel, clean up, exit 0.

The first signal starts the stop:

1. no new call is taken: over HTTP a ``tools/call`` or ``initialize`` gets ``503`` with ``Retry-After``
   (:class:`RefuseWhileStopping`; responses, notifications and other requests still pass, so a call in flight can
   still be approved and its task read); over stdio a new call is a JSON-RPC error saying the server stops;
2. the calls in flight (:class:`CallsInFlight`: every ``tools/call`` and task) may finish for up to
   ``mcp.shutdown_grace_s``;
3. those still running then are cancelled: a run ends every process it started and is recorded ``cancelled``, and
   its client gets that result;
4. the transport stops (its last answers sent, bounded), and ``serve`` closes the runtime: the pooled sandboxes go,
   what it mounted is unmounted, its lease is dropped; the exit code is 0.

A second signal skips the grace: the calls are cancelled at once and the transport stops; the clean-up of step 4
still runs, as far as it can. Conversations' sandboxes stay, as after any stop, for the next process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import anyio
import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox_runtime.control import CallControl

__all__ = ["STOPPING_CODE", "STOPPING_MESSAGE", "CallsInFlight", "RefuseWhileStopping", "serve_until_signalled"]

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOPPING_CODE = -32000  # the JSON-RPC error of a call the stopping server did not take (a server error)
STOPPING_MESSAGE = "the server is stopping; send the call again to its successor"
_CANCELLED_WAIT_S = 10.0  # cancelled calls end their runs at once; a tool that ignores it is not waited on longer
_REFUSED_METHODS = frozenset({"tools/call", "initialize"})


class CallsInFlight:
    """The calls a server runs right now (by their controls), and whether it is stopping. Any thread."""

    def __init__(self) -> None:
        self._controls: list[CallControl] = []
        self._changed = threading.Condition()
        self._stopping = threading.Event()

    @property
    def stopping(self) -> bool:
        """Whether a stop began: no new call is taken."""
        return self._stopping.is_set()

    def stop_taking_calls(self) -> None:
        self._stopping.set()

    @contextlib.contextmanager
    def running(self, control: CallControl) -> Iterator[None]:
        """While the block runs, the call of ``control`` is in flight."""
        with self._changed:
            self._controls.append(control)
        try:
            yield
        finally:
            with self._changed:
                self._controls.remove(control)
                self._changed.notify_all()

    def count(self) -> int:
        with self._changed:
            return len(self._controls)

    def wait_until_idle(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until no call runs; whether none does."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._controls, timeout=timeout_s)

    def cancel_all(self) -> int:
        """Cancel every call in flight; how many there were."""
        with self._changed:
            controls = list(self._controls)
        for control in controls:
            control.cancel()
        return len(controls)


async def serve_until_signalled(
    serve: Callable[[], Coroutine[Any, Any, None]],
    stop: Callable[[], Coroutine[Any, Any, None]],
    calls: CallsInFlight,
    *,
    grace_s: float,
    signalled_before: Callable[[], bool] = lambda: False,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run ``serve`` until it returns or a stop signal ends it (see the module text): ``stop`` asks the transport
    to end (it is called from the event loop, once the calls ended or were given up on). Must run in the main
    thread (signals are delivered there; elsewhere it only serves). ``on_ready`` is called once signals are heard
    here (a server says it serves only then); ``signalled_before`` says whether a stop signal came before (one
    that start-up noted after it last looked): the stop then begins at once."""
    if threading.current_thread() is not threading.main_thread():
        if on_ready is not None:
            on_ready()
        await serve()
        return
    async with anyio.create_task_group() as group:

        async def drain_then_stop() -> None:
            idle = await anyio.to_thread.run_sync(calls.wait_until_idle, grace_s, abandon_on_cancel=True)
            if not idle:
                cancelled = calls.cancel_all()
                logger.warning("cancelling %d calls still running after %g s", cancelled, grace_s)
                await anyio.to_thread.run_sync(calls.wait_until_idle, _CANCELLED_WAIT_S, abandon_on_cancel=True)
            await stop()

        def heard(name: str) -> None:
            if not calls.stopping:
                calls.stop_taking_calls()
                logger.warning(
                    "%s: stopping; %d calls in flight may finish within %g s (a second signal: at once)",
                    name,
                    calls.count(),
                    grace_s,
                )
                group.start_soon(drain_then_stop)
            else:
                logger.warning("%s again: cancelling %d calls and stopping now", name, calls.cancel_all())
                group.start_soon(stop)

        async def watch() -> None:
            with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
                if signalled_before():
                    heard("a stop signal during start-up")
                if on_ready is not None:
                    on_ready()
                async for signum in signals:
                    heard(signal.Signals(signum).name)

        group.start_soon(watch)
        await serve()
        group.cancel_scope.cancel()


class RefuseWhileStopping:
    """ASGI middleware: while the server stops, a ``tools/call`` or ``initialize`` request (alone or in a batch)
    gets ``503`` with ``Retry-After``; everything else passes (the body is read once and handed on as it came)."""

    def __init__(self, app: ASGIApp, calls: CallsInFlight, retry_after_s: int) -> None:
        self.app = app
        self.calls = calls
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not self.calls.stopping:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = bytearray()
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        if _refused(bytes(body)):
            await self._refuse(send)
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        payload = {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": STOPPING_CODE, "message": STOPPING_MESSAGE},
        }
        body = json.dumps(payload).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(self.retry_after_s).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _refused(body: bytes) -> bool:
    """Whether a JSON-RPC body is (or holds) a request the stopping server no longer takes."""
    try:
        message = json.loads(body)
    except ValueError:
        return False  # not ours to judge: the transport answers it as it would
    items = message if isinstance(message, list) else [message]
    return any(isinstance(item, dict) and item.get("method") in _REFUSED_METHODS for item in items)
