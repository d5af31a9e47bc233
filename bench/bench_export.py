"""Speed and memory of ``export_table`` (CSV and XLSX from a spilled table), beside plain baselines in one run.

Run from the repository root: ``.venv/bin/python bench/bench_export.py [--quick] [--dir DIR] [--xlsx-memory-rows N]``.

The source is made the way the runtime makes it: ``spill_result(durable=False)`` of a ``TableStream`` of generated
rows of 10 columns (integers, floats, short text, ISO date strings, booleans, some NULLs) writes a typed table
file, and its descriptor's ``path`` is what ``export_table`` reads. Each timed row runs the real export and a plain
baseline on that same file, interleaved per repetition (the side that goes first alternates), so machine noise
hits both alike; compare the p50 ratios, not absolute times:

1. ``export_table(format="xlsx")`` of all rows and columns beside ``iter_table_file`` + XlsxWriter in
   constant-memory mode with typed writes (numbers, booleans, dates with a date format, ``write_string``).
2. ``export_table(format="csv")`` beside ``iter_table_file`` + ``csv.writer`` to a file.
3. Peak RSS growth of one export in a fresh ``spawn`` child: ``VmHWM`` after the export (reset before it by
   writing 5 to ``/proc/self/clear_refs``) minus ``VmRSS`` before it, for CSV unsorted, CSV sorted by a float
   column (external sort: runs of ``sort_memory_rows`` = 100,000 rows on disk) and XLSX unsorted (at 300,000
   rows in the full run, which 1,000,000 would make ~2½ minutes longer; ``--xlsx-memory-rows`` changes it).
4. The bytes of a typical ``export_table`` call as compact JSON for N = 321, 100,000 and 1,000,000 rows, beside
   the bytes of those rows (the call's 3 columns) as CSV: what retyping them would cost.

The export reads with ``max_source_bytes`` = 1 GiB: at 1,000,000 rows the table file is larger than the default
``store.read_max_bytes`` (64 MiB; the output says by how much). Everything is written below a fresh ``mkdtemp``
folder in ``--dir`` (default /var/tmp) and removed at the end. Numbers are reported, never asserted; the targets
block says met or not.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gc
import io
import itertools
import json
import multiprocessing
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import xlsxwriter  # type: ignore[import-untyped]  # XlsxWriter ships no py.typed marker
from benchkit import Met, bench_run, interleaved, line, pair, print_targets

from sandbox_runtime.policy import SpillPolicy
from sandbox_runtime.spill.spiller import spill_result
from sandbox_runtime.spill.streamed import TableStream
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tables.table import iter_table_file
from sandbox_runtime.tools.export_table import ExportFormat, ExportSort, ExportTableArgs, export_table

MiB = 2**20
MAX_SOURCE_BYTES = 1024 * MiB
SORT_MEMORY_ROWS = 100_000  # ToolsPolicy.sort_memory_rows_max's default
COLUMNS = ("id", "qty", "price", "score", "name", "city", "day", "due", "active", "flag")
CITIES = ("Berlin", "Lyon", "Oslo", "Zürich", "Porto", "Kraków", "Turin", "Ghent")
DATES = tuple((dt.date(2020, 1, 1) + dt.timedelta(days=d)).isoformat() for d in range(1500))
CALL_COLUMNS = ("day", "city", "price")


def record(i: int) -> tuple[object, ...]:
    """One row, cheap and deterministic: 10 cells of mixed types, NULLs in 4 columns."""
    return (
        i,
        None if i % 17 == 0 else (i * 31) % 1000,
        (i * 7919) % 1_000_000 / 100,
        None if i % 13 == 0 else (i * 2_654_435_761) % 100_003 / 1000,
        f"item {i % 50_000:05d}",
        CITIES[i % len(CITIES)],
        DATES[(i * 37) % len(DATES)],
        None if i % 11 == 0 else DATES[(i * 53) % len(DATES)],
        i % 3 > 0,
        None if i % 7 == 0 else i % 5 == 0,
    )


class Exports:
    """One results folder: spilled sources, the real export into ``exports/``, and the baselines' own folder."""

    def __init__(self, host_dir: Path) -> None:
        for sub in ("spill", "exports", "plain"):
            (host_dir / sub).mkdir(parents=True)
        self.root = ResultsRoot(host_dir, "/mnt/results")
        self.ids = itertools.count()

    def spill(self, rows: int) -> str:
        """A table file of ``rows`` rows, written as the runtime writes a streamed SQL result; its sandbox path."""
        out = spill_result(
            self.root, TableStream(COLUMNS, map(record, range(rows))), tool="sql",
            call_id=f"toolu_01{next(self.ids):022d}", policy=SpillPolicy(), now=dt.datetime.now(dt.UTC),
            durable=False,
        )  # fmt: skip
        if out.descriptor is None or out.descriptor.format != "table" or out.descriptor.rows != rows:
            raise RuntimeError(f"expected a table spill of {rows:,} rows, got {out.descriptor or out.warning}")
        return out.descriptor.path

    def host(self, path: str) -> Path:
        return self.root.host_root / path.removeprefix(self.root.mount_path + "/")

    def export(self, source: str, fmt: ExportFormat) -> None:
        export_table(
            self.root, ExportTableArgs(source=source, format=fmt), max_source_bytes=MAX_SOURCE_BYTES,
            sort_memory_rows=SORT_MEMORY_ROWS,
        )  # fmt: skip

    def baseline(self, source: Path, fmt: ExportFormat) -> None:
        out = self.root.host_root / "plain" / f"plain-{next(self.ids)}.{fmt}"
        (plain_xlsx if fmt == "xlsx" else plain_csv)(source, out)


