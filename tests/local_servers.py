"""What the tests' own servers (PostgreSQL, Prometheus, the OTLP receiver) share: a free loopback port, and
being started for a ``with`` block."""

from __future__ import annotations

import socket
from types import TracebackType
from typing import Self

__all__ = ["StartedInBlock", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class StartedInBlock:
    """A server that a ``with`` block starts (:meth:`start`) and stops (:meth:`close`); a start that fails leaves
    nothing behind."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
