"""Tables whose rows arrive one at a time (a database cursor, a generator), spilled without holding them.

The rows go to an anonymous host temporary file while the column types are inferred; then the table file is
published from the header and that temporary file, chunk by chunk. Memory holds one row and the per-column type
sets, whatever the row count. A stream that ends before ``threshold_chars`` is handed back as an ordinary
``{"columns", "rows"}`` value (nothing to spill). A row with the wrong number of cells stops the table: what was
read is written as JSON lines (one row array per line, format ``text``) and the reason is given.
"""

from __future__ import annotations

import codecs
import hashlib
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from sandbox_runtime.tables.cells import Cell, ColumnType, cell, type_from_kinds, value_type
from sandbox_runtime.tables.jsonio import dumps_compact
from sandbox_runtime.tables.table import header_line, row_line, unique_names

__all__ = ["StreamedFile", "TableStream", "buffer_or_stream"]

_CHUNK_BYTES = 256 * 1024
_HEAD_BYTES = 64 * 1024  # enough for any preview of up to 16,384 characters


@dataclass(frozen=True)
class TableStream:
    """A table given as column names and an iterable of rows (each a sequence of JSON-like values).

    ``notes`` may grow while the rows are read (e.g. "cut at N rows"); the pipeline shows them after the result.
    An exception the rows raise ends the table there: what was read is kept, and the call is an error.
    """

    columns: Sequence[str]
    rows: Iterable[Sequence[Any]]
    notes: list[str] = field(default_factory=list)


@dataclass
class StreamedFile:
    """A stream read to its end into a temporary file: its shape, and the chunks to publish."""

    columns: tuple[str, ...]
    column_types: tuple[ColumnType, ...]
    rows: int
    body: IO[bytes]
    ragged: str | None = None
    failed: str | None = None  # the rows stopped with an error after `rows` rows
    preview_rows: list[list[Cell]] = field(default_factory=list)
    sha256: str = ""
    size_bytes: int = 0
    size_chars: int = 0
    head: bytes = b""  # the file's first bytes, for the preview

    def chunks(self) -> Iterator[bytes]:
        """The file's bytes (header, then rows), hashed and counted as they pass."""
        digest = hashlib.sha256()
        decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")  # a chunk may end inside a character
        self.size_bytes = self.size_chars = 0
        self.head = b""
        parts: Iterable[bytes] = [] if self.ragged else [self._header()]
        for part in _chain(parts, self.body):
            digest.update(part)
            if len(self.head) < _HEAD_BYTES:
                self.head += part[: _HEAD_BYTES - len(self.head)]
            self.size_bytes += len(part)
            self.size_chars += len(decoder.decode(part))
            yield part
        self.sha256 = digest.hexdigest()

    def text(self) -> str:
        """The whole file as text, from the host's own temporary copy (call only when it is small)."""
        return b"".join(_chain([] if self.ragged else [self._header()], self.body)).decode("utf-8", "surrogatepass")

    def _header(self) -> bytes:
        return header_line(self.columns, self.column_types).encode("utf-8", "surrogatepass")


def _chain(first: Iterable[bytes], body: IO[bytes]) -> Iterator[bytes]:
    yield from first
    body.seek(0)
    while chunk := body.read(_CHUNK_BYTES):
        yield chunk


def buffer_or_stream(stream: TableStream, threshold_chars: int, preview_rows: int) -> dict[str, Any] | StreamedFile:
    """Rows as a plain ``{"columns", "rows"}`` value when they stay under ``threshold_chars``; else the whole
    stream in a temporary file (close ``body`` when done)."""
    names, _notes = unique_names([str(c) for c in stream.columns])
    width = len(names)
    kinds: list[set[ColumnType]] = [set() for _ in names]
    buffered: list[list[Cell]] = []
    size = 0
    failures: list[str] = []
    rows = _until_failure(stream.rows, failures)
    for raw in rows:
        row = [cell(v) for v in raw]
        buffered.append(row)
        size += len(dumps_compact(row))
        if size >= threshold_chars:
            break
    else:
        if not failures:
            return {"columns": list(names), "rows": buffered}
    body = tempfile.TemporaryFile()  # noqa: SIM115  (closed by the caller)
    count, ragged = 0, None
    for row in _chain_rows(buffered, rows):
        if len(row) != width:
            ragged = f"row {count + 1} has {len(row)} cells for {width} columns; written as JSON lines"
        for index, value in enumerate(row[:width]):
            if value is not None:
                kinds[index].add(value_type(value))
        body.write(row_line(row))
        count += 1
    return StreamedFile(
        columns=names,
        column_types=tuple(type_from_kinds(k) for k in kinds),
        rows=count,
        body=body,
        ragged=ragged,
        failed=failures[0] if failures else None,
        preview_rows=buffered[:preview_rows],
    )


def _until_failure(rows: Iterable[Sequence[Any]], failures: list[str]) -> Iterator[Sequence[Any]]:
    try:
        yield from rows
    except Exception as exc:
        failures.append(f"{type(exc).__name__}: {exc}")


def _chain_rows(buffered: list[list[Cell]], rest: Iterator[Sequence[Any]]) -> Iterator[list[Cell]]:
    yield from buffered
    for raw in rest:
        yield [cell(v) for v in raw]
