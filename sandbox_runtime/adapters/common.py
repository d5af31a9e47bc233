"""What the framework adapters share: the runtime's blocking calls made from a framework's async code (in a worker
thread, the caller's cancellation passed on as the call's own cancel), conversation ids made from a framework's
names, and the process's runtimes, one per configuration, made at first use."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import anyio
import anyio.to_thread

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import ConversationDeleted, EngineUnavailable, SandboxError
from sandbox_runtime.tenancy import CONVERSATION_ID_MAX_CHARS

__all__ = ["SANDBOX_USER", "UNAVAILABLE", "RuntimePerConfig", "conversation_id", "in_thread", "labels_of"]

T = TypeVar("T")
SANDBOX_USER = "sandbox"  # the image's one user (images/executor/Dockerfile)
# what says the sandbox (not the caller's command or file) cannot serve: each framework's "unavailable"
UNAVAILABLE = (EngineUnavailable, SandboxError, ConversationDeleted)
Config = TypeVar("Config", bound=Hashable)
_NOT_ID = re.compile(r"[^A-Za-z0-9_-]+")
_UNIQUE_HEX = 8


async def in_thread(call: Callable[[CallControl], T]) -> T:
    """``call(control)`` in a worker thread; when the awaiting task is cancelled, ``control`` is cancelled (a run
    ends every process it started) and the cancellation goes on at once."""
    control = CallControl()
    try:
        return await anyio.to_thread.run_sync(lambda: call(control), abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        control.cancel()
        raise


def conversation_id(prefix: str, *names: object) -> str:
    """A fresh conversation id from a framework's names (a task's, a sample's): their letters, digits, ``_`` and
    ``-``, cut to fit, then 8 random hex digits."""
    words = [_NOT_ID.sub("-", str(name)).strip("-") for name in (prefix, *names) if name not in (None, "")]
    room = CONVERSATION_ID_MAX_CHARS - _UNIQUE_HEX - 1
    stem = "-".join(word for word in words if word)[:room].rstrip("-") or prefix
    return f"{stem}-{uuid.uuid4().hex[:_UNIQUE_HEX]}"


def labels_of(words: tuple[str, ...]) -> dict[str, str]:
    """``KEY=VALUE`` words as container labels (a ValueError names a word without ``=``)."""
    labels = {}
    for word in words:
        key, equals, value = word.partition("=")
        if not equals or not key:
            raise ValueError(f"a label is KEY=VALUE, not {word!r}")
        labels[key] = value
    return labels


class RuntimePerConfig(Generic[Config]):
    """The runtimes of this process, one per configuration (a hashable value), made at first use and closed on
    request or at :meth:`close_all`."""

    def __init__(self, make: Callable[[Config], Runtime]) -> None:
        self._make = make
        self._runtimes: dict[Config, Runtime] = {}
        self._guard = threading.Lock()

    def get(self, config: Config) -> Runtime:
        with self._guard:
            runtime = self._runtimes.get(config)
            if runtime is None:
                runtime = self._runtimes[config] = self._make(config)
            return runtime

    def close(self, config: Config) -> None:
        with self._guard:
            runtime = self._runtimes.pop(config, None)
        if runtime is not None:
            runtime.close()

    def close_all(self) -> None:
        with self._guard:
            runtimes, self._runtimes = list(self._runtimes.values()), {}
        for runtime in runtimes:
            runtime.close()
