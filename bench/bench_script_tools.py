"""Thirteen tickets whose bodies come from a query, three ways: retyped by the model, delegate_call, one script.

Run from the repository root::

    .venv/bin/python bench/bench_script_tools.py [--repeat 5] [--json]

The "seed playbook" shape: 13 calls of a host tool (``tickets__create_ticket``) whose bodies come from query
results, 89,337 characters of body in all (a SQLite table ``reports(title, body)`` of 13 rows of different lengths:
stack-trace-like lines with library names, tabs, quotes, backslashes and non-ASCII text). The "model" is a fixed
list of calls, each going through the whole pipeline (validation, approval, the record, spill):

* ``retyped``   sql_query (the result spills), then 13 direct tickets__create_ticket calls in one parallel turn,
                every body written out by the model. Its best case: the bodies are copied perfectly, and reading
                them (read_file of the spill, which a real model would need first) is not counted.
* ``delegate``  sql_query, one short run_python script that reads the spilled table file and writes 13 argument
                files, then 13 delegate_call calls in one parallel turn (args_file, the title as an override).
* ``script``    one run_python script that calls sql_query, then tickets__create_ticket 13 times, by sandbox_tools.

Per way: the bytes the model wrote (the JSON of each call's tool name and arguments, UTF-8, counted alike for all),
its calls and turns, the calls the host tool received, the calls the pipeline recorded, and the wall time of the
whole sequence, runtime side only (the sum of its turns; no model). Each sample uses a fresh conversation whose
sandbox and executor already run (an untimed ``run_python("pass")`` through the API first), deleted after, untimed.
The ways are interleaved round-robin per repetition, the order flipping each round, after one untimed warm-up each.
After every sample the host tool must have received exactly the database's 13 (title, body) pairs — in order from
the script; a parallel turn has no order, so there they are matched as a set — or the run stops. Correctness is
the only thing asserted. Every container carries ``io.sandbox-runtime.bench=<uuid>`` and is removed at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
from bench_latency import machine_facts
from benchkit import percentile

from sandbox_runtime.api.runtime import Conversation, Runtime
from sandbox_runtime.models import ToolCall, ToolOutcome
from sandbox_runtime.policy import load_policy
from sandbox_runtime.sandbox.image import executor_image_tag

BENCH_LABEL = "io.sandbox-runtime.bench"
ROWS, TOTAL_CHARS = 13, 89_337
CHARS_PER_TOKEN, TOKENS_PER_S = 4, 50  # the output-time estimate's assumptions (not measured)
TICKET = "tickets__create_ticket"
QUERY = "SELECT title, body FROM reports ORDER BY rowid"
ARGS_FILE = "/mnt/results/args/t{:02d}.json"  # the delegate way's argument files, as its script writes them
LIBS = ("libpthread.so.0", "libc.so.6", "libstdc++.so.6", "libssl.so.3", "libz.so.1", "ld-linux-x86-64.so.2")
FUNCS = ("start_thread", "__libc_start_main", "std::__throw_length_error", "SSL_read", "inflate", "_dl_start")
NOTES = ("état «dégradé»", 'user said "it stops"', "Größe: C:\\build\\io.c", "can't map 'ø' → '∅'", "キャッシュ\t破損")
TICKET_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 200}, "body": {"type": "string"}},
    "required": ["title", "body"],
    "additionalProperties": False,
}
SCRIPT = """\
import sandbox_tools as tools
for row in tools.sql_query(query="SELECT title, body FROM reports ORDER BY rowid").rows():
    tools.tickets__create_ticket(title=row["title"], body=row["body"])
"""
ARGS_SCRIPT = """\
import json, os
with open({spill!r}, encoding="utf-8") as table:
    columns = json.loads(next(table))["columns"]
    rows = [dict(zip(columns, json.loads(line))) for line in table if line.strip()]
os.makedirs("/mnt/results/args", exist_ok=True)
for i, row in enumerate(rows, 1):
    with open(f"/mnt/results/args/t{{i:02d}}.json", "w", encoding="utf-8") as out:
        json.dump({{"body": row["body"]}}, out)
