"""Host memory of ``export_table`` and ``render_table`` on a file with one huge cell, beside a normal large table.

Run from the repository root:
``.venv/bin/python bench/bench_table_memory.py [--size-mb N] [--cell-mib N] [--json-mb N] [--dir DIR]``.

Before these caps, one 150 MiB cell made ``export_table`` grow the host process by ~1.3 GiB and
``render_table`` by ~0.9 GiB. Every host-side table reader now keeps a line cap (``tools.table_line_max_bytes``,
16 MiB) and a cell cap (``tools.table_cell_max_chars``, 1 Mi characters), reads lines in chunks of 256 KiB
(a longer line is measured before it is read, never read past the cap), and never holds a file whole as Python
objects, so its peak memory should not depend on the file's shape. This measures that, in one run, with the
real tools and the policy's default caps:

1. the peak RSS growth of ``export_table`` (CSV) and of ``render_table`` on a table file
   (``*.table.jsonl``, as a spill writes it) whose second line holds one ``--cell-mib`` MiB cell (default 150):
   the call ends with a ``BadTableFile`` naming the line and the cap;
2. the same on a CSV file with that cell (CSV is streamed too);
3. the same tools on a normal large table file of ``--size-mb`` MB (default 256, about a minute in all; the
   issue's 1 GB is ``--size-mb 1024``, under 3 minutes here): 10 columns of mixed types, written the way the
   spill writes them; ``render_table`` is asked for the last 50 rows, so it streams through the whole file;
4. the same tools on the largest rows the caps let through: 24 lines just under the line cap, each made of
   cells just under the cell cap (what the caps bound memory by: two rows in flight, about 4x the line cap),
   and ``export_table`` sorted by a column of them (external sort: runs and merges bounded in bytes too);
5. ``export_table`` (CSV) of a whole-JSON table (an array of small records) of ``--json-mb`` MB (default 64, the
   default ``store.read_max_bytes``): such a file is read whole, and the growth is shown beside its size.

Each measurement runs in a fresh ``spawn`` child: ``VmHWM`` after the call (reset just before it by writing 5 to
``/proc/self/clear_refs``) minus ``VmRSS`` before it. The ratio column compares the huge-cell case with the
normal table for the same tool (about 1x: the shape of the file does not matter). Everything is written below a
fresh ``mkdtemp`` folder in ``--dir`` (default /var/tmp) and removed at the end. Numbers are reported, never
asserted; the targets block says met or not.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench_export import record  # the same rows as the export benchmark
from benchkit import Met, bench_run, line, print_targets

from sandbox_runtime.errors import ToolFailure
from sandbox_runtime.policy import Policy
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tables.cells import ColumnType
from sandbox_runtime.tables.jsonio import dumps_lines
from sandbox_runtime.tables.source import TableLimits
from sandbox_runtime.tables.table import header_line
from sandbox_runtime.tools.export_table import ExportSort, ExportTableArgs, export_table
from sandbox_runtime.tools.render_table import RenderTableArgs, render_table

MiB = 2**20
MB = 10**6
POLICY = Policy()
READ_MAX_BYTES = POLICY.store.read_max_bytes  # what the runtime passes as max_source_bytes (whole-read JSON)
STREAM_MAX_BYTES = 4 * 1024 * MiB  # the runtime passes the quota; large enough for --size-mb 1024 here
COLUMNS = ("id", "qty", "price", "score", "name", "city", "day", "due", "active", "flag")
TYPES: tuple[ColumnType, ...] = (
    "integer",
    "integer",
    "number",
    "number",
    "string",
    "string",
    "date",
    "date",
    "boolean",
    "boolean",
)
BATCH_ROWS = 20_000


def write_table_file(path: Path, size_bytes: int) -> int:
    """A table file of about ``size_bytes`` (the spill's format: a header line, one JSON array per row)."""
    rows = 0
    with path.open("wb") as file:
        file.write(header_line(COLUMNS, TYPES).encode())
        while file.tell() < size_bytes:
            file.write(dumps_lines([record(i) for i in range(rows, rows + BATCH_ROWS)]))
            rows += BATCH_ROWS
    return rows


def write_huge_cell_files(folder: Path, cell_bytes: int) -> tuple[str, str]:
    """A table file and a CSV file whose second line holds one cell of ``cell_bytes`` characters."""
    cell = b"x" * cell_bytes
    table = folder / "huge-cell.table.jsonl"
    with table.open("wb") as file:
        file.write(header_line(["id", "text"], ["integer", "string"]).encode())
        file.write(b'[1,"' + cell + b'"]\n[2,"short"]\n')
    text = folder / "huge-cell.csv"
    with text.open("wb") as file:
        file.write(b"id,text\n1," + cell + b"\n2,short\n")
    return table.name, text.name


def write_widest_rows(path: Path, limits: TableLimits, rows: int) -> None:
    """A table file of ``rows`` rows as large as the caps let through: each line just under the line cap, made
    of cells of the largest size the cell cap allows."""
    cell_chars = limits.cell_max_chars
    width = max(1, (limits.line_max_bytes - 16) // (cell_chars + 3))
    with path.open("wb") as file:
        file.write(header_line([f"c{i}" for i in range(width)], ["string"] * width).encode())
        for i in range(rows):
            cell = (f"{i:08d}" + "w" * (cell_chars - 8)).encode()
            file.write(b"[" + b",".join(b'"' + cell + b'"' for _ in range(width)) + b"]\n")


def write_json_records(path: Path, size_bytes: int) -> int:
    """An array of small records, about ``size_bytes`` (such a file is read whole)."""
    rows = 0
    with path.open("wb") as file:
        file.write(b"[")
        while file.tell() < size_bytes - 64:
            file.write(b"," if rows else b"")
            file.write(json.dumps({"id": rows, "name": f"n{rows % 977}", "ok": rows % 2 == 0}).encode())
            rows += 1
        file.write(b"]")
    return rows


def vm(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def child_peak(results: str, tool: str, source: str, start: int, sort: str | None) -> tuple[int, float, str]:
    """Run in a fresh process: RSS growth (bytes) during one call, its seconds, and how it ended."""
    root = ResultsRoot(results, "/mnt/results")
    limits = TableLimits.from_policy(POLICY.tools)
    call: Callable[[], str]
    if tool == "export_table":

        def call() -> str:
            made = export_table(
                root, ExportTableArgs(source=source, format="csv", sort=ExportSort(column=sort) if sort else None),
                max_source_bytes=READ_MAX_BYTES, sort_memory_rows=POLICY.tools.sort_memory_rows_max,
                max_table_file_bytes=STREAM_MAX_BYTES, limits=limits,
            )  # fmt: skip
            return f"wrote {made.rows:,} rows"

    else:

        def call() -> str:
            drawn = render_table(
                root, RenderTableArgs(source=source, start=start, count=50), max_source_bytes=READ_MAX_BYTES,
                max_table_file_bytes=STREAM_MAX_BYTES, max_rows=POLICY.tools.render_rows_max,
                max_cell_chars=POLICY.tools.render_cell_max_chars, max_chars=POLICY.tools.render_max_chars,
                limits=limits,
            )  # fmt: skip
            return f"rendered {drawn.rows:,} rows, {len(drawn.markdown):,} characters"

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS now
    before = vm("VmRSS")
    started = time.perf_counter()
    try:
        outcome = call()
    except ToolFailure as exc:
        outcome = f"{type(exc).__name__}: {str(exc)[:90]}…"
    return vm("VmHWM") - before, time.perf_counter() - started, outcome


def peak_in_child(results: Path, tool: str, source: str, start: int, sort: str | None) -> tuple[int, float, str]:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(child_peak, str(results), tool, source, start, sort).result()


def measure(
    results: Path,
    label: str,
    tool: str,
    source: str,
    start: int = 0,
    base: int | None = None,
    sort: str | None = None,
) -> tuple[int, str]:
    """One call measured in a child; its line shows the ratio to ``base`` (bytes) when given."""
    growth, seconds, outcome = peak_in_child(results, tool, source, start, sort)
    line(label, [growth / MiB], 1, "MB", None if base is None else growth / max(base, 1))
    print(f"      {seconds:.1f} s; {outcome}")
    return growth, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256, help="size of the normal table file (default 256; 1024)")
    parser.add_argument("--cell-mib", type=int, default=150, help="size of the huge cell (default 150)")
    parser.add_argument("--json-mb", type=int, default=64, help="size of the whole-JSON table (default 64)")
    parser.add_argument("--dir", default="/var/tmp", help="where the temporary folder is made (default /var/tmp)")
    opts = parser.parse_args()
    if opts.json_mb * MB > READ_MAX_BYTES:
        parser.error(
            f"--json-mb: a JSON table is read whole, at most {READ_MAX_BYTES // MiB} MiB (store.read_max_bytes)"
        )

    with bench_run("sandbox-bench-table-memory-", opts.dir) as work:
        results = work / "results"
        results.mkdir()
        met: Met = []
        cell_table, cell_csv = write_huge_cell_files(results, opts.cell_mib * MiB)
        rows = write_table_file(results / "normal.table.jsonl", opts.size_mb * MB)
        size = (results / "normal.table.jsonl").stat().st_size
        json_rows = write_json_records(results / "records.json", opts.json_mb * MB)
        json_size = (results / "records.json").stat().st_size
        caps = (
            f"line cap {POLICY.tools.table_line_max_bytes // MiB} MiB, cell cap {POLICY.tools.table_cell_max_chars:,}"
        )
        print(f"\npeak RSS growth of one call in a fresh spawn child (VmHWM reset before it; default caps: {caps})")
        print(f"  (huge cell: {opts.cell_mib} MiB; normal table: {size / MB:,.0f} MB, {rows:,} rows x 10 columns)")

        normal: dict[str, int] = {}
        for tool in ("export_table", "render_table"):
            last = max(0, rows - 50)
            normal[tool], _ = measure(
                results, f"{tool}, normal table file, {size / MB:,.0f} MB", tool, "normal.table.jsonl", last
            )
        for tool in ("export_table", "render_table"):
            for kind, source in (("table file", cell_table), ("CSV", cell_csv)):
                label = f"{tool}, {kind} with one {opts.cell_mib} MiB cell"
                growth, outcome = measure(results, label, tool, source, base=normal[tool])
                met.append((
                    f"{tool}, {kind}, {opts.cell_mib} MiB cell: peak growth", "<= 64 MB",
                    f"{growth / MiB:.1f} MB", growth <= 64 * MiB and outcome.startswith("BadTableFile"),
                ))  # fmt: skip
        widest_rows = 24
        write_widest_rows(results / "widest.table.jsonl", TableLimits.from_policy(POLICY.tools), widest_rows)
        widest = (results / "widest.table.jsonl").stat().st_size
        print(f"  (the largest rows the caps let through: {widest_rows} lines of {widest / widest_rows / MiB:.1f} MiB)")
        for tool, sort in (("export_table", None), ("export_table", "c0"), ("render_table", None)):
            label = f"{tool}{' sorted' if sort else ''}, {widest_rows} rows at the line and cell caps"
            growth, outcome = measure(results, label, tool, "widest.table.jsonl", base=normal[tool], sort=sort)
            times = 8 if sort else 5  # a sort also holds a run (32 MiB of the source) and merges
            cap = times * POLICY.tools.table_line_max_bytes
            met.append((
                f"{tool}{' sorted' if sort else ''}, rows at the caps: peak growth",
                f"<= {times}x line cap ({cap // MiB} MB)", f"{growth / MiB:.1f} MB",
                growth <= cap and not outcome.startswith("BadTableFile"),
            ))  # fmt: skip
        for tool in ("export_table", "render_table"):
            met.append((f"{tool}, normal {size / MB:,.0f} MB table: peak growth", "<= 100 MB",
                        f"{normal[tool] / MiB:.1f} MB", normal[tool] <= 100 * MiB))  # fmt: skip

        print(f"\nwhole-JSON table read whole: {json_size / MB:.0f} MB, {json_rows:,} records of 3 keys")
        growth, _ = measure(results, f"export_table, JSON array of records, {json_size / MB:.0f} MB", "export_table",
                            "records.json")  # fmt: skip
        factor = growth / json_size
        print(f"      growth / file size: {factor:.2f}x (a parse into Python objects would be ~10-20x)")
        met.append(("export_table, whole-JSON table: peak growth / file size", "<= 1.5x", f"{factor:.2f}x",
                    factor <= 1.5))  # fmt: skip
        print_targets(met)


if __name__ == "__main__":
    main()
