"""Spilling one tool result: at ``threshold_chars`` or more it is written to ``results/spill/`` first.

The model then gets the result with the file's address (or, above the inline cap, a preview and the address),
and the host gets a :class:`ResultDescriptor`. Counting is in characters (code points), never bytes or tokens;
the inline cap is given in tokens and estimated as characters / 4, so no tokenizer runs on this path.

Shapes: an MCP ``CallToolResult`` (``structuredContent``, or text blocks holding serialized JSON) is unwrapped
and written as the JSON itself, pretty-printed with one value per line; a recognised table is written as a typed
table file (:mod:`~sandbox_runtime.tables.table`); any other JSON as pretty JSON; the rest as text. The same
input always gives the same bytes, file name and stand-in text. A failed spill never fails the call.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.errors import PathExists, PathRejected
from sandbox_runtime.models import ResultDescriptor
from sandbox_runtime.policy import SpillPolicy
from sandbox_runtime.spill.fast_json import SpillFile, SpillFormat, fast_json_file
from sandbox_runtime.spill.manifest import record_in_manifest
from sandbox_runtime.spill.streamed import StreamedFile, TableStream, buffer_or_stream
from sandbox_runtime.store.safe_paths import PRIVATE_FILE_MODE, ResultsRoot
from sandbox_runtime.tables.jsonio import dumps_compact, dumps_pretty, loads, paused_gc
from sandbox_runtime.tables.table import Table, recognise_table, table_file_bytes
from sandbox_runtime.telemetry.tracing import span

__all__ = [
    "SpillOutcome",
    "file_stem",
    "is_mcp_error",
    "publish_once",
    "result_text",
    "spill_result",
]

logger = logging.getLogger(__name__)
_FORMAT = "sandbox_runtime.spill.format"  # the attributes of a spill's span
_STREAMED = "sandbox_runtime.spill.streamed"

_TOO_DEEP = "[value not shown"
_PREVIEW_ROWS = 50  # rows of a streamed table kept for its preview
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_NAME_MAX_CHARS = 80


class SpillOutcome(BaseModel):
    """What the model sees, the descriptor when a file was written, and a warning when writing failed.

    ``stand_in`` is the short form (preview and path) a spilled result can be replaced by; ``text`` already is
    the stand-in when the result was over the inline cap. Both are None/equal when nothing was spilled.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    stand_in: str | None = None
    descriptor: ResultDescriptor | None = None
    warning: str | None = None
    failed: str | None = None  # a streamed table's rows stopped with this error (what came is kept)


def is_mcp_error(result: object) -> bool:
    """An MCP ``CallToolResult`` with ``isError: true``."""
    return isinstance(result, dict) and isinstance(result.get("content"), list) and result.get("isError") is True


def result_text(result: object) -> str:
    """The text the model would see inline for ``result``.

    MCP results lose their wrapper: ``structuredContent`` wins; otherwise the blocks are joined — text as it is,
    embedded text resources with their URI, other blocks (images, audio, binary resources, links) named with
    their type and size, never inlined. Bytes are decoded as UTF-8 (invalid bytes replaced).
    """
    return _unwrap(result)[0]


def _unwrap(result: object) -> tuple[str, Any]:
    """The text, and the value when the result already is a structured one (None for text, not parsed here)."""
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        if result.get("structuredContent") is not None:
            value = result["structuredContent"]
            return _compact(value), value
        result = "\n".join(_block_text(block) for block in result["content"])
    if isinstance(result, bytes | bytearray | memoryview):
        result = bytes(result).decode("utf-8", errors="replace")
    if isinstance(result, str):
        return result, None
    if isinstance(result, dict | list | tuple):
        text = _compact(result)
        return (text, result) if not text.startswith(_TOO_DEEP) else (text, None)
    return str(result), None


def _block_text(block: object) -> str:
    if not isinstance(block, dict):
        return str(block)
    kind = str(block.get("type", "block"))
    if kind == "text":
        return str(block.get("text", ""))
    resource = block.get("resource")
    if kind == "resource" and isinstance(resource, dict):
        if isinstance(resource.get("text"), str):
            return f"[resource {resource.get('uri', '')}]\n{resource['text']}"
        size = len(str(resource.get("blob", "")))
        kind_of = resource.get("mimeType", "binary")
        return f"[resource {resource.get('uri', '')}: {kind_of}, {size:,} base64 characters not shown]"
    if kind == "resource_link":
        return f"[resource_link {block.get('uri', '')}: {block.get('name', '')}]"
    size = len(str(block.get("data", "")))
    return f"[{kind}: {block.get('mimeType', 'unknown type')}, {size:,} base64 characters not shown]"


