"""Issue 4's scenario: from a 321-row spill to exports and reports, by path — no row is ever retyped."""

from __future__ import annotations

import csv
import datetime as dt
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from docx import Document
from openpyxl import load_workbook
from pptx import Presentation

from sandbox_runtime import Runtime
from sandbox_runtime.tables.table import iter_table_file

ROWS = 321
LIBRARIES = ["libpthread.so.0", "libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2"]

REPORT_SCRIPT = '''\
"""Build DOCX, PPTX and XLSX reports from a spill file given by path (argv[1])."""
import json, sys
from docx import Document
from pptx import Presentation
from pptx.util import Inches
from openpyxl import Workbook

with open(sys.argv[1]) as table:
    header = json.loads(next(table))
    rows = [json.loads(line) for line in table]
columns = header["columns"]
size = columns.index("size_kb")
total = sum(row[size] for row in rows)

doc = Document()
doc.add_heading("Libraries", level=1)
doc.add_paragraph(f"{len(rows)} rows, {total:.1f} KB in all")
grid = doc.add_table(rows=1, cols=len(columns))
for cell, name in zip(grid.rows[0].cells, columns):
    cell.text = name
for row in rows[:20]:
    for cell, value in zip(grid.add_row().cells, row):
        cell.text = "" if value is None else str(value)
doc.save("/mnt/results/exports/report.docx")

deck = Presentation()
slide = deck.slides.add_slide(deck.slide_layouts[5])
slide.shapes.title.text = f"{len(rows)} libraries"
box = slide.shapes.add_textbox(Inches(1), Inches(2), Inches(8), Inches(1))
box.text_frame.text = f"total {total:.1f} KB"
deck.save("/mnt/results/exports/report.pptx")

book = Workbook()
sheet = book.active
sheet.append(columns)
for row in rows:
    sheet.append(row)
book.save("/mnt/results/exports/report.xlsx")
print(json.dumps({"rows": len(rows), "total_kb": round(total, 1)}))
'''


def records() -> list[dict[str, Any]]:
    start = dt.date(2026, 1, 1)
    return [
        {
            "id": i,
            "library": LIBRARIES[i % 4],
            "size_kb": round(12.5 * ((i * 37) % 101) + 0.25, 2),
            "built": (start + dt.timedelta(days=i)).isoformat(),
            "note": None if i % 5 else '=HYPERLINK("http://127.0.0.1/")',
            "os_thr_id": f"os_thr_id@entry={232155 + i}",
        }
        for i in range(ROWS)
    ]


def test_an_xlsx_of_chosen_renamed_sorted_rows_matches_the_source_in_openpyxl_and_libreoffice(
    runtime: Runtime, tmp_path: Path
) -> None:
    conversation = runtime.conversation("exports")
    spilled = conversation.submit("sql_query", "q1", records())
    assert spilled.descriptor is not None
    assert spilled.descriptor.rows == ROWS
    call = {
        "source": spilled.descriptor.path,
        "format": "xlsx",
        "columns": [
            {"name": "library", "header": "Library"},
            {"name": "size_kb", "header": "Size (KB)"},
            {"name": "built", "header": "Built on"},
            {"name": "note", "header": "Note"},
        ],
        "sort": {"column": "size_kb", "direction": "desc"},
        "start": 10,
        "count": 51,
        "filename": "libraries",
    }
    assert len(json.dumps(call, separators=(",", ":"))) < 400  # what the model writes, whatever the row count
    out = conversation.call("export_table", call, call_id="x1")
    assert not out.is_error, out.text
    path = conversation.folders.results / "exports" / "libraries.xlsx"
    described = out.descriptor
    assert described is not None
    assert (described.path, described.format, described.rows) == ("/mnt/results/exports/libraries.xlsx", "xlsx", 51)
    assert described.columns == ["Library", "Size (KB)", "Built on", "Note"]
    assert described.bytes == path.stat().st_size

    source = sorted(records(), key=lambda r: -r["size_kb"])  # Python's sort is stable, like the export's
    expected = [[r["library"], r["size_kb"], dt.date.fromisoformat(r["built"]), r["note"]] for r in source[10:61]]
    sheet = load_workbook(path).active
    values = [list(row) for row in sheet.iter_rows(values_only=True)]
    assert values[0] == ["Library", "Size (KB)", "Built on", "Note"]
    got = [[lib, size, built.date() if built else None, note] for lib, size, built, note in values[1:]]
    assert got == expected
    assert not [c for row in sheet.iter_rows() for c in row if c.data_type == "f"]  # no formula cells

    soffice = shutil.which("soffice") or shutil.which("libreoffice")
    if soffice is None:
        pytest.fail("LibreOffice is not installed (scripts/setup-dev.sh installs libreoffice-calc-nogui)")
    profile = tmp_path / "lo-profile"
    converted = subprocess.run(
        [
            soffice,
            f"-env:UserInstallation=file://{profile}",
            "--headless",
            "--convert-to",
            "csv",
            "--outdir",
            str(tmp_path),
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert converted.returncode == 0, converted.stderr
    with (tmp_path / "libraries.csv").open(newline="") as file:
        lines = list(csv.reader(file))
    assert lines[0] == ["Library", "Size (KB)", "Built on", "Note"]
    assert len(lines) == 52
    for line, want in zip(lines[1:], expected, strict=True):
        assert line[0] == want[0]
        assert float(line[1]) == want[1]
        assert line[3] == (want[3] or "")  # the formula text arrives as text


def test_reports_are_built_by_a_script_passed_by_path_that_reads_the_spill(runtime: Runtime) -> None:
    conversation = runtime.conversation("reports")
    spilled = conversation.submit("sql_query", "q1", records())
    assert spilled.descriptor is not None
    written = conversation.call("write_file", {"path": "scripts/report.py", "content": REPORT_SCRIPT})
    assert not written.is_error, written.text
    fixed = conversation.call(
        "edit_file", {"path": "scripts/report.py", "old": "level=1)", "new": "level=0)"}
    )  # a one-line fix, not a retyped script
    assert not fixed.is_error, fixed.text
    ran = conversation.call(
        "run_python", {"script_path": "/mnt/results/scripts/report.py", "args": [spilled.descriptor.path]}
    )
    assert not ran.is_error, ran.text
    total = round(sum(r["size_kb"] for r in records()), 1)
    assert json.loads(ran.text.splitlines()[0]) == {"rows": ROWS, "total_kb": total}

    exports = conversation.folders.results / "exports"
    document = Document(str(exports / "report.docx"))
    assert f"{ROWS} rows, {total:.1f} KB in all" in [p.text for p in document.paragraphs]
    deck = Presentation(str(exports / "report.pptx"))
    assert deck.slides[0].shapes.title.text == f"{ROWS} libraries"
    sheet = load_workbook(exports / "report.xlsx").active
    with (conversation.folders.results / spilled.descriptor.path.removeprefix("/mnt/results/")).open() as table:
        source = [row for _c, _t, row in iter_table_file(table)]
    got = [list(r) for r in sheet.iter_rows(min_row=2, values_only=True)]
    assert len(got) == ROWS
    assert [r[:3] for r in got] == [r[:3] for r in source]  # id, library, size exactly
    attached = conversation.call("attach_file", {"path": "exports/report.docx"})
    assert not attached.is_error
    assert [a.filename for a in conversation.attachments()] == ["report.docx"]
