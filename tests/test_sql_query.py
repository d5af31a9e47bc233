"""sql_query: a read-only query tool whose rows arrive as a typed table file, and which can never write."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sandbox_runtime import Runtime
from sandbox_runtime.cli.sample_data import SAMPLE_ORDER_COLUMNS, make_sample_database
from sandbox_runtime.policy import policy_from_mapping
from tests.conftest import RuntimeFactory

ENDLESS = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT x FROM n"


@pytest.fixture
def runtime_factory(fake_runtime_factory: RuntimeFactory) -> RuntimeFactory:
    """No test here starts a sandbox: runtimes on the fake backend, no engine needed."""
    return fake_runtime_factory


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return make_sample_database(tmp_path / "shop.sqlite3", rows=360)


def sql_runtime(runtime_factory: RuntimeFactory, database: Path, **sql: object) -> Runtime:
    return runtime_factory(policy_from_mapping({"sql": {"database_path": str(database), **sql}}))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_query_of_360_orders_spills_as_a_typed_table_the_model_can_pass_on(
    runtime_factory: RuntimeFactory, database: Path
) -> None:
    runtime = sql_runtime(runtime_factory, database)
    conversation = runtime.conversation("sql-orders")

    outcome = conversation.call("sql_query", {"query": "SELECT * FROM orders ORDER BY order_id"}, call_id="q1")

    assert not outcome.is_error, outcome.text
    d = outcome.descriptor
    assert d is not None
    assert d.format == "table"
    assert (d.rows, d.columns) == (360, list(SAMPLE_ORDER_COLUMNS))
    assert d.columns is not None
    types = dict(zip(d.columns, d.column_types or [], strict=True))
    assert (types["order_id"], types["quantity"], types["unit_price"], types["customer"]) == (
        "integer",
        "integer",
        "number",
        "string",
    )
    lines = (conversation.folders.results / d.path.removeprefix("/mnt/results/")).read_text().splitlines()
    assert len(lines) == 1 + 360
    assert json.loads(lines[1])[0] == 10_001
    exported = conversation.call(
        "export_table", {"source": d.path, "format": "csv", "columns": ["order_id", "total"]}, call_id="e1"
    )
    assert not exported.is_error, exported.text
    assert exported.descriptor is not None
    assert exported.descriptor.rows == 360
    saved = {s.call_id: s.descriptor for s in conversation.spills()}
    assert (saved["q1"].path, saved["e1"].format) == (d.path, "csv")


def test_a_small_result_stays_inline_and_params_bind_values(runtime_factory: RuntimeFactory, database: Path) -> None:
    runtime = sql_runtime(runtime_factory, database)
    outcome = runtime.conversation("sql-small").call(
        "sql_query", {"query": "SELECT COUNT(*) AS n FROM orders WHERE order_id <= ?", "params": [10_010]}
    )
    assert not outcome.is_error
    assert outcome.descriptor is None
    assert json.loads(outcome.text) == {"columns": ["n"], "rows": [[10]]}


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO orders (order_id) VALUES (1)",
        "UPDATE orders SET total = 0",
        "DELETE FROM orders",
        "DROP TABLE orders",
        "CREATE TABLE t (x)",
        "CREATE TEMP TABLE t AS SELECT 1",
        "ATTACH DATABASE '/tmp/sandbox-runtime-sql-attach.db' AS other",
        "PRAGMA writable_schema = ON",
        "PRAGMA query_only = OFF",
        "VACUUM",
        "SELECT 1; DELETE FROM orders",
    ],
)
def test_no_statement_can_write_and_the_file_is_unchanged(
    runtime_factory: RuntimeFactory, database: Path, statement: str
) -> None:
    before = digest(database)
    runtime = sql_runtime(runtime_factory, database)
    outcome = runtime.conversation("sql-write").call("sql_query", {"query": statement})
    assert outcome.is_error
    assert "QueryFailed" in outcome.text
    assert digest(database) == before
    assert not Path("/tmp/sandbox-runtime-sql-attach.db").exists()
    count = runtime.conversation("sql-write").call("sql_query", {"query": "SELECT COUNT(*) FROM orders"})
    assert json.loads(count.text)["rows"] == [[360]]


def test_bad_sql_is_an_error_naming_sqlites_reason(runtime_factory: RuntimeFactory, database: Path) -> None:
    runtime = sql_runtime(runtime_factory, database)
    outcome = runtime.conversation("sql-bad").call("sql_query", {"query": "SELECT nope FROM orders"})
    assert outcome.is_error
    assert "no such column: nope" in outcome.text


def test_a_query_that_runs_too_long_is_stopped_and_what_came_is_kept(
    runtime_factory: RuntimeFactory, database: Path
) -> None:
    runtime = sql_runtime(runtime_factory, database, timeout_s=0.5, rows_max=100_000_000)
    outcome = runtime.conversation("sql-slow").call("sql_query", {"query": ENDLESS}, call_id="slow")
    assert outcome.is_error
    assert "sql.timeout_s = 0.5 s" in outcome.text
    assert "[incomplete: the rows stopped after" in outcome.text
    assert outcome.descriptor is not None
    assert (outcome.descriptor.rows or 0) > 0


def test_more_rows_than_the_cap_are_cut_with_a_marker(runtime_factory: RuntimeFactory, database: Path) -> None:
    runtime = sql_runtime(runtime_factory, database, rows_max=1000)
    outcome = runtime.conversation("sql-cap").call("sql_query", {"query": ENDLESS})
    assert not outcome.is_error
    assert outcome.descriptor is not None
    assert outcome.descriptor.rows == 1000
    assert "[cut at sql.rows_max = 1,000 rows" in outcome.text


def test_without_a_database_there_is_no_sql_query_tool(runtime_factory: RuntimeFactory, tmp_path: Path) -> None:
    assert "sql_query" not in runtime_factory().tools
    runtime = runtime_factory(policy_from_mapping({"sql": {"database_path": str(tmp_path / "missing.sqlite3")}}))
    outcome = runtime.conversation("sql-missing").call("sql_query", {"query": "SELECT 1"})
    assert outcome.is_error
    assert "does not exist" in outcome.text
    assert not (tmp_path / "missing.sqlite3").exists()
