"""A client that keeps its HTTP connection alive (every MCP client over streamable HTTP does) is answered at once:
each connection ``serve --http`` accepts sends without waiting to fill a packet (``TCP_NODELAY``). Without it, an
answer written in two parts waited for the client's delayed acknowledgement, about 40 ms per request
(``bench/bench_replicas.py --keep-alive`` shows the difference)."""

from __future__ import annotations

import socket

import pytest

from sandbox_runtime.mcp.transports import listen


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_every_connection_the_server_accepts_sends_at_once(host: str) -> None:
    try:
        listener = listen(host, 0)
    except OSError:
        pytest.skip(f"{host} is not configured on this machine")
    with listener, socket.create_connection(listener.getsockname()[:2], timeout=10):
        accepted, _address = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
