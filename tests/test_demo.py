"""The README's main job: `sandbox-runtime demo` plays the whole data path and leaves real files behind."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import docx

from tests.conftest import SESSION, TEST_LABEL, RuntimeFactory

DEMO_S = 300


def test_the_demo_plays_every_step_and_its_files_open(runtime_factory: RuntimeFactory, served_state: Path) -> None:
    command = [sys.executable, "-m", "sandbox_runtime.cli.main", "--state-dir", str(served_state)]
    command += ["--label", f"{TEST_LABEL}={SESSION}", "demo"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=DEMO_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for heading in ("== 2. sql_query", "== 3. export_table", "== 5. a failing script", "== 6. delegate_call"):
        assert heading in out
    assert "KeyError: 'amount'" in out
    assert "bytes the model wrote" in out
    assert "demo finished: every step behaved as expected" in out

    runtime = runtime_factory(state_dir=served_state)
    (record,) = runtime.state.conversations()
    conversation = runtime.conversation(record.id)
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
