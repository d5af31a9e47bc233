"""What the tenant machinery adds to a warm call: the audit entry and the quota look, beside the call itself.

Run from the repository root (Docker running; PostgreSQL installed: ``scripts/setup-dev.sh``)::

    .venv/bin/python bench/bench_audit.py [--repeat 200]
    .venv/bin/python bench/bench_audit.py --quick     # a smoke run

For each state store, SQLite (``synchronous=FULL``) and PostgreSQL (a private server, ``fsync`` on), one runtime on
the default policy (real Docker), one warm conversation of a named tenant, and three cases interleaved, each
repetition in turn (the order flips every round):

* ``warm call``: ``conversation.call("run_python", {"code": "print(1)"})``, the whole pipeline: its run slot, the
  run in the sandbox's resident executor, the spill check, the decision stored with its audit entry;
* ``a write transaction`` (one row written, committed durably) and ``the same with an audit entry``
  (``state.audit.append_in`` with a call's fields, as a decision's transaction writes it): their difference is
  what the audit trail adds to a call;
* ``quota look``: ``runtime.quota(tenant)`` — what the MCP server adds to every result's ``_meta``.

The shares are over the warm call's p50, every case measured side by side in one run. Sandboxes carry
``io.sandbox-runtime.bench=<run id>``; every conversation is deleted at the end. Numbers are reported, never
asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from benchkit import Met, interleaved, line, print_targets

from sandbox_runtime import Runtime

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for tests/
from tests.postgres_cluster import PostgresCluster

TENANT = "bench-tenant"
AUDIT_SHARE_TARGET = 0.05  # an audit entry should cost at most 5 % of a warm call


def _durable(cluster: PostgresCluster) -> None:
    with psycopg.connect(cluster.url(), autocommit=True, connect_timeout=10) as admin:
        admin.execute("ALTER SYSTEM SET fsync = on")
        admin.execute("ALTER SYSTEM SET full_page_writes = on")
        admin.execute("SELECT pg_reload_conf()")


def measure(name: str, state_dir: Path, url: str | None, label: str, repeat: int) -> list[tuple[str, float]]:
    runtime = Runtime(state_dir, "default", state_url=url, extra_labels={"io.sandbox-runtime.bench": label})
    conversation = runtime.conversation("warm", tenant=TENANT)
    try:
        for _ in range(3):
            conversation.call("run_python", {"code": "print(1)"})
        fields: dict[str, Any] = {
            "tool": "run_python",
            "target": "run_python",
            "status": "ok",
            "failure": None,
            "arguments_sha256": "0" * 64,
            "result_sha256": "1" * 64,
            "result_file_sha256": None,
            "turn_id": "turn-bench",
            "made_by": None,
            "started_at": 0.0,
            "finished_at": 0.0,
        }
        state, key = runtime.state, conversation.key

        def write(audited: bool) -> None:
            with state.engine.transaction() as tx:
                tx.run(  # a row that really changes: every commit is flushed to disk
                    "INSERT INTO turn_totals(conversation_id, turn_id, shown_chars, updated_at) VALUES (?, ?, 0, ?) "
                    "ON CONFLICT(conversation_id, turn_id) DO UPDATE SET updated_at = excluded.updated_at",
                    (key, "bench", time.time()),
                )
                if audited:
                    state.audit.append_in(tx, "call", conversation=key, call_id="bench", tenant=TENANT, **fields)

        cases: dict[str, Callable[[], object]] = {
            "warm call": lambda: conversation.call("run_python", {"code": "print(1)"}),
            "a write transaction": lambda: write(False),
            "the same with an audit entry": lambda: write(True),
            "quota look": lambda: runtime.quota(TENANT),
        }
        samples = interleaved(cases, repeat)
        assert state.audit.verify().ok
    finally:
        conversation.delete()
        runtime.close()
    p50 = {case: statistics.median(values) for case, values in samples.items()}
    base = p50["warm call"]
    print(f"\n{name}")
    line("warm call: run_python print(1), the whole pipeline", samples["warm call"], 1000, "ms")
    for case in ("a write transaction", "the same with an audit entry", "quota look"):
        line(f"{case} (ratio: over the warm call)", samples[case], 1000, "ms", p50[case] / base)
    added = (p50["the same with an audit entry"] - p50["a write transaction"]) / base
    print(f"  {'an audit entry adds to a warm call':<56}{'':>6}{added * base * 1000:>10.3f} ms{'':>13}{added:>7.3f}x")
    return [("audit entry", added), ("quota look", p50["quota look"] / base)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--repeat", type=int, default=200, help="repetitions of each case (default 200)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 repetitions")
    opts = parser.parse_args()
    repeat = 20 if opts.quick else opts.repeat
    label = uuid.uuid4().hex[:12]
    print(f"run id {label}; {repeat} repetitions of each case per store, interleaved; one untimed warm-up each")
    print(f"\n  {'case':<56}{'n':>6}{'p50':>13}{'p90':>13}{'ratio':>8}")
    met: Met = []
    with (
        tempfile.TemporaryDirectory(prefix="sbrt-bench-audit-", dir="/var/tmp", ignore_cleanup_errors=True) as work,
        PostgresCluster() as cluster,
    ):
        _durable(cluster)
        stores = {
            "SQLite (synchronous=FULL)": None,
            "PostgreSQL (fsync on)": cluster.create_database(f"bench_audit_{label}"),
        }
        for index, (name, url) in enumerate(stores.items()):
            shares = measure(name, Path(work, str(index)), url, label, repeat)
            audit_share = dict(shares)["audit entry"]
            met.append(
                (
                    f"audit entry / warm call, {name.split(' ')[0]}",
                    f"<= {AUDIT_SHARE_TARGET:.2f}x",
                    f"{audit_share:.3f}x",
                    audit_share <= AUDIT_SHARE_TARGET,
                )
            )
    print_targets(met)


if __name__ == "__main__":
    main()
