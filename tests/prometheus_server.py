"""A private Prometheus server for the tests: real (Debian's ``prometheus``), never the machine's own service.

:class:`PrometheusServer` writes a ``prometheus.yml`` into a folder the test gives it (a scrape every second of one
target on the loopback interface, with an optional bearer token and rule files), starts ``/usr/bin/prometheus``
listening only on 127.0.0.1 on a free port, with its data and its log in that folder, and waits until it is ready.
A test then asks it PromQL (:meth:`~PrometheusServer.query`), or waits, bounded, until an answer fits
(:meth:`~PrometheusServer.wait_for`, which fails with the targets' health and the end of the log). Closing it ends
the server: by its own pid only, SIGTERM then, if it lingers, SIGKILL. Only 127.0.0.1 is ever contacted.

The server is ready in a fraction of a second, but Prometheus 2.42 hands its targets to the scrape loop only on
its discovery and scrape managers' 5 s tickers: the first scrape comes 5 to 10 s after the start (the default
``timeout_s`` of :meth:`~PrometheusServer.wait_for`, 30 s, leaves room for that).

Without Prometheus the test is skipped, or fails when ``CI`` is set (CI must never pass without these tests).
The module holds no ``assert`` (it raises AssertionError itself), so pytest need not rewrite it.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.local_servers import StartedInBlock, free_port

PROMETHEUS = Path("/usr/bin/prometheus")
HOST = "127.0.0.1"
LOOPBACK_TARGETS = frozenset({"127.0.0.1", "localhost", "[::1]"})
START_S = 30.0
STOP_S = 10.0
POLL_S = 0.2
REQUEST_S = 5.0
READY_REQUEST_S = 1.0  # short: on a port race, the port's other owner may never answer
PORT_ATTEMPTS = 3  # another process may take the free port between our probe and Prometheus's bind
PORT_TAKEN = "address already in use"  # what Prometheus logs when its listen address is taken
LOG_TAIL_LINES = 30

# never through a proxy from the environment: every request goes straight to our own server on 127.0.0.1
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

Result = list[dict[str, Any]]


def debian_binary(path: Path) -> Path:
    """``path``, a program of Debian's prometheus package; when it is missing, skip the test, or fail it when
    ``CI`` is set."""
    if not os.access(path, os.X_OK):
        message = f"{path.name} is not installed ({path}): run scripts/setup-dev.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def prometheus_binary() -> Path:
    """``/usr/bin/prometheus`` (see :func:`debian_binary`)."""
    return debian_binary(PROMETHEUS)


def values(result: Result) -> list[float]:
    """The sample values of an instant query's result, in its order (``NaN`` and ``+Inf`` included)."""
    return [float(sample["value"][1]) for sample in result]


