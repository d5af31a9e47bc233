"""Spilling one tool result: at ``threshold_chars`` or more it is written to ``results/spill/`` first.

The model then gets the result with the file's address (or, above the inline cap, a preview and the address),
and the host gets a :class:`ResultDescriptor`. Counting is in characters (code points), never bytes or tokens;
the inline cap is given in tokens and estimated as characters / 4, so no tokenizer runs on this path.

Shapes: an MCP ``CallToolResult`` (``structuredContent``, or text blocks holding serialized JSON) is unwrapped
and written as the JSON itself, pretty-printed with one value per line; a recognised table is written as a typed
table file (:mod:`~sandbox_runtime.spill.tables`); any other JSON as pretty JSON; the rest as text. The same
input always gives the same bytes, file name and stand-in text. A failed spill never fails the call.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import logging
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.errors import PathExists, PathRejected
from sandbox_runtime.policy import SpillPolicy
from sandbox_runtime.spill.tables import Table, recognise_table, write_table_file
from sandbox_runtime.store.safe_paths import ResultsRoot

__all__ = ["ResultDescriptor", "SpillOutcome", "spill_result", "unwrap_result"]

logger = logging.getLogger(__name__)

SpillFormat = Literal["json", "table", "text"]
_CHARS_PER_TOKEN = 4
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_NAME_MAX_CHARS = 80


class ResultDescriptor(BaseModel):
    """What a spilled result carries (ARCHITECTURE.md): the same object in the Python API and over MCP."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spilled: Literal[True] = True
    path: str
    format: SpillFormat
    bytes: int
    chars: int
    sha256: str
    rows: int | None = None
    columns: list[str] | None = None
    column_types: list[str] | None = None
    preview: str
    truncated_inline: bool
    expires_at: str


class SpillOutcome(BaseModel):
    """What the model sees (``text``), the descriptor when a file was written, and a warning when it failed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    descriptor: ResultDescriptor | None = None
    warning: str | None = None


def unwrap_result(result: object) -> tuple[str, Any]:
    """The text the model would see inline, and the JSON value inside it (None when it holds none).

    MCP results lose their wrapper: ``structuredContent`` wins; otherwise the text blocks are joined, and a
    text that is serialized JSON becomes that value. Non-text blocks are named in the text, not inlined.
    """
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        if result.get("structuredContent") is not None:
            value = result["structuredContent"]
            return _compact(value), value
        parts = []
        for block in result["content"]:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, dict):
                parts.append(f"[{block.get('type', 'block')}: {block.get('mimeType', 'unknown type')}]")
        result = "\n".join(parts)
    if isinstance(result, str):
        return result, _json_in(result)
    if isinstance(result, dict | list):
        return _compact(result), result
    text = str(result)
    return text, None


def _json_in(text: str) -> Any:
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return None


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _file_name(tool: str, call_id: str) -> str:
    stem = f"{_UNSAFE_NAME.sub('_', tool)}-{_UNSAFE_NAME.sub('_', call_id)}".strip("._-") or "result"
    return stem[:_NAME_MAX_CHARS]


def _payload(text: str, value: Any) -> tuple[SpillFormat, bytes, Table | None]:
    found = recognise_table(value if value is not None else text)
    if isinstance(found, Table):
        out = io.StringIO()
        write_table_file(found, out)
        return "table", out.getvalue().encode("utf-8", "surrogatepass"), found
    if value is not None:
        pretty = json.dumps(value, ensure_ascii=False, indent=2, default=str) + "\n"
        return "json", pretty.encode("utf-8", "surrogatepass"), None
    return "text", text.encode("utf-8", "surrogatepass"), None


_EXTENSION: dict[SpillFormat, str] = {"json": ".json", "table": ".table.jsonl", "text": ".txt"}


def spill_result(
    root: ResultsRoot, result: object, *, tool: str, call_id: str, policy: SpillPolicy, now: dt.datetime
) -> SpillOutcome:
    """Spill ``result`` when it is ``threshold_chars`` or longer; never raises for a failed write."""
    text, value = unwrap_result(result)
    if len(text) < policy.threshold_chars:
        return SpillOutcome(text=text)
    over_cap = len(text) / _CHARS_PER_TOKEN > policy.inline_cap_tokens
    preview = text[: policy.preview_chars]
    kind, data, table = _payload(text, value)
    relative = f"spill/{_file_name(tool, call_id)}{_EXTENSION[kind]}"
    try:
        path = _publish(root, relative, data)
    except (OSError, PathRejected) as exc:
        warning = f"the result of {tool} could not be saved to {relative}: {exc}"
        logger.warning(warning)
        shown = preview if over_cap else text
        cut = f" (only the first {len(preview):,} of {len(text):,} characters are shown)" if over_cap else ""
        return SpillOutcome(text=f"{shown}\n[not saved to a file{cut}: {exc}]", warning=warning)
    descriptor = ResultDescriptor(
        path=path,
        format=kind,
        bytes=len(data),
        chars=len(text),
        sha256=hashlib.sha256(data).hexdigest(),
        rows=len(table.rows) if table else None,
        columns=list(table.columns) if table else None,
        column_types=list(table.column_types) if table else None,
        preview=preview,
        truncated_inline=over_cap,
        expires_at=(now + dt.timedelta(seconds=policy.retention_s)).astimezone(dt.UTC).isoformat(),
    )
    return SpillOutcome(text=_stand_in(text, descriptor, tool), descriptor=descriptor)


def _publish(root: ResultsRoot, relative: str, data: bytes) -> str:
    """Write once: the same call's result again finds its own file (same bytes) instead of a second copy."""
    try:
        return root.create_file(relative, data)
    except PathExists:
        if root.read_bytes(relative, max_bytes=len(data)) != data:
            raise
        return root.sandbox_path(root.parse(relative))


def _stand_in(text: str, d: ResultDescriptor, tool: str) -> str:
    """The model-facing words: where the result is, in what shape, with units, and the next step."""
    shape = f"{d.format}, {d.bytes:,} bytes, {d.chars:,} characters"
    if d.rows is not None and d.columns is not None:
        shape += f", {d.rows:,} rows; columns: {', '.join(d.columns)}"
    where = (
        f"[saved to {d.path} ({shape}); pass this path to export_table, render_table or run_python "
        f"instead of copying values]"
    )
    if not d.truncated_inline:
        return f"{text}\n{where}"
    return (
        f"The result of {tool} is too large to show ({d.chars:,} characters). It is saved to {d.path} ({shape}). "
        f"Read parts with read_file (offset, limit), or pass the path to export_table, render_table or "
        f"run_python. The first {len(d.preview):,} characters:\n{d.preview}"
    )
