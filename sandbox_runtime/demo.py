"""The demonstration the README's main command plays: a short conversation with ``run_python``.

No model is needed: the "model" here is a fixed script of tool calls. It shows inline code, a script written
once and run by path, a document built with openpyxl in the sandbox, a failure with its short message and full
error file, that the sandbox is reused across calls, and a large result spilled to a file that the next
script reads by path.
"""

from __future__ import annotations

import time
import uuid
from typing import TextIO

from sandbox_runtime.runtime import Runtime

__all__ = ["run_demo"]

_REPORT_SCRIPT = '''\
"""Build a small workbook from rows computed here (never pasted into a prompt)."""
import sys
from openpyxl import Workbook

rows = [("region", "orders", "revenue")]
for index, region in enumerate(["north", "south", "east", "west"], start=1):
    rows.append((region, 40 * index, round(1234.5 * index, 2)))
book = Workbook()
sheet = book.active
sheet.title = "summary"
for row in rows:
    sheet.append(row)
target = sys.argv[1]
book.save(target)
print(f"wrote {len(rows) - 1} rows to {target}")
'''

_FAILING_SCRIPT = """\
import csv, io

def total(rows):
    return sum(float(row["amount"]) for row in rows)

data = io.StringIO("id,price\\n1,9.50\\n2,3.25\\n")
print(total(csv.DictReader(data)))
"""


_ROWS_SCRIPT = """\
import json
libraries = ["libpthread.so.0", "libc.so.6", "libm.so.6"]
print(json.dumps([{"id": i, "library": libraries[i % 3], "size_kb": 12.5 * i} for i in range(321)]))
"""

_SUM_SCRIPT = """\
import json
with open("{path}") as table:
    header = json.loads(next(table))
    size = header["columns"].index("size_kb")
    print(sum(json.loads(line)[size] for line in table))
"""


def run_demo(runtime: Runtime, out: TextIO) -> int:
    """Play the scripted conversation; 0 when every step behaved as expected."""
    conversation = runtime.conversation(f"demo-{uuid.uuid4().hex[:8]}")
    failures = 0

    def step(title: str) -> None:
        print(f"\n== {title}", file=out)

    step("1. inline code (starts the conversation's sandbox)")
    started = time.monotonic()
    first = conversation.run_python("import platform, os; print(platform.python_version(), os.getuid())")
    print(
        f"status={first.status} stdout={first.stdout.strip()!r} ({time.monotonic() - started:.2f} s, cold: "
        "includes the once-per-process self-check)",
        file=out,
    )
    failures += first.status != "ok"

    step("2. the same sandbox again (warm)")
    started = time.monotonic()
    second = conversation.run_python("print(sum(range(10**6)))")
    print(
        f"status={second.status} stdout={second.stdout.strip()!r} ({time.monotonic() - started:.2f} s, warm, "
        f"sandbox {conversation.sandbox().container_id[:12]} reused)",
        file=out,
    )
    failures += second.status != "ok"

    step("3. a script written once, run by path, building an .xlsx in the results folder")
    root = runtime.store.results_root(conversation.folders)
    script = root.create_file("scripts/build_report.py", _REPORT_SCRIPT.encode())
    built = conversation.run_python(script_path=script, args=["/mnt/results/exports/summary.xlsx"])
    print(f"status={built.status} stdout={built.stdout.strip()!r}", file=out)
    failures += built.status != "ok"

    step("4. a failing script: the model sees a short message, the full error is in a file")
    failed = conversation.run_python(_FAILING_SCRIPT)
    print(
        f"status={failed.status} exit_code={failed.exit_code}\n--- message for the model ---\n{failed.message}",
        file=out,
    )
    failures += failed.status != "error" or "KeyError: 'amount'" not in failed.message

    step("5. the network is not there, the root filesystem is read-only")
    probe = conversation.run_python(
        "import os\nprint('interfaces:', sorted(os.listdir('/sys/class/net')))\n"
        "try:\n    open('/etc/x', 'w')\nexcept OSError as e:\n    print('write /etc:', e.strerror)\n"
    )
    print(probe.stdout.strip(), file=out)
    failures += probe.status != "ok"

    step("6. a 321-row result goes to a file before the model sees it; the next script reads it by path")
    rows = conversation.call("run_python", {"code": _ROWS_SCRIPT}, call_id="rows")
    d = rows.descriptor
    address = [line for line in rows.text.splitlines() if line.startswith("[saved to")]
    print(f"the model got {len(rows.text):,} characters with the address:\n{''.join(address)}", file=out)
    failures += d is None or d.rows != 321
    if d is not None:
        summed = conversation.call("run_python", {"code": _SUM_SCRIPT.format(path=d.path)}, call_id="sum")
        print(f"a script summed the file: {summed.text.splitlines()[0]} (no row was retyped)", file=out)
        failures += summed.is_error

    usage = conversation.usage()
    print(
        f"\nresults folder: {conversation.folders.results} ({usage.used_bytes:,} of {usage.limit_bytes:,} bytes "
        f"used, quota mode {usage.mode})",
        file=out,
    )
    conversation.close()
    print(
        "demo " + ("finished: every step behaved as expected" if not failures else f"had {failures} surprises"),
        file=out,
    )
    return 0 if not failures else 1
