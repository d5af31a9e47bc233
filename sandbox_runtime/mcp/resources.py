"""The files of a conversation as MCP resources: their URIs, MIME types, and ``resources/read``.

A call's result links the files it made (:mod:`~sandbox_runtime.mcp.results`); ``resources/read`` serves them by
URI:

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

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import InvalidConversationId, PathNotFound, PathOutsideResults, UnsafeFileType
from sandbox_runtime.store.capped import read_capped
from sandbox_runtime.tenancy import DEFAULT_TENANT, conversation_key

__all__ = ["SCHEME", "ResourceFile", "attachment_uri", "mime_type", "read_resource", "result_uri"]

SCHEME = "sandbox-runtime"
_TEXT_MIME = {"json": "application/json", "table": "application/jsonl", "text": "text/plain", "csv": "text/csv"}
_XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def result_uri(conversation_id: str, sandbox_path: str, mount: str) -> str:
    """The URI of a file of the results folder, from its path as the sandbox sees it."""
    relative = sandbox_path.removeprefix(mount.rstrip("/") + "/")
    return f"{SCHEME}://conversations/{conversation_id}/results/{urllib.parse.quote(relative)}"


def attachment_uri(conversation_id: str, attachment_id: str) -> str:
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


def read_resource(runtime: Runtime, uri: str, tenant: str = DEFAULT_TENANT) -> ResourceFile:
    """Read a file named by one of this server's URIs, in ``tenant``'s own conversations (the id in the URI is
    scoped to it, like an id in ``_meta``: another tenant's files are not found, however spelled); typed errors for
    anything else. An attachment read is written to the audit trail."""
    parsed = urllib.parse.urlsplit(uri)
    parts = parsed.path.lstrip("/").split("/", 2)
    if parsed.scheme != SCHEME or parsed.netloc != "conversations" or len(parts) != 3 or not parts[2]:
        raise PathOutsideResults(f"not a {SCHEME}:// resource of this server: {uri}")
    conversation_id, area, rest = parts[0], parts[1], urllib.parse.unquote(parts[2])
    try:
        key = conversation_key(tenant, conversation_id)
    except InvalidConversationId as exc:
        raise PathNotFound(f"there is no conversation {conversation_id!r}: {exc}") from exc
    if runtime.state.conversation(key) is None:
        raise PathNotFound(f"there is no conversation {conversation_id!r}")
    cap = runtime.policy.store.read_max_bytes
    if area == "results":
        root = runtime.store.results_root(runtime.conversations.folders(key))
        return ResourceFile(uri, mime_type(rest), root.read_bytes(rest, max_bytes=cap))
    if area == "attachments":
        for attachment in runtime.state.attachments(key):
            if attachment.attachment_id == rest:
                data = _read_host_file(Path(attachment.host_path), cap)
                runtime.state.audit.append(
                    "attachment_downloaded",
                    conversation=key,
                    attachment_id=attachment.attachment_id,
                    filename=attachment.filename,
                    bytes=len(data),
                    sha256=attachment.sha256,
                    via="resources/read",
                )
                return ResourceFile(uri, attachment.mime_type, data)
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
