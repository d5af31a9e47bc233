"""What the MCP server hands a client: a call's outcome as a ``CallToolResult``, and its files as resources.

A result works in every client: the text the model is given goes in ``content`` (the same text history
replays); when a file was written (a spill, an export, a saved error, an attachment) a ``resource_link`` names it
with its size and MIME type, and ``structuredContent`` carries the descriptor. ``resources/read`` serves those
files by URI:

- ``sandbox-runtime://conversations/<conversation>/results/<path>`` — a file of the results folder (read with the
  same refusals as every path tool: no links, FIFOs or devices, nothing outside the folder);
- ``sandbox-runtime://conversations/<conversation>/attachments/<attachment id>`` — a file given to the user.
"""

from __future__ import annotations

import base64
import mimetypes
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_runtime.dispatch import ToolOutcome
from sandbox_runtime.errors import PathNotFound, PathOutsideResults, UnsafeFileType
from sandbox_runtime.runtime import Runtime
from sandbox_runtime.spill.spiller import ResultDescriptor
from sandbox_runtime.state import Attachment
from sandbox_runtime.store.capped import read_capped

__all__ = ["SCHEME", "ResourceFile", "call_result", "read_resource", "result_uri"]

SCHEME = "sandbox-runtime"
_TEXT_MIME = {"json": "application/json", "table": "application/jsonl", "text": "text/plain", "csv": "text/csv"}
_XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def result_uri(conversation_id: str, sandbox_path: str, mount: str) -> str:
    """The URI of a file of the results folder, from its path as the sandbox sees it."""
    relative = sandbox_path.removeprefix(mount.rstrip("/") + "/")
    return f"{SCHEME}://conversations/{conversation_id}/results/{urllib.parse.quote(relative)}"


def _attachment_uri(conversation_id: str, attachment_id: str) -> str:
    return f"{SCHEME}://conversations/{conversation_id}/attachments/{urllib.parse.quote(attachment_id)}"


def mime_type(path: str, kind: str | None = None) -> str:
    """The MIME type of a results file: by its descriptor's format, else by its name."""
    if kind == "xlsx" or path.endswith(".xlsx"):
        return _XLSX
    if kind in _TEXT_MIME:
        return _TEXT_MIME[kind]
    if path.endswith(".jsonl"):
        return "application/jsonl"
    return mimetypes.guess_type(path)[0] or "application/octet-stream"


def call_result(outcome: ToolOutcome, conversation_id: str, mount: str) -> dict[str, Any]:
    """The ``CallToolResult`` (as its JSON fields) for one outcome."""
    content: list[dict[str, Any]] = [{"type": "text", "text": outcome.text}]
    d = outcome.descriptor
    if d is not None:
        content.append(_link(result_uri(conversation_id, d.path, mount), d.path, mime_type(d.path, d.format), d))
    if outcome.error_path is not None:
        uri = result_uri(conversation_id, outcome.error_path, mount)
        content.append(_link(uri, outcome.error_path, "text/plain", None, "The full error text."))
    attachment = _attachment(outcome)
    if attachment is not None:
        uri = _attachment_uri(conversation_id, attachment.attachment_id)
        link = {
            "type": "resource_link",
            "uri": uri,
            "name": attachment.filename,
            "mimeType": attachment.mime_type,
            "size": attachment.bytes,
            "description": "A file for the user (a download).",
        }
        content.append(link)
    structured = {
        "call_id": outcome.call_id,
        "tool": outcome.tool,
        "is_error": outcome.is_error,
        "replaced": outcome.replaced,
        "descriptor": None if d is None else d.model_dump(mode="json"),
        "error_path": outcome.error_path,
        "attachment": None if attachment is None else attachment.model_dump(exclude={"host_path"}),
        "conversation_id": conversation_id,
    }
    return {"content": content, "structuredContent": structured, "isError": outcome.is_error}


def _link(uri: str, path: str, mime: str, d: ResultDescriptor | None, description: str | None = None) -> dict[str, Any]:
    link: dict[str, Any] = {"type": "resource_link", "uri": uri, "name": path.rsplit("/", 1)[-1], "mimeType": mime}
    if d is not None:
        link["size"] = d.bytes
        shape = f"{d.rows:,} rows; columns: {', '.join(d.columns or [])}" if d.rows is not None else d.format
        link["description"] = f"{path} ({shape})"
    elif description:
        link["description"] = f"{path}: {description}"
    return link


def _attachment(outcome: ToolOutcome) -> Attachment | None:
    if outcome.tool != "attach_file" or outcome.is_error or not outcome.details:
        return None
    try:
        return Attachment.model_validate(outcome.details)
    except ValueError:
        return None


@dataclass(frozen=True)
class ResourceFile:
    """One file read for ``resources/read``: text when it decodes as UTF-8 and its type is textual."""

    uri: str
    mime_type: str
    data: bytes

    def contents(self) -> dict[str, Any]:
        if self.mime_type.startswith("text/") or self.mime_type in {"application/json", "application/jsonl"}:
            try:
                return {"uri": self.uri, "mimeType": self.mime_type, "text": self.data.decode("utf-8")}
            except UnicodeDecodeError:
                pass
        blob = base64.b64encode(self.data).decode("ascii")
        return {"uri": self.uri, "mimeType": self.mime_type, "blob": blob}


def read_resource(runtime: Runtime, uri: str) -> ResourceFile:
    """Read a file named by one of this server's URIs; typed errors for anything else."""
    parsed = urllib.parse.urlsplit(uri)
    parts = parsed.path.lstrip("/").split("/", 2)
    if parsed.scheme != SCHEME or parsed.netloc != "conversations" or len(parts) != 3 or not parts[2]:
        raise PathOutsideResults(f"not a {SCHEME}:// resource of this server: {uri}")
    conversation_id, area, rest = parts[0], parts[1], urllib.parse.unquote(parts[2])
    if runtime.state.conversation(conversation_id) is None:
        raise PathNotFound(f"there is no conversation {conversation_id!r}")
    cap = runtime.policy.store.read_max_bytes
    if area == "results":
        root = runtime.store.results_root(runtime.manager.folders(conversation_id))
        return ResourceFile(uri, mime_type(rest), root.read_bytes(rest, max_bytes=cap))
    if area == "attachments":
        for attachment in runtime.state.attachments(conversation_id):
            if attachment.attachment_id == rest:
                return ResourceFile(uri, attachment.mime_type, _read_host_file(Path(attachment.host_path), cap))
        raise PathNotFound(f"conversation {conversation_id!r} has no attachment {rest!r}")
    raise PathOutsideResults(f"unknown resource area {area!r} in {uri}")


def _read_host_file(path: Path, cap_bytes: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise PathNotFound(f"the attachment file {path.name} is gone") from exc
    except OSError as exc:
        raise UnsafeFileType(f"the attachment file {path.name} cannot be read: {exc}") from exc
    with os.fdopen(fd, "rb", buffering=0) as file:
        return read_capped(file, cap_bytes, label=f"the attachment file {path.name}")
