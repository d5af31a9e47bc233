"""DNS-rebinding protection of ``serve --http``: on every loopback address served without a token.

A web page the user opens can make the browser send requests to ``127.x.y.z:PORT`` under a name the attacker
controls (DNS rebinding), or from its own origin. The server accepts only the address it serves (and
``localhost``) with its port as Host, and no Origin but those; everything else gets a 4xx before the MCP
session sees it. Driven against a real ``serve`` subprocess, over loopback only.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from pathlib import Path

import pytest

from sandbox_runtime.mcp.transports import rebinding_protection
from tests.mcp_helpers import http_server

INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "http-safety-test", "version": "1"},
        },
    }
)


def loopback_available(host: str) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except OSError:
        return False
    return True


def post_initialize(url: str, headers: dict[str, str]) -> tuple[int, str]:
    """POST ``initialize`` to the server at ``url`` (always over the loopback address it printed) with these
    headers (a given Host replaces the real one); the status and the body."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request(
            "POST",
            parts.path,
            body=INITIALIZE,
            headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
        )
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        connection.close()


@pytest.mark.parametrize("host", ["127.0.0.2", "::1", "127.0.0.1", "localhost"])
def test_a_loopback_server_refuses_foreign_host_and_origin_headers(served_state: Path, host: str) -> None:
    if host == "::1" and not loopback_available("::1"):
        pytest.skip("this machine has no IPv6 loopback (::1 cannot be bound)")
    with http_server(served_state, host=host) as url:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
        assert port is not None
        served = parts.netloc  # the address it listens on, as a Host value: 127.0.0.2:PORT, [::1]:PORT
        assert parts.hostname == ("127.0.0.1" if host == "localhost" else host)

        for evil in (f"evil.example:{port}", "evil.example", f"{served.rpartition(':')[0]}:{port + 1}"):
            status, body = post_initialize(url, {"Host": evil})
            assert status == 421, (evil, status, body)  # Misdirected Request: a name this server is not
        for origin in ("http://evil.example", f"http://evil.example:{port}", f"http://{served.rpartition(':')[0]}"):
            status, body = post_initialize(url, {"Host": served, "Origin": origin})
            assert status == 403, (origin, status, body)

        for good_host in (served, f"localhost:{port}"):
            status, body = post_initialize(url, {"Host": good_host})
            assert status == 200, (good_host, status, body)
            assert '"serverInfo"' in body
        status, body = post_initialize(url, {"Host": served, "Origin": f"http://{served}"})
        assert status == 200, (status, body)


def test_the_allowed_names_are_the_served_address_and_localhost_with_the_port() -> None:
    ipv4 = rebinding_protection("127.0.0.2", 8765)
    assert ipv4.enable_dns_rebinding_protection
    assert ipv4.allowed_hosts == ["127.0.0.2:8765", "localhost:8765"]
    assert ipv4.allowed_origins == ["http://127.0.0.2:8765", "http://localhost:8765"]

    ipv6 = rebinding_protection("::1", 9000, bound_address="::1")
    assert ipv6.allowed_hosts == ["[::1]:9000", "localhost:9000"]
    assert ipv6.allowed_origins == ["http://[::1]:9000", "http://localhost:9000"]

    named = rebinding_protection("localhost", 80, bound_address="127.0.0.1")
    assert named.allowed_hosts == ["localhost:80", "127.0.0.1:80", "localhost", "127.0.0.1"]
    assert not any(host.endswith(":*") for host in [*ipv4.allowed_hosts, *ipv6.allowed_hosts, *named.allowed_hosts])


def test_off_loopback_the_bearer_token_guards_and_host_names_are_not_guessed() -> None:
    assert not rebinding_protection("10.1.2.3", 8765).enable_dns_rebinding_protection
    assert not rebinding_protection("0.0.0.0", 8765).enable_dns_rebinding_protection  # noqa: S104  (the address under test)