def plain_csv(source: Path, out: Path) -> None:
    with source.open(encoding="utf-8") as lines, out.open("w", encoding="utf-8", newline="") as file:
        writer = csv.writer(file)
        rows = iter_table_file(lines)
        columns, _types, first = next(rows)
        writer.writerow(columns)
        writer.writerow(first)
        writer.writerows(row for _columns, _types, row in rows)


def plain_xlsx(source: Path, out: Path) -> None:
    book = xlsxwriter.Workbook(str(out), {"constant_memory": True})
    sheet = book.add_worksheet()
    date_format = book.add_format({"num_format": "yyyy-mm-dd"})
    with source.open(encoding="utf-8") as lines:
        for at, (columns, _types, row) in enumerate(iter_table_file(lines), start=1):
            if at == 1:
                for column, name in enumerate(columns):
                    sheet.write_string(0, column, name)
            for column, value in enumerate(row):
                if value is None:
                    continue
                if isinstance(value, bool):
                    sheet.write_boolean(at, column, value)
                elif isinstance(value, int | float):
                    sheet.write_number(at, column, value)
                elif isinstance(value, dt.date):
                    sheet.write_datetime(at, column, value, date_format)
                else:
                    sheet.write_string(at, column, value)
    book.close()


def vm(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes."""
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def child_peak(host_dir: str, source: str, fmt: ExportFormat, sort: str | None) -> tuple[int, float, int]:
    """Run in a fresh process: RSS growth (bytes) during one export, its seconds, and the rows written."""
    args = ExportTableArgs(source=source, format=fmt, sort=None if sort is None else ExportSort(column=sort))
    root = ResultsRoot(host_dir, "/mnt/results")
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS now
    before = vm("VmRSS")
    start = time.perf_counter()
    made = export_table(root, args, max_source_bytes=MAX_SOURCE_BYTES, sort_memory_rows=SORT_MEMORY_ROWS)
    return vm("VmHWM") - before, time.perf_counter() - start, made.rows


def peak_in_child(ex: Exports, source: str, fmt: ExportFormat, sort: str | None = None) -> tuple[int, float, int]:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(child_peak, str(ex.root.host_root), source, fmt, sort).result()


def speed(ex: Exports, rows: int, reps: dict[str, int], met: Met) -> None:
    source = ex.spill(rows)
    host = ex.host(source)
    print(f"  (source: {source}, {host.stat().st_size / MiB:.1f} MiB, {rows:,} rows x {len(COLUMNS)} columns)")
    cases: list[tuple[int, ExportFormat, float, str]] = [
        (1, "xlsx", 1.3, "XlsxWriter constant_memory"),
        (2, "csv", 1.5, "csv.writer"),
    ]
    for number, fmt, limit, base in cases:
        runs: dict[str, Callable[[], object]] = {
            "export": partial(ex.export, source, fmt),
            "plain": partial(ex.baseline, host, fmt),
        }
        s = interleaved(runs, reps[fmt])
        _p50, ratio = pair(
            f"{number}. {fmt.upper()} export of {rows:,} rows x {len(COLUMNS)} columns from a spilled table file",
            (f'export_table(format="{fmt}")', s["export"]),
            (f"baseline: iter_table_file + {base}", s["plain"]),
            1.0, "s",
        )  # fmt: skip
        p50s = f"{statistics.median(s['export']):.2f} s vs {statistics.median(s['plain']):.2f} s"
        met.append((f"{fmt.upper()} export vs {base} ({p50s})", f"<= {limit}x p50", f"{ratio:.2f}x", ratio <= limit))


def memory(ex: Exports, rows: int, xlsx_rows: int, met: Met) -> None:
    sources = {n: ex.spill(n) for n in sorted({rows, xlsx_rows})}
    size = ex.host(sources[rows]).stat().st_size
    print(f"\n3. peak RSS growth of one export in a fresh spawn child (VmHWM reset before it; {len(COLUMNS)} columns)")
    print(f"  (source: {size / MiB:.1f} MiB for {rows:,} rows; a table file streams up to the quota)")
    cases: list[tuple[str, int, ExportFormat, str | None]] = [
        (f"CSV, {rows:,} rows, unsorted", rows, "csv", None),
        (f"CSV, {rows:,} rows, sorted by price (external sort)", rows, "csv", "price"),
        (f"XLSX, {xlsx_rows:,} rows, unsorted", xlsx_rows, "xlsx", None),
    ]
    took: list[str] = []
    for label, n, fmt, sort in cases:
        growth, seconds, written = peak_in_child(ex, sources[n], fmt, sort)
        if written != n:
            raise RuntimeError(f"{label}: wrote {written:,} rows")
        line(label, [growth / MiB], 1, "MB")
        took.append(f"{label.split(',')[0]}{' sorted' if sort else ''} {seconds:.1f} s")
        met.append((f"peak RSS growth, {label}", "<= 100 MB", f"{growth / MiB:.1f} MB", growth <= 100 * MiB))
    print("  export time in the child: " + ", ".join(took))


def call_bytes(ex: Exports, met: Met) -> None:
    source = f"{ex.root.mount_path}/spill/sql-toolu_01{0:022d}.table.jsonl"  # a spill's path, as the model sees it
    picked = [COLUMNS.index(c) for c in CALL_COLUMNS]
    print(f"\n4. bytes the model writes to export N rows: the call as compact JSON vs the {len(picked)} columns as CSV")
    most = 0
    for n in (321, 100_000, 1_000_000):
        call = {"source": source, "format": "xlsx", "columns": list(CALL_COLUMNS),
                "sort": {"column": "price", "direction": "desc"}, "start": 0, "count": n}  # fmt: skip
        ExportTableArgs.model_validate(call)  # a valid call, as the model would send it
        size = len(json.dumps(call, separators=(",", ":")).encode())
        text = io.StringIO()
        csv.writer(text).writerows(itertools.chain([CALL_COLUMNS], ([record(i)[k] for k in picked] for i in range(n))))
        rows_bytes = len(text.getvalue().encode())
        print(f"  {f'N = {n:,}: export_table call':<56}{size:>14,} B")
        retyped = f"{rows_bytes:>14,} B   ({rows_bytes / size:,.0f}x the call)"
        print(f"  {f'N = {n:,}: the rows as CSV (retyped)':<56}{retyped}")
        most = max(most, size)
    met.append(("bytes of an export_table call, any N", "< 300 B", f"{most} B", most < 300))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and smaller sizes")
    parser.add_argument("--dir", default="/var/tmp", help="where the temporary folder is made (default /var/tmp)")
    parser.add_argument("--xlsx-memory-rows", type=int, help="rows of the XLSX memory case (default 300,000)")
    opts = parser.parse_args()
    rows, memory_rows = (20_000, 100_000) if opts.quick else (100_000, 1_000_000)
    reps = {"xlsx": 3, "csv": 5} if opts.quick else {"xlsx": 7, "csv": 15}
    xlsx_rows = opts.xlsx_memory_rows or (memory_rows if opts.quick else 300_000)  # 1,000,000: ~2½ min more

    with bench_run("sandbox-bench-export-", opts.dir) as work:
        ex = Exports(work / "results")
        met: Met = []
        speed(ex, rows, reps, met)
        memory(ex, memory_rows, xlsx_rows, met)
        call_bytes(ex, met)
        print_targets(met)
        if opts.quick:
            print(f"  (--quick: {rows:,} rows timed, {memory_rows:,} for memory; the targets are for the full run)")
        if xlsx_rows != memory_rows:
            print(f"  (XLSX memory measured at {xlsx_rows:,} rows, not {memory_rows:,}, to keep the run under ~8 min)")


if __name__ == "__main__":
    main()