class PrometheusServer(StartedInBlock):
    """A private Prometheus scraping one loopback target, configured (not started) by the constructor; use it as a
    context manager (or :meth:`start` and :meth:`close`)."""

    def __init__(
        self,
        folder: Path,
        target: str,
        *,
        metrics_path: str = "/metrics",
        bearer_token: str | None = None,
        rule_files: Sequence[Path | str] = (),
        job: str = "probe",
    ) -> None:
        """Write the configuration into ``folder`` (made if missing): ``target`` (``host:port``, a loopback host)
        scraped at ``metrics_path`` every second as ``job``, with ``Authorization: Bearer <bearer_token>`` when
        one is given, and ``rule_files`` evaluated every second."""
        host = target.rpartition(":")[0]
        if host not in LOOPBACK_TARGETS:
            raise ValueError(f"the target {target!r} is not host:port on the loopback interface")
        self.binary = prometheus_binary()
        self.folder = folder
        self.target = target
        self.job = job
        self.config_file = folder / "prometheus.yml"
        self.data_dir = folder / "data"
        self.log_file = folder / "prometheus.log"
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        scrape: dict[str, Any] = {
            "job_name": job,
            "metrics_path": metrics_path,
            "static_configs": [{"targets": [target]}],
        }
        if bearer_token is not None:
            scrape["authorization"] = {"type": "Bearer", "credentials": bearer_token}
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(Path(rule_file).resolve()) for rule_file in rule_files],
            "scrape_configs": [scrape],
        }
        folder.mkdir(parents=True, exist_ok=True)
        # JSON is YAML: no quoting rules of our own to get wrong (a token or path with any character stays intact)
        self.config_file.write_text(json.dumps(config, indent=2) + "\n")

    @property
    def url(self) -> str:
        """The server's base URL (on 127.0.0.1 only)."""
        return f"http://{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server's process runs."""
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = START_S) -> None:
        """Start the server (nothing when it runs) and wait until ``/-/ready`` answers 200, on a new free port
        when another process took the one picked."""
        if self.running:
            return
        deadline = time.monotonic() + timeout
        for _attempt in range(PORT_ATTEMPTS):
            self.port = free_port()
            shutil.rmtree(self.data_dir, ignore_errors=True)
            logged_before = len(self.log_text())
            self._spawn()
            outcome = self._wait_ready(deadline, logged_before)
            if outcome == "ready":
                return
            if outcome == "failed" or time.monotonic() >= deadline:
                break
        raise RuntimeError(self._failure(f"did not become ready (port {self.port})"))

    def close(self) -> None:
        """Stop the server: SIGTERM to its pid, then SIGKILL if it has not ended in time; nothing when stopped (it
        also runs at exit)."""
        process, self._process = self._process, None
        atexit.unregister(self.close)
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_S)

    def query(self, promql: str) -> Result:
        """The result of an instant query (``/api/v1/query``): one ``{"metric": …, "value": [time, "text"]}`` a
        series (a scalar or string result comes as one such sample with no labels). A query the server refuses
        raises ValueError with its error."""
        data = self._api("/api/v1/query", {"query": promql})
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: Result = data["result"]
        return result

    def wait_for(self, promql: str, predicate: Callable[[Result], bool] = bool, timeout_s: float = 30.0) -> Result:
        """Query every 0.2 s until ``predicate`` holds for the result (by default: it is not empty), and return
        that result. At the deadline raise AssertionError with the last result, the targets' health and the end
        of the server's log."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"{promql!r} did not give the result awaited within {timeout_s:g} s; the last one: {result!r}\n"
                    f"targets: {self._targets_health()}\n"
                    f"the end of Prometheus's log ({self.log_file}):\n{self.log_tail()}"
                )
            time.sleep(POLL_S)

    def targets(self) -> Result:
        """The active targets (``/api/v1/targets``): each one's ``scrapeUrl``, ``health`` ("up", "down",
        "unknown"), ``lastError``, ``labels``, ..."""
        active: Result = self._api("/api/v1/targets", {"state": "active"})["activeTargets"]
        return active

    def log_text(self) -> str:
        """Everything the server has logged so far (its stdout and stderr)."""
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _spawn(self) -> None:
        command = [
            str(self.binary),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address={HOST}:{self.port}",
            "--log.level=warn",
        ]
        env = {"PATH": os.environ.get("PATH", os.defpath)}
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.folder,
                env=env,
                start_new_session=True,
            )
        atexit.register(self.close)

    def _wait_ready(self, deadline: float, logged_before: int) -> Literal["ready", "port taken", "failed"]:
        """Wait until ``deadline`` for the server to answer ready; it is stopped when it does not. "port taken" when
        another process had its port: the server logged so (after ``logged_before`` characters of its log), or
        another Prometheus, with data of its own, answered in its place."""
        outcome: Literal["ready", "port taken", "failed"] = "failed"
        while self.running and time.monotonic() < deadline:
            if PORT_TAKEN in self.log_text()[logged_before:]:
                break
            if self._answers_ready():
                ours = self._api("/api/v1/status/flags").get("storage.tsdb.path") == str(self.data_dir)
                outcome = "ready" if ours else "port taken"
                break
            time.sleep(POLL_S)
        if outcome == "failed" and PORT_TAKEN in self.log_text()[logged_before:]:
            outcome = "port taken"
        if outcome != "ready":
            self.close()
        return outcome

    def _answers_ready(self) -> bool:
        """Whether ``/-/ready`` on the server's port answers 200."""
        try:
            with _OPENER.open(f"{self.url}/-/ready", timeout=READY_REQUEST_S) as answer:
                return bool(answer.status == 200)
        except urllib.error.HTTPError as starting:  # 503 while it starts up
            starting.close()
        except OSError:  # not listening yet, or the port's other owner does not answer
            pass
        return False

    def _api(self, path: str, params: dict[str, str] | None = None) -> Any:
        """The ``data`` of a JSON answer of the server's HTTP API."""
        url = f"{self.url}{path}?{urllib.parse.urlencode(params or {})}"
        try:
            with _OPENER.open(url, timeout=REQUEST_S) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as refused:
            with refused:
                try:
                    said = json.load(refused).get("error", "")
                except ValueError:
                    said = ""
            raise ValueError(f"Prometheus refused {path} {params}: HTTP {refused.code} {said}".rstrip()) from None
        except OSError as unreachable:  # refused or timed out: the server died or hangs
            raise RuntimeError(self._failure(f"did not answer {path} ({unreachable})")) from unreachable
        if body.get("status") != "success":
            raise ValueError(f"Prometheus answered {path} {params} with {body!r}")
        return body["data"]

    def _targets_health(self) -> list[dict[str, Any]]:
        try:
            return [{key: target.get(key) for key in ("scrapeUrl", "health", "lastError")} for target in self.targets()]
        except (OSError, ValueError, RuntimeError) as failed:
            return [{"error": f"the targets could not be read: {failed}"}]

    def _failure(self, what: str) -> str:
        return f"Prometheus in {self.folder} {what}; the end of its log ({self.log_file}):\n{self.log_tail()}"