print(len(rows), "argument files")
"""
TURNS = {"retyped": 2, "delegate": 3, "script": 1}
Rows = list[tuple[str, str]]  # (title, body)


def reports() -> Rows:
    """The 13 (title, body) rows: deterministic, of different lengths, exactly TOTAL_CHARS characters of body."""
    weights = [(i * 5) % ROWS + 4 for i in range(ROWS)]
    lengths = [TOTAL_CHARS * w // sum(weights) for w in weights]
    lengths[-1] += TOTAL_CHARS - sum(lengths)
    rows = []
    for i, length in enumerate(lengths):
        lib = LIBS[i % len(LIBS)]
        text = f'Thread {i + 1} "worker-{i}" received SIGSEGV in {lib}; backtrace:'
        for n in itertools.count():
            if len(text) >= length:
                break
            address = (i * 7919 + n * 104_729) % 2**48
            frame = f"{FUNCS[(i + n) % len(FUNCS)]} ({LIBS[(i * 3 + n) % len(LIBS)]}+0x{n * 2_654_435_761 % 65536:x})"
            text += f"\n#{n:02d}\t0x{address:016x} in {frame}\t— {NOTES[(i + n) % len(NOTES)]}"
        rows.append((f"R{i + 1:02d}: crash in {lib}", text[:length]))
    if sum(len(body) for _title, body in rows) != TOTAL_CHARS or len({len(b) for _t, b in rows}) < 2:
        raise AssertionError("the bodies must hold exactly 89,337 characters, in rows of different lengths")
    return rows


def make_database(path: Path, rows: Rows) -> None:
    db = sqlite3.connect(path)
    with db:  # one transaction
        db.execute("CREATE TABLE reports(title TEXT, body TEXT)")
        db.executemany("INSERT INTO reports(title, body) VALUES (?, ?)", rows)
    db.close()


class Model:
    """The scripted model of one sample: its turns through the pipeline, what it wrote, the runtime's time."""

    def __init__(self, conversation: Conversation, prefix: str) -> None:
        self.conversation, self.prefix = conversation, prefix
        self.written_bytes = self.written_chars = self.calls = self.turns = 0
        self.runtime_s = 0.0

    def turn(self, calls: list[tuple[str, dict[str, Any]]]) -> list[ToolOutcome]:
        items = []
        for tool, arguments in calls:
            text = json.dumps({"tool": tool, "arguments": arguments}, ensure_ascii=False)
            self.written_bytes += len(text.encode())
            self.written_chars += len(text)
            items.append(ToolCall(tool=tool, arguments=arguments, call_id=f"{self.prefix}-{self.calls:02d}"))
            self.calls += 1
        self.turns += 1
        start = time.perf_counter()
        outcomes = self.conversation.run_turn(items).outcomes
        self.runtime_s += time.perf_counter() - start
        for outcome in outcomes:
            if outcome.is_error:
                raise RuntimeError(f"{outcome.tool} {outcome.call_id} failed: {outcome.text[:800]}")
        return outcomes


def retyped(model: Model, rows: Rows) -> None:
    model.turn([("sql_query", {"query": QUERY})])
    model.turn([(TICKET, {"title": title, "body": body}) for title, body in rows])


def delegate(model: Model, rows: Rows) -> None:
    (queried,) = model.turn([("sql_query", {"query": QUERY})])
    if queried.descriptor is None:
        raise RuntimeError(f"the query result did not spill: {queried.text[:300]}")
    model.turn([("run_python", {"code": ARGS_SCRIPT.format(spill=queried.descriptor.path)})])
    model.turn(
        [
            ("delegate_call", {"tool": TICKET, "args_file": ARGS_FILE.format(i), "overrides": {"title": title}})
            for i, (title, _body) in enumerate(rows, 1)
        ]
    )


def script(model: Model, _rows: Rows) -> None:
    model.turn([("run_python", {"code": SCRIPT})])


WAYS: dict[str, Callable[[Model, Rows], None]] = {"retyped": retyped, "delegate": delegate, "script": script}


class Bench:
    """The runtime with the ticket tool; one sample of a way in a fresh conversation, checked."""

    def __init__(self, runtime: Runtime, rows: Rows) -> None:
        self.runtime, self.rows = runtime, rows
        self.received: Rows = []
        self.lock = threading.Lock()  # a parallel turn calls the handler from the runtime's workers
        self.numbers = itertools.count(1)
        self.facts: dict[str, dict[str, int]] = {}
        runtime.register_tool(TICKET, self.create_ticket, description="Create a ticket.", input_schema=TICKET_SCHEMA)

    def create_ticket(self, arguments: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.received.append((arguments["title"], arguments["body"]))
            return {"ticket": len(self.received), "body_chars": len(arguments["body"])}

    def sample(self, name: str) -> float:
        number = next(self.numbers)
        conversation = self.runtime.conversation(f"bench-{name}-{number:04d}-{uuid.uuid4().hex[:8]}")
        try:
            conversation.run_python("pass")  # untimed: the sandbox and its executor run, as after any earlier run
            with self.lock:
                self.received.clear()
            model = Model(conversation, f"{name}-{number:04d}")
            WAYS[name](model, self.rows)
            with self.lock:
                received = list(self.received)
            in_order = name == "script"
            if (received if in_order else sorted(received)) != (self.rows if in_order else sorted(self.rows)):
                got = sum(len(body) for _title, body in received)
                raise AssertionError(f"{name}: the tool received {len(received)} tickets, {got:,} body characters, "
                                     f"not the database's {ROWS} rows{' in order' if in_order else ''}")  # fmt: skip
            records = conversation.calls()
            self.facts[name] = {
                "written_bytes": model.written_bytes,
                "written_chars": model.written_chars,
                "model_calls": model.calls,
                "model_turns": model.turns,
                "tool_received": len(received),
                "records": len(records),
                "records_made_by_script": sum(r.made_by is not None for r in records),
            }
            if model.turns != TURNS[name]:
                raise AssertionError(f"{name}: {model.turns} turns, expected {TURNS[name]}")
            return model.runtime_s
        finally:
            conversation.delete()


def measure(bench: Bench, repeat: int) -> dict[str, list[float]]:
    """One untimed warm-up per way, then ``repeat`` rounds over the ways, the order flipping every round."""
    names = list(WAYS)
    for name in names:
        bench.sample(name)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeat):
        for name in names if i % 2 == 0 else names[::-1]:
            samples[name].append(bench.sample(name))
    return samples


