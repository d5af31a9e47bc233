"""A private PostgreSQL server for the state-store tests: real, never the machine's own cluster.

:class:`PostgresCluster` makes a cluster of its own in a fresh folder under the temporary directory (``initdb``),
starts it listening only on 127.0.0.1 on a free port, with its unix socket in that folder, and removes it all on
:meth:`~PostgresCluster.close`. TCP connections log in as the superuser ``sandbox`` with a random password
(scram-sha-256), so a test can check that the password never shows in a log; the local socket is trusted. The
server can be stopped, killed and started again on the same data and port, as tests of an outage need.

The fixtures: ``postgres_cluster`` (one server per test session) and ``postgres_url`` (a fresh database for one
test, dropped after it). PostgreSQL refuses to run as root, so when the tests run as root the server's commands
(``initdb``, ``pg_ctl``) run as the ``postgres`` system user, which owns the cluster's folder. Only this server is
ever stopped: by its data directory (``pg_ctl -D``) or, as a last resort, by its own postmaster's pid.

Use the fixtures with ``pytest_plugins = ["tests.postgres_cluster"]``. The module holds no ``assert``, so pytest
need not rewrite it (PYTEST_DONT_REWRITE): naming it as a plugin after importing it is then no error.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from tests.local_servers import StartedInBlock, free_port

SUPERUSER = "sandbox"
SERVER_USER = "postgres"  # the system user the server runs as when the tests run as root
START_S = 60.0
STOP_S = 30.0
CONNECT_S = 10
# fit for tests: no durability against a machine crash (the folder is thrown away anyway), small memory
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "'32MB'",
}
HBA = "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"


def postgres_bin_dir() -> Path | None:
    """The newest installed PostgreSQL's programs (Debian's /usr/lib/postgresql/<version>/bin, else ``pg_config
    --bindir``), or None when PostgreSQL is not installed."""
    debian = [initdb.parent for initdb in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    if debian:
        return max(debian, key=lambda bin_dir: [int(part) for part in bin_dir.parent.name.split(".") if part.isdigit()])
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=False)
    bin_dir = Path(found.stdout.strip())
    return bin_dir if found.returncode == 0 and (bin_dir / "initdb").is_file() else None


class PostgresCluster(StartedInBlock):
    """A private PostgreSQL cluster in a folder of its own, made (``initdb``) but not started by the constructor."""

    def __init__(self, parent: Path | None = None) -> None:
        """Make the cluster in a new folder under ``parent`` (the temporary directory by default), which the
        server's user must be able to traverse."""
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed: run scripts/setup-dev.sh")
        self.bin_dir = bin_dir
        self.password = secrets.token_urlsafe(24)
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="sandbox-runtime-pg-", dir=parent))
        self.data_dir = self.folder / "data"
        self.log_file = self.folder / "server.log"
        self._closed = False
        atexit.register(self.close)
        try:
            self._initdb()
        except BaseException:
            self.close()
            raise

    @property
    def socket_dir(self) -> Path:
        """Where the server's unix socket is (connections on it are trusted: no password)."""
        return self.folder

    @property
    def running(self) -> bool:
        """Whether this cluster's server runs (``pg_ctl status`` on its data directory)."""
        return not self._closed and self._server_runs()

    def url(self, database: str = "postgres") -> str:
        """The URL a client connects to ``database`` with, over TCP, as the superuser, password included."""
        credentials = f"{SUPERUSER}:{quote(self.password, safe='')}"
        return f"postgresql://{credentials}@127.0.0.1:{self.port}/{quote(database, safe='')}"

    def socket_url(self, database: str) -> str:
        """The URL of ``database`` over the local socket, which is trusted: no password (a policy file may name
        it, as a policy's ``state.url`` never carries one)."""
        host = quote(str(self.socket_dir), safe="")
        return f"postgresql://{SUPERUSER}@/{quote(database, safe='')}?host={host}&port={self.port}"

    def start(self, timeout: float = START_S) -> None:
        """Start the server (nothing when it runs) and wait until it accepts connections."""
        if self._closed:
            raise RuntimeError(f"the PostgreSQL cluster in {self.folder} is closed")
        if self.running:
            return
        deadline = time.monotonic() + timeout
        started = self._pg_ctl("start", "-l", str(self.log_file), "-t", str(round(timeout)), timeout=timeout + 10)
        if started.returncode != 0:
            raise RuntimeError(self._failure("did not start", started))
        while not self._ready():
            if time.monotonic() > deadline:
                raise RuntimeError(self._failure(f"accepts no connections {timeout:.0f} s after its start"))
            time.sleep(0.1)

    def stop(self, timeout: float = STOP_S) -> None:
        """Stop the server cleanly (``pg_ctl stop -m fast``: open connections are ended); nothing when stopped."""
        self._stop("fast", timeout)

    def kill(self, timeout: float = STOP_S) -> None:
        """Stop the server at once, as a crash would (``-m immediate``: recovery runs at the next start)."""
        self._stop("immediate", timeout)

    def restart(self, timeout: float = START_S) -> None:
        """Stop the server and start it again, on the same data and port."""
        self.stop()
        self.start(timeout)

    def create_database(self, name: str | None = None) -> str:
        """Create a database (by default with a new unique name) and return its URL."""
        name = name or f"test_{uuid.uuid4().hex[:16]}"
        with self._admin() as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, ending its open connections first; nothing when it does not exist."""
        with self._admin() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                [name],
            )
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def log_text(self) -> str:
        """Everything the server has logged so far."""
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def close(self) -> None:
        """Stop the server and remove the cluster's folder; nothing the second time (it also runs at exit)."""
        if self._closed:
            return
        try:
            if self.data_dir.is_dir():
                self._stop_for_good()
        finally:
            self._closed = True
            atexit.unregister(self.close)
            shutil.rmtree(self.folder, ignore_errors=True)

    def _initdb(self) -> None:
        password_file = self.folder / "password"
        password_file.write_text(self.password + "\n")
        password_file.chmod(0o600)
        self._hand_over(self.folder, password_file)
        made = self._run(
            "initdb",
            *("-D", str(self.data_dir), "-U", SUPERUSER, f"--pwfile={password_file}"),
            *("--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C"),
            *("--no-sync", "--no-instructions"),
            timeout=START_S,
        )
        password_file.unlink()
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed in {self.folder}: {made.stderr.strip() or made.stdout.strip()}")
        settings = {**SETTINGS, "port": str(self.port), "unix_socket_directories": f"'{self.socket_dir}'"}
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# the tests' private cluster (tests/postgres_cluster.py)\n")
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        (self.data_dir / "pg_hba.conf").write_text(HBA)

    def _as_server_user(self) -> bool:
        return os.geteuid() == 0

    def _hand_over(self, *paths: Path) -> None:
        """Give ``paths`` to the user the server runs as (initdb and the server refuse to run as root)."""
        if self._as_server_user():
            for path in paths:
                shutil.chown(path, SERVER_USER, SERVER_USER)

    def _run(self, program: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run one of PostgreSQL's programs as the server's user, in the cluster's folder, bounded."""
        command = [str(self.bin_dir / program), *args]
        if self._as_server_user():
            command = ["setpriv", f"--reuid={SERVER_USER}", f"--regid={SERVER_USER}", "--init-groups", "--", *command]
        env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"}
        return subprocess.run(
            command, capture_output=True, text=True, cwd=self.folder, env=env, timeout=timeout, check=False
        )

    def _pg_ctl(self, action: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return self._run("pg_ctl", action, "-D", str(self.data_dir), "-w", *args, timeout=timeout)

    def _ready(self) -> bool:
        ready = self._run("pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port), "-t", "2", timeout=10)
        return ready.returncode == 0

    def _server_runs(self) -> bool:
        return self._pg_ctl("status", timeout=STOP_S).returncode == 0

    def _stop(self, mode: str, timeout: float) -> None:
        if self._closed or not self._server_runs():
            return
        stopped = self._pg_ctl("stop", "-m", mode, "-t", str(round(timeout)), timeout=timeout + 10)
        if stopped.returncode != 0:
            raise RuntimeError(self._failure(f"did not stop ({mode})", stopped))

    def _stop_for_good(self) -> None:
        """Stop the server however it takes: fast, then immediate, then SIGKILL to its own postmaster."""
        for mode in ("fast", "immediate"):
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._stop(mode, STOP_S)
                return
        with contextlib.suppress(OSError, ValueError, IndexError):
            os.kill(int((self.data_dir / "postmaster.pid").read_text().split()[0]), signal.SIGKILL)

    def _admin(self) -> psycopg.Connection[TupleRow]:
        return psycopg.connect(self.url(), autocommit=True, connect_timeout=CONNECT_S)

    def _failure(self, what: str, result: subprocess.CompletedProcess[str] | None = None) -> str:
        said = f" ({(result.stderr or result.stdout).strip()})" if result is not None else ""
        tail = "\n".join(self.log_text().splitlines()[-30:])
        return f"PostgreSQL in {self.folder} {what}{said}; the end of its log:\n{tail}"


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """One private PostgreSQL server for the test session. Without PostgreSQL the test is skipped, or fails when
    ``CI`` is set (CI must never pass without these tests)."""
    if postgres_bin_dir() is None:
        message = "PostgreSQL is not installed: run scripts/setup-dev.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> Iterator[str]:
    """The URL of a fresh database of this test's own, dropped after it (best effort)."""
    postgres_cluster.start()  # back up if an earlier test left it stopped
    name = f"test_{uuid.uuid4().hex[:16]}"
    url = postgres_cluster.create_database(name)
    yield url
    with contextlib.suppress(psycopg.Error):
        postgres_cluster.drop_database(name)