def _json_in(text: str) -> Any:
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        return loads(stripped)
    except (ValueError, RecursionError):
        return None


def _compact(value: Any) -> str:
    try:
        return dumps_compact(value).decode("utf-8", "surrogatepass")
    except RecursionError:
        return f"{_TOO_DEEP} (a {type(value).__name__} nested deeper than Python can serialize; not shown)]"


def file_stem(tool: str, call_id: str) -> str:
    """A safe, deterministic file name stem for one call; a short hash keeps altered names apart."""
    raw = f"{tool}-{call_id}"
    stem = _UNSAFE_NAME.sub("_", raw).strip("._-")[:_NAME_MAX_CHARS] or "result"
    if stem != raw:
        stem += "-" + hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return stem


def _payload(text: str, value: Any) -> SpillFile:
    """The file for a result: JSON text on the fast path when it takes it, else parsed and recognised here."""
    if value is None:
        fast = fast_json_file(text)
        if fast is not None:
            return fast
        value = _json_in(text)
    found = recognise_table(value if value is not None else text)
    if isinstance(found, Table):
        return SpillFile("table", table_file_bytes(found), found.row_count, found.columns, found.column_types)
    if value is not None:
        return SpillFile("json", dumps_pretty(value))
    return SpillFile("text", text.encode("utf-8", "surrogatepass"))


_EXTENSION: dict[SpillFormat, str] = {"json": ".json", "table": ".table.jsonl", "text": ".txt"}


def spill_result(
    root: ResultsRoot,
    result: object,
    *,
    tool: str,
    call_id: str,
    policy: SpillPolicy,
    now: dt.datetime,
    threshold_chars: int | None = None,
    durable: bool = True,
) -> SpillOutcome:
    """Spill ``result`` when it is ``threshold_chars`` (default: the policy's) or longer; never raises for a
    failed write. A new file is also listed in the results folder's manifest. ``durable=False`` leaves the
    fsync to the caller (one :meth:`ResultsRoot.sync` for a whole turn)."""
    threshold = threshold_chars or policy.threshold_chars
    job = _Job(root, tool, call_id, policy, now, durable)
    if isinstance(result, TableStream):
        found = buffer_or_stream(result, threshold, _PREVIEW_ROWS)
        if isinstance(found, StreamedFile):
            with found.body, span("spill.write", {_FORMAT: "table", _STREAMED: True}):
                return _spill_streamed(job, found)
        result = found
    with paused_gc():
        text, value = _unwrap(result)
        if len(text) < threshold:
            return SpillOutcome(text=text)
        kind, data, rows, columns, types = _payload(text, value)
        del value  # freed while the collector is paused, so it never walks the parsed values
    over_cap = len(text) > policy.inline_cap_chars
    preview = text[: policy.preview_chars]
    stem = file_stem(tool, call_id)
    relative = f"spill/{stem}{_EXTENSION[kind]}"
    try:
        with span("spill.write", {_FORMAT: kind, "sandbox_runtime.spill.bytes": len(data)}):
            path, new = publish_once(root, relative, data, durable=durable)
    except (OSError, PathRejected) as exc:
        warning = f"the result of {tool} could not be saved to {relative}: {exc}"
        logger.warning(warning)
        shown = text[: policy.inline_cap_chars]
        cut = f" (only the first {len(shown):,} of {len(text):,} characters are shown)" if over_cap else ""
        return SpillOutcome(text=f"{shown}\n[not saved to a file{cut}: {exc}]", warning=warning)
    descriptor = ResultDescriptor(
        path=path,
        format=kind,
        bytes=len(data),
        chars=len(text),
        sha256=hashlib.sha256(data).hexdigest(),
        rows=rows,
        columns=None if columns is None else list(columns),
        column_types=None if types is None else list(types),
        preview=preview,
        truncated_inline=over_cap,
        expires_at=job.expires_at(),
    )
    return _outcome(job, text, descriptor, new)


@dataclass(frozen=True)
class _Job:
    """One result being spilled: where, for which call, under which policy."""

    root: ResultsRoot
    tool: str
    call_id: str
    policy: SpillPolicy
    now: dt.datetime
    durable: bool

    def expires_at(self) -> str:
        return _iso(self.now + dt.timedelta(seconds=self.policy.retention_s))


