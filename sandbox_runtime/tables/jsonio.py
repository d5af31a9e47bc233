"""Fast JSON for table files and the spill: msgspec parses, orjson writes, the standard library takes what they refuse.

Both are several times faster than ``json``, but refuse some values it takes: lone surrogates, NaN literals and
numbers out of range in input; integers beyond 64 bits, non-string keys and nesting deeper than 1,024 levels in
output. Those fall back to ``json``, so every value that worked before still works, only slower. Parsing is
msgspec's because orjson turns integers beyond 64 bits into floats (12345678901234567890123 would come back as
1.2345678901234568e+22). Both write the same layout: compact rows (no spaces) and two-space indentation for
pretty output; NaN and infinities never reach here (cells map them to NULL).

Nesting: both parsers recurse, so text nested deeper than Python's recursion limit allows (about 1,000 levels, less
in a deep call stack) cannot be parsed; :func:`loads` says so with a ``ValueError`` like any other text that is not
JSON, never a ``RecursionError``. :func:`nesting_depth` and :func:`text_nesting_depth` measure nesting without
recursing (for the policy's ``tools.json_nesting_max``); the writers still raise ``RecursionError`` for a Python
value nested past the recursion limit (the spill says so in place of the value).
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import orjson

__all__ = [
    "dumps_compact",
    "dumps_lines",
    "dumps_pretty",
    "loads",
    "nesting_depth",
    "paused_gc",
    "text_nesting_depth",
]

_CONTAINERS = (dict, list, tuple)
_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')  # a JSON string, or a bracket


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
    """Parse JSON text; raises ``ValueError`` when it is not JSON, also when it is nested deeper than the parsers go
    (msgspec and ``json`` raise ``RecursionError`` there; it is the ``__cause__``)."""
    try:
        try:
            return msgspec.json.decode(text)
        except (msgspec.DecodeError, UnicodeEncodeError):  # not JSON to msgspec, or a str holding lone surrogates
            return json.loads(text)
    except RecursionError as exc:
        raise ValueError(
            f"JSON nested deeper than the parser can go ({text_nesting_depth(text):,} levels; the limit is Python's "
            "recursion limit, about 1,000)"
        ) from exc


def nesting_depth(value: Any) -> int:
    """How deeply arrays and objects nest in ``value``, without recursing: a scalar is 0, ``{}`` and ``[]`` are 1,
    ``{"a": [1]}`` is 2 (lists and tuples count as arrays, dicts as objects). A container shared by several
    parents is measured once; one that holds itself raises ``ValueError`` (it has no JSON form)."""
    if not isinstance(value, _CONTAINERS):
        return 0
    deepest = 0
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:  # a tree (what parsed JSON always is): each container once, at its own level
        node, level = stack.pop()
        if id(node) in seen:
            return _shared_nesting_depth(value)  # shared, or holding itself: measured the careful way
        seen.add(id(node))
        deepest = max(deepest, level)
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, _CONTAINERS):
                stack.append((child, level + 1))
    return deepest


def _shared_nesting_depth(value: Any) -> int:
    """:func:`nesting_depth` of a graph: each container measured once (post-order), a cycle refused."""
    heights: dict[int, int] = {}  # id of a measured container -> its depth
    on_path: set[int] = set()  # ids of the containers being measured: an ancestor met again is a cycle
    stack: list[tuple[Any, list[Any] | None]] = [(value, None)]  # (container, its containers once entered)
    while stack:
        node, entered = stack.pop()
        key = id(node)
        if entered is not None:  # all its containers are measured
            on_path.discard(key)
            heights[key] = 1 + max([heights[id(c)] for c in entered])
            continue
        if key in heights:
            continue
        if key in on_path:
            raise ValueError(f"a {type(node).__name__} holds itself: it has no JSON form")
        inner = [c for c in (node.values() if isinstance(node, dict) else node) if isinstance(c, _CONTAINERS)]
        if not inner:
            heights[key] = 1
            continue
        on_path.add(key)
        stack.append((node, inner))
        stack.extend((c, None) for c in inner)
    return heights[id(value)]


def text_nesting_depth(text: str | bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text (outside strings), found by a scan that parses nothing; for
    valid JSON it equals :func:`nesting_depth` of the parsed value."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    depth = deepest = 0
    for token in _STRING_OR_BRACKET.finditer(data):
        bracket = token[0]
        if bracket in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif bracket in (b"]", b"}"):
            depth -= 1
    return deepest


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
