"""The tests' private Prometheus (tests/prometheus_server.py) against real exporters: prometheus_client's own HTTP
server, and a small one that answers only a bearer token, as a protected ``/metrics`` endpoint does."""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, start_http_server

from tests.prometheus_server import PrometheusServer, values

TOKEN = "s3cret"  # noqa: S105 (the test exporter's own token, not a password)


@pytest.mark.process
def test_scrapes_a_counter_and_a_histogram(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    probes = Counter("harness_probe", "Probes the harness made.", registry=registry)
    seconds = Histogram("harness_probe_seconds", "How long a probe took.", registry=registry)
    probes.inc(3)
    for took in (0.01, 0.2, 0.3):
        seconds.observe(took)
    rules = tmp_path / "rules.yml"
    rules.write_text(
        "groups:\n- name: harness\n  rules:\n"
        "  - record: harness:probe_total:doubled\n    expr: harness_probe_total * 2\n"
    )
    exporter, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        target = f"127.0.0.1:{exporter.server_port}"
        with PrometheusServer(tmp_path / "prometheus", target, rule_files=[rules]) as prometheus:
            prometheus.wait_for('up{job="probe"}', lambda result: values(result) == [1.0])
            prometheus.wait_for("harness_probe_total", lambda result: values(result) == [3.0])
            prometheus.wait_for("harness_probe_seconds_count", lambda result: values(result) == [3.0])
            prometheus.wait_for("harness:probe_total:doubled", lambda result: values(result) == [6.0])
            assert values(prometheus.query("scalar(harness_probe_total) + 1")) == [4.0]
            with pytest.raises(ValueError, match="parse error"):
                prometheus.query("harness_probe_total{")
            (scraped,) = prometheus.targets()
            assert scraped["health"] == "up"
            assert scraped["scrapeUrl"] == f"http://{target}/metrics"
            # a wait that times out says what it last saw, and how the targets are
            with pytest.raises(AssertionError, match=r"(?s)the last one: .*'3'.*'health': 'up'"):
                prometheus.wait_for("harness_probe_total", lambda result: values(result) == [4.0], timeout_s=0.5)
    finally:
        exporter.shutdown()
        exporter.server_close()
        thread.join(10)
    assert not prometheus.running


@pytest.fixture
def token_exporter() -> Iterator[str]:
    """An exporter on 127.0.0.1 whose ``/metrics`` answers 401 without ``Authorization: Bearer s3cret``; yields
    its ``host:port``."""
    registry = CollectorRegistry()
    Counter("harness_probe", "Probes the harness made.", registry=registry).inc(5)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_error(401, "a bearer token is required")
                return
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.process
def test_scrapes_with_a_bearer_token(tmp_path: Path, token_exporter: str) -> None:
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as refused:
        no_proxy.open(f"http://{token_exporter}/metrics", timeout=5)
    refused.value.close()
    assert refused.value.code == 401

    with PrometheusServer(tmp_path / "with-token", token_exporter, bearer_token=TOKEN) as prometheus:
        prometheus.wait_for("harness_probe_total", lambda result: values(result) == [5.0])
        (target,) = prometheus.targets()
        assert (target["health"], target["lastError"]) == ("up", "")
