"""JSON on the spill's hot path: msgspec parses, orjson writes, the standard library takes what they refuse.

Both are several times faster than ``json``, but refuse some values it takes: lone surrogates, NaN literals and
numbers out of range in input; integers beyond 64 bits, non-string keys and nesting deeper than 1,024 levels in
output. Those fall back to ``json``, so every value that worked before still works, only slower. Parsing is
msgspec's because orjson turns integers beyond 64 bits into floats (12345678901234567890123 would come back as
1.2345678901234568e+22). Both write the same layout: compact rows (no spaces) and two-space indentation for
pretty output; NaN and infinities never reach here (cells map them to NULL).
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import orjson

__all__ = ["dumps_compact", "dumps_lines", "dumps_pretty", "loads", "paused_gc"]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a large result is parsed and written.

    Parsing a megabyte of JSON makes tens of thousands of containers; each few hundred of them start a
    collection that walks the young objects again, which more than doubles the time. Reference counting still
    frees everything at once; cycles are collected when the collector resumes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def loads(text: str) -> Any:
    """Parse JSON text; raises ``ValueError`` (or ``RecursionError`` for absurd nesting) when it is not JSON."""
    try:
        return msgspec.json.decode(text)
    except (msgspec.DecodeError, UnicodeEncodeError):  # not JSON to msgspec, or a str holding lone surrogates
        return json.loads(text)


def dumps_compact(value: Any) -> bytes:
    """One line of UTF-8 JSON without spaces; dates as ISO strings; unknown objects as ``str()``."""
    try:
        return orjson.dumps(value, default=str)
    except (orjson.JSONEncodeError, TypeError):
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_iso_or_str)
        return text.encode("utf-8", "surrogatepass")


def dumps_pretty(value: Any) -> bytes:
    """UTF-8 JSON with one value per line (two-space indentation) and a final newline."""
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    except (orjson.JSONEncodeError, TypeError):
        text = json.dumps(value, ensure_ascii=False, indent=2, default=_iso_or_str) + "\n"
        return text.encode("utf-8", "surrogatepass")


def _iso_or_str(value: object) -> str:
    isoformat = getattr(value, "isoformat", None)
    return str(isoformat()) if callable(isoformat) else str(value)


def dumps_lines(rows: Iterable[Any], *, prefix: bytes = b"") -> bytes:
    """``prefix``, then every row (a flat array of scalars) as one compact JSON line ending in a newline.

    The fast way dumps all rows as one array in C and cuts it at the row boundaries, ``],[``; that is exact when
    the boundary occurs exactly once per pair of rows, i.e. no text cell holds ``],[`` itself. Otherwise, and when
    orjson refuses a value, each row is dumped on its own. The result is put together in one copy (a megabyte
    copied needlessly costs more in fresh pages than in bytes).
    """
    rows = rows if isinstance(rows, list) else list(rows)
    if not rows:
        return prefix
    try:
        whole = orjson.dumps(rows)
        if whole.count(b"],[") == len(rows) - 1:
            lines = whole.replace(b"],[", b"]\n[")
            del whole
            return b"".join((prefix, memoryview(lines)[1:-1], b"\n"))
        return b"".join([prefix, *(orjson.dumps(row) + b"\n" for row in rows)])
    except (orjson.JSONEncodeError, TypeError):
        return b"".join([prefix, *(dumps_compact(row) + b"\n" for row in rows)])
