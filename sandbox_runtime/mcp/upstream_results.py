"""An upstream MCP server's ``CallToolResult`` made into what the pipeline takes from a host tool.

The model reads an upstream result as its content blocks say. Blocks the model cannot read as text are saved:

- an image, an audio clip or an embedded resource (a blob, or a text) is written to the conversation's results
  folder as ``spill/<upstream>__<tool>-<call id>-<n>.<ext>`` (``n``: the block's place in the result, from 1;
  the extension from its MIME type), with the same bytes the upstream sent. In the result the block becomes a
  line naming the file (its in-sandbox path, MIME type and size; an embedded text follows its line) and a
  ``resource_link`` to this server's URI of the file, with the block's ``annotations``. The line carries the
  annotations the result's text blocks share, so it changes nothing of theirs;
- an upstream ``resource_link`` is passed on as it is, after a line naming it.

:mod:`~sandbox_runtime.tools.host` then takes the result apart (links to the client, the rest through the
spill). The files are spill files: covered by retention and the quota like every other.

:func:`own_output_schema` says whether an upstream tool's ``outputSchema`` is its own, or the one the Python SDK
makes for a plain return value (``{"result": ...}``), which is not passed on.
"""

from __future__ import annotations

import base64
import binascii
import logging
import mimetypes
import re
from typing import Any

from sandbox_runtime.errors import PathRejected
from sandbox_runtime.mcp.resources import result_uri
from sandbox_runtime.spill.spiller import file_stem, publish_once
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tools.host import common_annotations

__all__ = ["own_output_schema", "save_blocks"]

logger = logging.getLogger(__name__)

_MIME = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,63}")
_EXTENSION = re.compile(r"\.[a-z0-9]{1,10}")
_BINARY = "application/octet-stream"
_KNOWN_EXTENSIONS = {  # mimetypes' first guess is odd for some (e.g. .jpe, .bat)
    "image/jpeg": ".jpg",
    "image/png": ".png",
    "image/gif": ".gif",
    "image/webp": ".webp",
    "image/svg+xml": ".svg",
    "audio/mpeg": ".mp3",
    "audio/wav": ".wav",
    "audio/x-wav": ".wav",
    "audio/ogg": ".ogg",
    "text/plain": ".txt",
    "text/markdown": ".md",
    "text/csv": ".csv",
    "application/json": ".json",
    "application/gzip": ".gz",
}


def own_output_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The tool's output schema when it is its own; None for none, or for the SDK's ``{"result": ...}`` wrapper
    (an object whose one property, required, is ``result``)."""
    if schema is None:
        return None
    properties = schema.get("properties")
    wrapper = (
        schema.get("type") == "object"
        and isinstance(properties, dict)
        and set(properties) == {"result"}
        and schema.get("required") == ["result"]
    )
    return None if wrapper else schema


def save_blocks(
    result: dict[str, Any], root: ResultsRoot, *, conversation_id: str, call_id: str, tool: str
) -> dict[str, Any]:
    """``result`` (an upstream ``CallToolResult`` as JSON fields) with its images, audio and embedded resources
    saved as files and replaced by a line and a link (see the module text); ``tool`` is ``<upstream>__<tool>``."""
    blocks = result.get("content")
    if not isinstance(blocks, list):
        return result
    shared = common_annotations(blocks)
    saver = _Saver(root, conversation_id, call_id, tool, shared)
    content: list[Any] = []
    for n, block in enumerate(blocks, start=1):
        content += saver.block(n, block)
    return {**result, "content": content}


class _Saver:
    def __init__(
        self, root: ResultsRoot, conversation_id: str, call_id: str, tool: str, shared: dict[str, Any] | None
    ) -> None:
        self.root, self.conversation_id, self.call_id, self.tool = root, conversation_id, call_id, tool
        self.shared = shared

    def block(self, n: int, block: object) -> list[Any]:
        if not isinstance(block, dict):
            return [block]
        kind = block.get("type")
        if kind in ("image", "audio"):
            mime = _mime(block.get("mimeType"))
            return self._save(n, block, str(kind), mime, _decoded(block.get("data")), None)
        resource = block.get("resource")
        if kind == "resource" and isinstance(resource, dict):
            uri = str(resource.get("uri", ""))
            if isinstance(resource.get("text"), str):
                text = resource["text"]
                mime = _mime(resource.get("mimeType"), "text/plain")
                return self._save(n, block, f"resource {uri}", mime, text.encode("utf-8", "surrogatepass"), text)
            mime = _mime(resource.get("mimeType"))
            return self._save(n, block, f"resource {uri}", mime, _decoded(resource.get("blob")), None)
        if kind == "resource_link":
            return [self._line(_link_line(block)), block]
        return [block]

    def _save(
        self, n: int, block: dict[str, Any], what: str, mime: str, data: bytes | None, text: str | None
    ) -> list[Any]:
        if data is None:
            return [self._line(f"[{what} ({mime}): not saved, its data is not valid base64]")]
        relative = f"spill/{file_stem(self.tool, self.call_id)}-{n}{_extension(mime)}"
        try:
            path, _new = publish_once(self.root, relative, data, durable=False)  # the turn syncs the folder
        except (OSError, PathRejected) as exc:
            logger.warning("%s of %s could not be saved to %s: %s", what, self.tool, relative, exc)
            return [self._line(f"[{what} ({mime}, {len(data):,} bytes): could not be saved: {exc}]")]
        line = f"[{what} saved as {path}: {mime}, {len(data):,} bytes]"
        link: dict[str, Any] = {
            "type": "resource_link",
            "uri": result_uri(self.conversation_id, path, self.root.mount_path),
            "name": path.rsplit("/", 1)[-1],
            "mimeType": mime,
            "size": len(data),
            "description": f"{path}: the {what} {self.tool} returned",
        }
        if isinstance(block.get("annotations"), dict):
            link["annotations"] = block["annotations"]
        return [self._line(line if text is None else f"{line}\n{text}"), link]

    def _line(self, text: str) -> dict[str, Any]:
        line: dict[str, Any] = {"type": "text", "text": text}
        if self.shared:
            line["annotations"] = self.shared
        return line


def _link_line(link: dict[str, Any]) -> str:
    mime = f" ({link['mimeType']})" if link.get("mimeType") else ""
    description = f" — {link['description']}" if link.get("description") else ""
    return f"[resource_link {link.get('uri', '')}: {link.get('name', '')}{mime}{description}]"


def _mime(raw: object, default: str = _BINARY) -> str:
    """The block's MIME type without parameters, when it is one (an upstream's text is not trusted as a name)."""
    if not isinstance(raw, str):
        return default
    bare = raw.split(";", 1)[0].strip().lower()
    return bare if _MIME.fullmatch(bare) else default


def _extension(mime: str) -> str:
    guessed = _KNOWN_EXTENSIONS.get(mime) or mimetypes.guess_extension(mime) or ".bin"
    return guessed if _EXTENSION.fullmatch(guessed) else ".bin"


def _decoded(data: object) -> bytes | None:
    if not isinstance(data, str):
        return None
    try:
        return base64.b64decode("".join(data.split()), validate=True)  # line breaks in base64 are allowed
    except (binascii.Error, ValueError):
        return None
