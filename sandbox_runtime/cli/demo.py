"""The README's main job: a scripted conversation that walks the data path end to end, no model needed.

The "model" is a fixed list of tool calls, each going through the same pipeline a real one would (spill, turn
budget, stored decisions, execution record). It queries a sample SQLite database, exports from the spilled path,
builds a DOCX report with a script passed by path, shows a failure's short message and full error file, sends a
large body to a tool through ``delegate_call`` with an arguments file, lets one short script send a ticket per
region to that tool itself (``sandbox_tools``: the rows never pass through the "model"), attaches the report, and
ends with the files made and the bytes the "model" wrote against the bytes the data path moved.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, TextIO

from sandbox_runtime.api.runtime import Conversation, Runtime, default_state_dir
from sandbox_runtime.cli.sample_data import make_sample_database
from sandbox_runtime.errors import ConversationInUse
from sandbox_runtime.pipeline.dispatch import ToolOutcome
from sandbox_runtime.policy import Policy, load_policy

__all__ = ["DEMO_CONVERSATION", "run_demo"]

DEMO_CONVERSATION = "demo"

_REPORT_SCRIPT = '''\
"""Orders report: reads the spilled query result by path, writes a DOCX. Run: report.py SPILL OUT."""
import json
import sys
from collections import defaultdict

from docx import Document

spill, target = sys.argv[1], sys.argv[2]
with open(spill, encoding="utf-8") as table:
    header = json.loads(next(table))
    col = {name: i for i, name in enumerate(header["columns"])}
    rows = [json.loads(line) for line in table]
by_region = defaultdict(lambda: [0, 0.0])
for row in rows:
    by_region[row[col["region"]]][0] += 1
    by_region[row[col["region"]]][1] += row[col["total"]]
document = Document()
document.add_heading("Orders by region", level=1)
document.add_paragraph(f"{len(rows)} orders that were not cancelled, read from {spill}.")
grid = document.add_table(rows=1, cols=3)
grid.style = "Light Grid Accent 1"
for cell, title in zip(grid.rows[0].cells, ("Region", "Orders", "Revenue")):
    cell.text = title
for region, (count, revenue) in sorted(by_region.items(), key=lambda item: -item[1][1]):
    cells = grid.add_row().cells
    cells[0].text, cells[1].text, cells[2].text = region, str(count), f"{revenue:,.2f}"
document.save(target)
print(f"report: {len(by_region)} regions, {len(rows)} orders -> {target}")
'''

_FAILING_SCRIPT = """\
import json
with open("{spill}", encoding="utf-8") as table:
    header = json.loads(next(table))
    rows = [dict(zip(header["columns"], json.loads(line))) for line in table]
print(sum(row["amount"] for row in rows))
"""

_ARGS_SCRIPT = """\
import json
with open("{spill}", encoding="utf-8") as table:
    header = json.loads(next(table))
    rows = [dict(zip(header["columns"], json.loads(line))) for line in table]
lines = [f"{{r['order_id']}}  {{r['ordered_on']}}  {{r['status']:<9}} {{r['customer']:<22}} {{r['product']:<24}} "
         f"{{r['quantity']:>3}} x {{r['unit_price']:>8.2f}} = {{r['total']:>10.2f}}" for r in rows]
body = "Orders to reconcile with the warehouse:\\n" + "\\n".join(lines)
with open("/mnt/results/args/ticket.json", "w", encoding="utf-8") as out:
    json.dump({{"title": f"Reconcile {{len(lines)}} orders", "body": body}}, out)
print(f"args file: {{len(body):,}} characters of body")
"""

_TICKETS_BY_SCRIPT = """\
import sandbox_tools as tools
regions = tools.sql_query(query="SELECT region, COUNT(*) AS orders FROM orders WHERE status != 'cancelled' "
                                "GROUP BY region ORDER BY region")
for region in regions.rows():
    found = tools.sql_query(
        query="SELECT order_id, customer, total FROM orders WHERE region = ? AND status != 'cancelled' "
              "ORDER BY total DESC",
        params=[region["region"]],
    )
    body = "\\n".join(f"{r['order_id']}  {r['customer']:<22} {r['total']:>10.2f}" for r in found.rows())
    ticket = tools.tickets__create_ticket(title=f"Review the {region['orders']} orders of {region['region']}",
                                          body=body, priority=3)
    print(ticket.text)
