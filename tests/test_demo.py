"""The README's main job: `sandbox-runtime demo` plays the whole data path and leaves real files behind."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import docx

from tests.conftest import SESSION, TEST_LABEL, RuntimeFactory

DEMO_S = 300


def _demo(state: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sandbox_runtime.cli.main", "--state-dir", str(state)]
    command += ["--label", f"{TEST_LABEL}={SESSION}", "demo"]
    return subprocess.run(command, capture_output=True, text=True, timeout=DEMO_S, check=False)


def test_the_demo_plays_every_step_and_its_files_open_run_after_run(
    runtime_factory: RuntimeFactory, served_state: Path
) -> None:
    first = _demo(served_state)
    assert first.returncode == 0, first.stdout + first.stderr
    done = _demo(served_state)  # users run the main command again, in the same state directory
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for heading in ("== 2. sql_query", "== 3. export_table", "== 5. a failing script", "== 6. delegate_call"):
        assert heading in out
    assert "KeyError: 'amount'" in out
    assert "bytes the model wrote" in out
    assert "demo finished: every step behaved as expected" in out

    runtime = runtime_factory(state_dir=served_state)
    (record,) = runtime.state.conversations()
    conversation = runtime.conversation_by_key(record.id)
    results = conversation.folders.results
    with (results / "exports" / "sql_query-c2.csv").open(newline="", encoding="utf-8") as exported:
        rows = list(csv.reader(exported))
    assert rows[0] == ["order_id", "ordered_on", "customer", "region", "total"]
    totals = [float(row[4]) for row in rows[1:]]
    assert totals == sorted(totals, reverse=True)
    (attachment,) = conversation.attachments()
    report = docx.Document(attachment.host_path)
    assert report.paragraphs[0].text == "Orders by region"
    assert len(report.tables[0].rows) == 1 + 5  # a header and five regions
    tools = [call.tool for call in conversation.calls()]
    assert tools.count("delegate_call") == 1
    assert next(c for c in conversation.calls() if c.tool == "delegate_call").target == "tickets__create_ticket"


def test_the_demo_refuses_in_one_line_while_another_process_uses_its_conversation(
    runtime_factory: RuntimeFactory, served_state: Path
) -> None:
    first = _demo(served_state)
    assert first.returncode == 0, first.stdout + first.stderr
    holder = runtime_factory(state_dir=served_state)  # this test's process uses the demo conversation now
    holder.conversation("demo").call("write_file", {"path": "note.txt", "content": "mine"}, call_id="mine")
    refused = _demo(served_state)
    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: the demo conversation 'demo'")
    assert f"in use by process {os.getpid()}" in line
    assert (holder.conversation("demo").folders.results / "note.txt").read_text() == "mine"  # nothing was deleted
