"""The tests' private PostgreSQL server (tests/postgres_cluster.py), as the state-store tests use it: a database
of each test's own, a password on every TCP connection, loopback only, and an outage a test can cause and end."""

from __future__ import annotations

import psutil
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from tests.postgres_cluster import SUPERUSER, PostgresCluster

pytest_plugins = ["tests.postgres_cluster"]  # the fixtures postgres_cluster and postgres_url


def connect(url: str) -> psycopg.Connection[TupleRow]:
    return psycopg.connect(url, connect_timeout=10)


def database_name(url: str) -> str:
    return str(conninfo_to_dict(url)["dbname"])


def test_a_test_gets_a_database_that_answers_on_its_url(postgres_url: str) -> None:
    with connect(postgres_url) as conn:
        row = conn.execute("SELECT current_user, current_database(), current_setting('server_version_num')::int")
        user, database, version = row.fetchone() or ()
    assert (user, database) == (SUPERUSER, database_name(postgres_url))
    assert version >= 150000


@pytest.mark.parametrize("turn", [1, 2])
def test_each_test_starts_with_an_empty_database_of_its_own(postgres_url: str, turn: int) -> None:
    """Both turns make the same table: had they shared a database, the second would fail."""
    with connect(postgres_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
        conn.execute("CREATE TABLE marker (turn int)")
        conn.execute("INSERT INTO marker VALUES (%s)", [turn])


def test_two_databases_share_no_tables(postgres_cluster: PostgresCluster, postgres_url: str) -> None:
    other = postgres_cluster.create_database()
    try:
        assert database_name(other) != database_name(postgres_url)
        with connect(postgres_url) as conn:
            conn.execute("CREATE TABLE only_here (v int)")
        with connect(other) as conn:
            assert conn.execute("SELECT to_regclass('only_here')").fetchone() == (None,)
    finally:
        postgres_cluster.drop_database(database_name(other))


def test_a_database_is_dropped_with_its_connections_still_open(postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.create_database()
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as held:
        postgres_cluster.drop_database(database_name(url))
        with pytest.raises(psycopg.OperationalError):
            held.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        connect(url)


def test_tcp_connections_need_the_password_and_it_is_never_logged(
    postgres_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent/pgpass")
    without_password = f"host=127.0.0.1 port={postgres_cluster.port} user={SUPERUSER} dbname=postgres"
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        connect(without_password)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        connect(f"{without_password} password={postgres_cluster.password[::-1]}")
    with connect(postgres_cluster.url()) as conn:
        conn.execute("SELECT 1")
    log = postgres_cluster.log_text()
    assert 'password authentication failed for user "sandbox"' in log
    assert postgres_cluster.password not in log


def test_the_local_socket_is_trusted(postgres_cluster: PostgresCluster) -> None:
    local = f"host={postgres_cluster.socket_dir} port={postgres_cluster.port} user={SUPERUSER} dbname=postgres"
    with connect(local) as conn:
        assert conn.execute("SELECT inet_server_addr()").fetchone() == (None,)


def test_the_server_listens_only_on_loopback(postgres_cluster: PostgresCluster) -> None:
    with connect(postgres_cluster.url()) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert conn.execute("SELECT host(inet_server_addr())").fetchone() == ("127.0.0.1",)
    listening = {
        address.laddr.ip
        for address in psutil.net_connections(kind="inet")
        if address.laddr and address.status == psutil.CONN_LISTEN and address.laddr.port == postgres_cluster.port
    }
    assert listening == {"127.0.0.1"}


def test_a_stopped_server_refuses_connections_and_comes_back_with_its_data(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    with connect(postgres_url) as conn:
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('before the outage')")
    with connect(postgres_url) as in_flight:
        postgres_cluster.stop()
        assert not postgres_cluster.running
        with pytest.raises(psycopg.OperationalError):
            in_flight.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError):
        connect(postgres_url)

    postgres_cluster.start()
    with connect(postgres_url) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [("before the outage",)]


def test_a_killed_server_recovers_its_committed_data(postgres_cluster: PostgresCluster, postgres_url: str) -> None:
    with connect(postgres_url) as conn:
        conn.execute("CREATE TABLE kept AS SELECT generate_series(1, 1000) AS n")
    port = postgres_cluster.port
    postgres_cluster.kill()
    assert not postgres_cluster.running
    postgres_cluster.restart()
    assert postgres_cluster.port == port
    with connect(postgres_url) as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (1000,)


@pytest.mark.usefixtures("postgres_cluster")  # skipped, or failed on CI, without PostgreSQL, as the others
def test_closing_a_cluster_stops_its_server_and_removes_its_folder() -> None:
    cluster = PostgresCluster()
    with cluster:
        assert cluster.running
        with connect(cluster.url()) as conn:
            conn.execute("SELECT 1")
    assert not cluster.folder.exists()
    with pytest.raises(psycopg.OperationalError):
        connect(cluster.url())
    cluster.close()  # a second time: nothing to do