"""

_TICKET_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 200},
        "body": {"type": "string"},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["title", "body"],
    "additionalProperties": False,
}


class _Script:
    """The scripted model: every call goes through the pipeline; what the model wrote is counted."""

    def __init__(self, conversation: Conversation, out: TextIO) -> None:
        self.conversation = conversation
        self.out = out
        self.written_bytes = 0
        self.surprises: list[str] = []
        self.files: list[tuple[str, str]] = []

    def step(self, title: str) -> None:
        print(f"\n== {title}", file=self.out, flush=True)

    def call(self, tool: str, arguments: dict[str, Any], call_id: str) -> ToolOutcome:
        self.written_bytes += len(json.dumps({"tool": tool, "arguments": arguments}, ensure_ascii=False).encode())
        started = time.monotonic()
        outcome = self.conversation.call(tool, arguments, call_id=call_id)
        took = time.monotonic() - started
        print(f"-> {tool} ({took:.2f} s){' ERROR' if outcome.is_error else ''}", file=self.out)
        print(_indent(outcome.text), file=self.out)
        return outcome

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.surprises.append(what)
            print(f"!! unexpected: {what}", file=self.out)

    def made(self, path: str | None, what: str) -> None:
        if path:
            self.files.append((path, what))


def _indent(text: str, limit: int = 900) -> str:
    shown = text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit:,} more characters]"
    return "\n".join(f"   {line}" for line in shown.splitlines())


def demo_policy(policy: str | Policy, database: Path) -> Policy:
    """The chosen policy with the demo's database configured for ``sql_query``."""
    base = policy if isinstance(policy, Policy) else load_policy(policy)
    allowed = [*base.script_tools.allowed, "tickets__*"]  # scripts may file tickets too
    changes = {"sql": {"database_path": str(database)}, "script_tools": {"allowed": allowed}}
    return base.changed(changes, "the demo's policy")


def run_demo(
    state_dir: str | Path | None = None, policy: str | Policy = "default", *, out: TextIO, **runtime_options: Any
) -> int:
    """Play the scripted conversation; 0 when every step behaved as expected."""
    state = Path(state_dir) if state_dir is not None else default_state_dir()
    database = make_sample_database(state / "demo" / "shop.sqlite3", rows=360)
    print(f"sample database: {database} (table orders, 360 rows)", file=out)
    tickets: list[dict[str, Any]] = []

    def create_ticket(arguments: dict[str, Any]) -> dict[str, Any]:
        tickets.append(arguments)
        return {"ticket": 4711 + len(tickets), "title": arguments["title"], "body_chars": len(arguments["body"])}

    options: dict[str, Any] = {"reap_interval_s": None, "retention_interval_s": None, **runtime_options}
    with Runtime(state, demo_policy(policy, database), **options) as runtime:
        runtime.register_tool(
            "tickets__create_ticket",
            create_ticket,
            description="Create a ticket in the team's tracker.",
            input_schema=_TICKET_SCHEMA,
        )
        conversation = _fresh_conversation(runtime)
        script = _Script(conversation, out)
        try:
            _play(script, tickets)
        finally:
            conversation.close()
        _summary(script, conversation)
    if script.surprises:
        print(f"\ndemo had {len(script.surprises)} surprises: {'; '.join(script.surprises)}", file=out)
        return 1
    print("\ndemo finished: every step behaved as expected", file=out)
    return 0


def _fresh_conversation(runtime: Runtime) -> Conversation:
    """The demo conversation, empty: the last run's files make way (one demo conversation, fresh each time).
    Another live process using it (a demo still running, a ``serve`` it was named to) is
    :class:`ConversationInUse`, naming that process: its files are left alone."""
    if runtime.state.conversation(DEMO_CONVERSATION) is not None:
        mine = runtime.manager.lease.id
        others = [h for h in runtime.state.leases.live_holds(DEMO_CONVERSATION) if h.lease_id != mine]
        if others:
            holder = others[0]
            raise ConversationInUse(
                f"the demo conversation {DEMO_CONVERSATION!r} in {runtime.state_dir} is in use by process "
                f"{holder.pid} on {holder.host}; wait for it to finish (or stop it), or give another --state-dir"
            )
        runtime.conversation(DEMO_CONVERSATION).delete()
    return runtime.conversation(DEMO_CONVERSATION)  # after a deletion: the id opened again, new and empty