def _outcome(job: _Job, text: str, descriptor: ResultDescriptor, new: bool) -> SpillOutcome:
    unlisted: str | None = None
    if new:
        unlisted = record_in_manifest(
            job.root,
            descriptor,
            stem=file_stem(job.tool, job.call_id),
            tool=job.tool,
            call_id=job.call_id,
            created_at=_iso(job.now),
            max_bytes=job.policy.manifest_max_bytes,
            durable=job.durable,
        )
    stand_in = _stand_in(descriptor, job.tool, "it is one of the largest results of this turn")
    if descriptor.truncated_inline:
        shown = _stand_in(descriptor, job.tool, "it is too large to show")
    else:
        shown = _with_address(text, descriptor)
    return SpillOutcome(text=shown, stand_in=stand_in, descriptor=descriptor, warning=unlisted)


def _spill_streamed(job: _Job, found: StreamedFile) -> SpillOutcome:
    """Publish a streamed table chunk by chunk; the model sees it inline only when it fits the inline cap."""
    kind: SpillFormat = "text" if found.ragged else "table"
    relative = f"spill/{file_stem(job.tool, job.call_id)}{'.jsonl' if found.ragged else _EXTENSION['table']}"
    try:
        path = job.root.create_file(relative, found.chunks(), durable=job.durable, mode=PRIVATE_FILE_MODE)
    except (OSError, PathRejected) as exc:
        warning = f"the table from {job.tool} ({found.rows:,} rows) could not be saved to {relative}: {exc}"
        logger.warning(warning)
        preview = json.dumps({"columns": found.columns, "rows": found.preview_rows}, ensure_ascii=False, default=str)
        return SpillOutcome(
            text=f"{preview}\n[not saved to a file (only the first {len(found.preview_rows):,} of {found.rows:,} "
            f"rows are shown): {exc}]",
            warning=warning,
        )
    over_cap = found.size_chars > job.policy.inline_cap_chars
    text = "" if over_cap else found.text()
    descriptor = ResultDescriptor(
        path=path,
        format=kind,
        bytes=found.size_bytes,
        chars=found.size_chars,
        sha256=found.sha256,
        rows=None if found.ragged else found.rows,
        columns=None if found.ragged else list(found.columns),
        column_types=None if found.ragged else list(found.column_types),
        preview=(text or found.head.decode("utf-8", "ignore"))[: job.policy.preview_chars],
        truncated_inline=over_cap,
        expires_at=job.expires_at(),
    )
    outcome = _outcome(job, text, descriptor, True)
    if found.ragged:
        outcome = outcome.model_copy(update={"text": f"{outcome.text}\n[not a table: {found.ragged}]"})
    if found.failed:
        marker = f"[incomplete: the rows stopped after {found.rows:,} with {found.failed}]"
        outcome = outcome.model_copy(update={"text": f"{outcome.text}\n{marker}", "failed": found.failed})
    return outcome


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="seconds")


def publish_once(root: ResultsRoot, relative: str, data: bytes, *, durable: bool = True) -> tuple[str, bool]:
    """Write once: the same call's result again finds its own file (same bytes) instead of a second copy."""
    try:
        return root.create_file(relative, data, durable=durable, mode=PRIVATE_FILE_MODE), True
    except PathExists:
        if root.read_bytes(relative, max_bytes=len(data)) != data:
            raise
        return root.sandbox_path(root.parse(relative)), False


def _shape(d: ResultDescriptor) -> str:
    shape = f"{d.format}, {d.bytes:,} bytes" + (f", {d.chars:,} characters" if d.chars is not None else "")
    if d.rows is not None and d.columns is not None:
        shape += f", {d.rows:,} rows; columns: {', '.join(d.columns)}"
    return shape


def _with_address(text: str, d: ResultDescriptor) -> str:
    return (
        f"{text}\n[saved to {d.path} ({_shape(d)}); pass this path to export_table, render_table or run_python "
        f"instead of copying values]"
    )


def _stand_in(d: ResultDescriptor, tool: str, why: str) -> str:
    """The model-facing words: where the result is, in what shape, with units, and the next step."""
    shape = _shape(d)
    return (
        f"The result of {tool} is not shown in full ({d.chars:,} characters): {why}. "
        f"It is saved to {d.path} ({shape}). "
        f"Read parts with read_file (offset, limit), or pass the path to export_table, render_table or "
        f"run_python. The first {len(d.preview):,} characters:\n{d.preview}"
    )