def report(bench: Bench, samples: dict[str, list[float]], facts: dict[str, object], repeat: int) -> dict[str, Any]:
    ways: dict[str, dict[str, Any]] = {}
    for name, values in samples.items():
        estimate = bench.facts[name]["written_chars"] / CHARS_PER_TOKEN / TOKENS_PER_S  # an estimate, not measured
        p50, p90 = statistics.median(values), percentile(values, 90)
        ways[name] = {**bench.facts[name], "wall_p50_s": p50, "wall_p90_s": p90, "wall_s": values}
        ways[name]["estimated_model_output_s"] = estimate
    script_way = ways["script"]
    ratios = {
        f"{what} {name} / script": ways[name][key] / script_way[key]
        for what, key in (("written bytes", "written_bytes"), ("wall p50", "wall_p50_s"))
        for name in ("retyped", "delegate")
    }
    return {"machine": facts, "repeat": repeat, "body_chars": TOTAL_CHARS, "ways": ways, "ratios": ratios}


def print_table(result: dict[str, Any]) -> None:
    print("machine: " + ", ".join(f"{k}={v}" for k, v in result["machine"].items()))
    print(
        f"repeat={result['repeat']}: the ways interleaved round-robin (order flips each round), one untimed warm-up "
        f"each; 13 tickets, {result['body_chars']:,} body characters; only correctness is asserted"
    )
    print(f"\n{'way':<10}{'written B':>11}{'calls':>7}{'turns':>7}{'tool got':>10}{'records':>9}", end="")
    print(f"{'by script':>11}{'p50 s':>9}{'p90 s':>9}")
    for name, w in result["ways"].items():
        print(
            f"{name:<10}{w['written_bytes']:>11,}{w['model_calls']:>7}{w['model_turns']:>7}{w['tool_received']:>10}"
            f"{w['records']:>9}{w['records_made_by_script']:>11}{w['wall_p50_s']:>9.3f}{w['wall_p90_s']:>9.3f}"
        )
    print()
    for key, value in result["ratios"].items():
        print(f"ratio {key:<32} {value:8.2f}x")
    print(
        f"\nESTIMATE, not a measurement: the model's output time for what it wrote, at ~{CHARS_PER_TOKEN} characters "
        f"per token and {TOKENS_PER_S} tokens/s: "
        + ", ".join(f"{n} ~{w['estimated_model_output_s']:.0f} s" for n, w in result["ways"].items())
    )
    print("(retyped: the bodies copied perfectly, and reading them first is not counted; its best case)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed samples per way (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    opts = parser.parse_args()

    rows = reports()
    label = uuid.uuid4().hex
    work = Path(tempfile.mkdtemp(prefix="sandbox-bench-script-tools-"))
    database = work / "reports.sqlite3"
    make_database(database, rows)
    changes = {"sql": {"database_path": str(database)}, "script_tools": {"allowed": ["sql_query", "tickets__*"]}}
    policy = load_policy("default").changed(changes, "bench_script_tools")
    client = docker.from_env()
    runtime = Runtime(
        work / "state",
        policy,
        image=executor_image_tag(),
        extra_labels={BENCH_LABEL: label},
        sweep_on_start=False,
        reap_interval_s=None,
        retention_interval_s=None,
    )
    try:
        bench = Bench(runtime, rows)
        samples = measure(bench, opts.repeat)
        result = report(bench, samples, machine_facts(client, runtime), opts.repeat)
        if opts.json:
            print(json.dumps(result, indent=2))
        else:
            print_table(result)
    finally:
        for record in runtime.state.conversations():  # every conversation this run made, even after an error
            runtime.conversation(record.id).delete()
        runtime.close()
        for container in client.containers.list(all=True, filters={"label": f"{BENCH_LABEL}={label}"}):
            container.remove(force=True)
        client.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