def _play(s: _Script, tickets: list[dict[str, Any]]) -> None:
    s.step("1. the sandbox: no network but loopback, a read-only root, a non-root user")
    probe = s.call(
        "run_python",
        {
            "code": "import os\nprint('interfaces:', sorted(os.listdir('/sys/class/net')), 'uid:', os.getuid())\n"
            "try:\n    open('/etc/x', 'w')\nexcept OSError as e:\n    print('writing /etc:', e.strerror)\n"
        },
        "c1",
    )
    s.expect("['lo']" in probe.text, "the sandbox should only have lo")

    s.step("2. sql_query: the rows go to a file before the model sees them")
    query = "SELECT * FROM orders WHERE status != 'cancelled' ORDER BY ordered_on, order_id"
    queried = s.call("sql_query", {"query": query}, "c2")
    spill = queried.descriptor
    s.expect(spill is not None and spill.rows is not None and spill.rows > 250, "the query result should spill")
    if spill is None:
        return
    s.made(spill.path, f"spill: {spill.rows} rows x {len(spill.columns or [])} columns")

    s.step("3. export_table from the path: chosen columns, sorted, to CSV and XLSX")
    columns = ["order_id", "ordered_on", "customer", "region", "total"]
    for call_id, fmt, sort in (("c3", "csv", "total"), ("c4", "xlsx", "ordered_on")):
        direction = "desc" if sort == "total" else "asc"
        exported = s.call(
            "export_table",
            {"source": spill.path, "format": fmt, "columns": columns, "sort": {"column": sort, "direction": direction}},
            call_id,
        )
        d = exported.descriptor
        s.expect(d is not None and d.rows == spill.rows, f"the {fmt} export should have every row")
        if d is not None:
            s.made(d.path, f"{fmt.upper()} export: {d.rows} rows, sorted by {sort} {direction}")

    s.step("4. a report script, written once and run by path, reads the spill and builds a DOCX")
    s.call("write_file", {"path": "/mnt/results/scripts/report.py", "content": _REPORT_SCRIPT}, "c5")
    report_path = "/mnt/results/exports/orders-report.docx"
    built = s.call(
        "run_python", {"script_path": "/mnt/results/scripts/report.py", "args": [spill.path, report_path]}, "c6"
    )
    s.expect(not built.is_error and "report:" in built.text, "the report script should succeed")
    s.made(report_path, "DOCX report, built in the sandbox")

    s.step("5. a failing script: a short message keeps the exception line; the full error is in a file")
    failed = s.call("run_python", {"code": _FAILING_SCRIPT.format(spill=spill.path)}, "c7")
    s.expect(failed.is_error and "KeyError: 'amount'" in failed.text, "the failure should name KeyError: 'amount'")
    s.made(failed.error_path, "the failure's full error text")

    s.step("6. delegate_call: a script writes a large ticket body to an args file; a short call sends it")
    s.call("run_python", {"code": _ARGS_SCRIPT.format(spill=spill.path)}, "c8")
    s.made("/mnt/results/args/ticket.json", "arguments file for delegate_call")
    sent = s.call(
        "delegate_call",
        {
            "tool": "tickets__create_ticket",
            "args_file": "/mnt/results/args/ticket.json",
            "overrides": {"priority": 2},
        },
        "c9",
    )
    s.expect(not sent.is_error and len(tickets) == 1, "the ticket tool should get the body")
    if tickets:
        body = tickets[0]["body"].encode()
        print(
            f"   the tool received {len(body):,} bytes of body (sha256 {hashlib.sha256(body).hexdigest()[:16]}…), "
            f"priority {tickets[0].get('priority')}",
            file=s.out,
        )

    s.step("7. a script calls tools itself: one ticket per region, bodies from the query, none written by the model")
    filed = s.call("run_python", {"code": _TICKETS_BY_SCRIPT}, "c10")
    by_script = tickets[1:]
    s.expect(not filed.is_error and len(by_script) >= 3, "the script should file a ticket per region")
    print(
        f"   the tool received {len(by_script)} tickets with {sum(len(t['body'].encode()) for t in by_script):,} "
        "bytes of body from one script; the model wrote only the script",
        file=s.out,
    )

    s.step("8. attach_file: the report becomes a download for the user (kept past the spill's retention)")
    attached = s.call("attach_file", {"path": report_path, "filename": "Orders report.docx"}, "c11")
    s.expect(not attached.is_error, "the report should be attached")


def _summary(s: _Script, conversation: Conversation) -> None:
    root = conversation.folders.results
    mount = conversation.runtime.policy.sandbox.results_mount_path
    rows = []
    for path, what in s.files:
        host = root / path.removeprefix(mount + "/")
        rows.append((path, host.stat().st_size if host.is_file() else 0, what))
    rows += [(a.host_path, a.bytes, f"attachment {a.filename!r} (a download)") for a in conversation.attachments()]
    calls = conversation.calls()
    delivered = sum(len((c.expanded or "").encode()) for c in calls)  # what delegate_call sent
    by_scripts = sum(len((c.arguments or "").encode()) for c in calls if c.made_by is not None)
    moved = sum(size for _path, size, _what in rows) + delivered + by_scripts
    print("\n== files made (open them: they are real)", file=s.out)
    width = max((len(path) for path, _size, _what in rows), default=10)
    for path, size, what in rows:
        print(f"   {path:<{width}}  {size:>9,} bytes  {what}", file=s.out)
    print(f"   ({mount} is {root} on this machine)", file=s.out)
    print(
        f"\nbytes the model wrote (every call's arguments): {s.written_bytes:>9,}\n"
        f"bytes the data path moved for it:               {moved:>9,} "
        f"({moved / max(s.written_bytes, 1):.1f} times as much: the files written, plus the {delivered:,} bytes "
        f"delegate_call sent and the {by_scripts:,} bytes of arguments scripts sent to tools)",
        file=s.out,
    )
