"""Sorting the rows of a table for ``export_table``: type-aware, stable, NULLs last, in bounded memory.

:func:`sort_rows` sorts runs of rows in memory, writes them to anonymous host temporary files (never in the
results folder) and merges them with :func:`heapq.merge`. Memory is bounded in rows *and* in bytes, so a table
of huge cells costs no more than one of small ones:

* a run holds at most ``memory_rows`` rows, and at most ``memory_bytes`` (32 MiB by default) of the source as
  the reader counts it (``consumed``: the bytes of the file read so far);
* a run is written in pickled batches of at most 1,024 rows and about 1 MiB each (a larger row is a batch of
  its own; the first batch of a run is one row, which measures them); merging holds one batch per run, so runs
  are merged at most 64 at a time and at most 64 MiB of batches at a time (more are merged in passes of
  consecutive runs, which keeps the sort stable).

:func:`sort_key` orders any two non-NULL cells and never fails: a datetime with a UTC offset at the edge of the
range (``9999-12-31T23:00:00-05:00``, whose UTC time is past year 9999) is ordered by its exact instant in
integer microseconds, not converted to a ``datetime`` that cannot exist.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import logging
import pickle
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import IO, Any

from sandbox_runtime.tables.cells import Cell

__all__ = ["RUN_MAX_BYTES", "SortedRows", "sort_key", "sort_rows"]

logger = logging.getLogger(__name__)

RUN_MAX_BYTES = 32 << 20  # bytes of the source one in-memory run covers at most
_BATCH_ROWS = 1024  # rows per pickled batch at most
_BATCH_MAX_BYTES = 1 << 20  # pickled bytes per batch at most (unless one row is larger)
_MAX_FAN_IN = 64  # sort runs merged at once (open temporary files)
_MERGE_MAX_BYTES = 64 << 20  # pickled bytes of the batches merged at once (one per run)
_PLAIN_RANK: dict[type, int] = {bool: 0, int: 1, float: 1, str: 3}  # exact types; subclasses take the long way
_US_PER_DAY = 86_400_000_000
_US_PER_SECOND = 1_000_000


def _instant(value: dt.datetime) -> int:
    """Microseconds since 0001-01-01 (UTC for an aware datetime): exact, and never out of range."""
    clock = (value.hour * 60 + value.minute) * 60 + value.second
    micros = value.toordinal() * _US_PER_DAY + clock * _US_PER_SECOND + value.microsecond
    offset = value.utcoffset()
    return micros if offset is None else micros - offset // dt.timedelta(microseconds=1)


def sort_key(value: Cell) -> tuple[int, Any]:
    """A key that orders any two non-NULL cells: booleans, then numbers (ints and floats together), then dates
    and datetimes (a date is its midnight; aware datetimes by their UTC instant, naive ones as if UTC), then
    text by code point."""
    rank = _PLAIN_RANK.get(type(value))
    if rank is not None:
        return rank, value
    if isinstance(value, bool):
        return 0, value
    if isinstance(value, int | float):
        return 1, value
    if isinstance(value, dt.datetime):
        return 2, _instant(value)
    if isinstance(value, dt.date):
        return 2, value.toordinal() * _US_PER_DAY
    return 3, str(value)


@dataclass
class SortedRows:
    """Sorted rows (iterate once) and how many rows the source had."""

    total: int
    rows: Iterator[list[Cell]]


@dataclass
class _Run:
    """A run on disk and its largest pickled batch (what merging it holds in memory)."""

    file: IO[bytes]
    batch_bytes: int = 0  # the largest batch written
    rows: int = 0  # rows and bytes written, which size the next batch
    written: int = 0

    def batch_rows(self) -> int:
        """Rows for the next batch: as many as fit the batch budget by the rows written so far (at most 1,024);
        the first batch is one row, which measures them."""
        if not self.written:
            return 1
        return max(1, min(_BATCH_ROWS, _BATCH_MAX_BYTES * self.rows // self.written))


@contextmanager
def sort_rows(
    rows: Iterable[list[Cell]],
    position: int,
    *,
    descending: bool,
    memory_rows: int,
    tmp_dir: str | None = None,
    consumed: Callable[[], int] | None = None,
    memory_bytes: int = RUN_MAX_BYTES,
) -> Iterator[SortedRows]:
    """Sort ``rows`` by the cell at ``position``: stable, NULLs last in source order, at most ``memory_rows``
    rows — and, when ``consumed`` tells how many bytes of the source were read so far, at most ``memory_bytes``
    of them — in memory at once (runs spill to anonymous temporary files in ``tmp_dir``, removed on exit)."""
    if memory_rows < 1 or memory_bytes < 1:
        raise ValueError("memory_rows and memory_bytes must be >= 1")

    def key(row: list[Cell]) -> tuple[int, Any]:
        return sort_key(row[position])

    with ExitStack() as stack:

        def new_run() -> _Run:
            return _Run(stack.enter_context(tempfile.TemporaryFile(dir=tmp_dir, prefix="sandbox-runtime-sort-")))

        runs: list[_Run] = []
        nulls: _Run | None = None
        null_batch: list[list[Cell]] = []
        chunk: list[list[Cell]] = []
        total = 0
        started = consumed() if consumed is not None else 0
        for row in rows:
            total += 1
            (null_batch if row[position] is None else chunk).append(row)
            full = consumed is not None and consumed() - started >= memory_bytes
            if null_batch and (full or len(null_batch) >= (nulls.batch_rows() if nulls else 1)):
                nulls = nulls or new_run()
                _dump(nulls, null_batch)
                null_batch = []
            if chunk and (full or len(chunk) >= memory_rows):
                chunk.sort(key=key, reverse=descending)
                runs.append(_write_run(new_run(), chunk))
                chunk = []
            if full and consumed is not None:
                started = consumed()
        chunk.sort(key=key, reverse=descending)
        if runs and chunk:
            runs.append(_write_run(new_run(), chunk))
            chunk = []
        while not _fits(runs):  # merge consecutive groups so source order still breaks ties
            runs = [
                _write_run(new_run(), heapq.merge(*(_read_run(run) for run in group), key=key, reverse=descending))
                for group in _groups(runs)
            ]
        logger.debug("sorted %d rows in %d runs of at most %d rows", total, len(runs), memory_rows)
        ordered: Iterator[list[Cell]] = (
            heapq.merge(*map(_read_run, runs), key=key, reverse=descending) if runs else iter(chunk)
        )
        tail = itertools.chain(_read_run(nulls) if nulls is not None else (), null_batch)
        yield SortedRows(total, itertools.chain(ordered, tail))


def _fits(runs: list[_Run]) -> bool:
    return len(runs) <= 1 or (len(runs) <= _MAX_FAN_IN and sum(r.batch_bytes for r in runs) <= _MERGE_MAX_BYTES)


def _groups(runs: list[_Run]) -> Iterator[list[_Run]]:
    """Consecutive groups of at least two runs (while there are), each within the fan-in and the merge budget."""
    group: list[_Run] = []
    held = 0
    for run in runs:
        if len(group) >= 2 and (len(group) >= _MAX_FAN_IN or held + run.batch_bytes > _MERGE_MAX_BYTES):
            yield group
            group, held = [], 0
        group.append(run)
        held += run.batch_bytes
    if group:
        yield group


def _dump(run: _Run, batch: list[list[Cell]]) -> None:
    """Append ``batch`` to the run, split into halves while a pickled half is over the batch budget."""
    data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > _BATCH_MAX_BYTES and len(batch) > 1:
        del data
        half = len(batch) // 2
        _dump(run, batch[:half])
        _dump(run, batch[half:])
        return
    run.file.write(data)
    run.batch_bytes = max(run.batch_bytes, len(data))
    run.rows += len(batch)
    run.written += len(data)


def _write_run(run: _Run, rows: Iterable[list[Cell]]) -> _Run:
    """Write ``rows`` to the run in pickled batches; the file is rewound for :func:`_read_run`."""
    batch: list[list[Cell]] = []
    limit = run.batch_rows()
    for row in rows:
        batch.append(row)
        if len(batch) >= limit:
            _dump(run, batch)
            batch = []
            limit = run.batch_rows()
    if batch:
        _dump(run, batch)
    run.file.flush()
    return run


def _read_run(run: _Run) -> Iterator[list[Cell]]:
    run.file.seek(0)
    while True:
        try:
            batch: list[list[Cell]] = pickle.load(run.file)  # noqa: S301  (our own anonymous host temporary file)
        except EOFError:
            return
        yield from batch
