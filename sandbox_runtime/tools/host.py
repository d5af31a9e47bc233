"""The host's own tools (``Runtime.register_tool``, the gateway's upstream tools) as the pipeline sees them.

A handler gets the validated arguments, and — when it was registered with ``pass_call=True`` — a
:class:`HostCall` too: the conversation, the call id, its results folder (to save files a result refers to) and
the call's :class:`~sandbox_runtime.control.CallControl` (cancellation, progress). What it returns goes through
the spill like any result. An exception it raises becomes a tool error the model reads.

An MCP ``CallToolResult`` (its JSON fields) is taken apart (:func:`mcp_tool_return`):

- its ``isError`` flag is kept (the text of its blocks is the error);
- its ``resource_link`` blocks go to an MCP client as they are (``ToolReturn.blocks``); the model reads the
  other blocks, so a handler names its links in a text block when the model should know of them;
- the annotations all its text blocks share (audience, priority) become those of the result's text;
- its ``structuredContent`` is the result's value: the model reads it (then with a line naming each link), the
  spill writes it, tables in it are recognised. A tool with an output schema shows it to MCP clients as it is
  (``ToolReturn.structured``; without a schema there is nothing it must conform to, so it is not passed on).
  The Python SDK's wrapper — ``{"result": X}`` from a tool without an output schema of its own — is no value:
  a text ``X`` leaves the text blocks as the result, any other ``X`` (records, numbers) is the value.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from sandbox_runtime.control import CallControl
from sandbox_runtime.models import SpillMode
from sandbox_runtime.spill.spiller import is_mcp_error, result_text
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tools.base import ToolContext, ToolReturn, ToolSpec

__all__ = ["HostCall", "common_annotations", "host_tool", "is_sdk_wrapper", "mcp_tool_return"]

logger = logging.getLogger(__name__)

_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


@dataclass(frozen=True)
class HostCall:
    """What a host tool registered with ``pass_call=True`` is told about the call it serves."""

    conversation_id: str
    call_id: str
    root: ResultsRoot  # the conversation's results folder (hostile below its top: use its safe methods)
    control: CallControl | None


def host_tool(
    name: str,
    handler: Callable[..., object],
    *,
    description: str,
    schema: dict[str, Any],
    mode: SpillMode,
    pass_call: bool = False,
    title: str | None = None,
    annotations: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
) -> ToolSpec:
    """A spec for one of the host's own tools; its exceptions become tool errors."""
    if not _TOOL_NAME.fullmatch(name):
        raise ValueError(f"tool names match ^[a-zA-Z0-9_-]{{1,64}}$; {name!r} does not")
    for label, checked in (("input", schema), ("output", output_schema)):
        if checked is None:
            continue
        try:
            Draft202012Validator.check_schema(checked)
        except SchemaError as exc:
            raise ValueError(f"the {label} schema of {name} is not a valid JSON schema: {exc.message}") from exc

    def run(ctx: ToolContext, arguments: dict[str, Any]) -> ToolReturn:
        try:
            if pass_call:
                result = handler(arguments, HostCall(ctx.conversation_id, ctx.call_id, ctx.root, ctx.control))
            else:
                result = handler(arguments)
        except Exception as exc:  # the host's tool failed: the model reads why
            logger.info("host tool %s failed: %s", name, exc)
            return ToolReturn(is_error=True, error=f"{type(exc).__name__}: {exc}")
        if _is_mcp_result(result):
            return mcp_tool_return(result, output_schema)
        return ToolReturn(content=result)

    return ToolSpec(
        name,
        description,
        None,
        run,
        spill_mode=mode,
        schema=schema,
        title=title,
        annotations=annotations,
        output_schema=output_schema,
    )


def _is_mcp_result(result: object) -> TypeGuard[dict[str, Any]]:
    return isinstance(result, dict) and isinstance(result.get("content"), list)


def is_sdk_wrapper(structured: object) -> TypeGuard[dict[str, Any]]:
    """``structuredContent`` that is exactly ``{"result": X}``: what the Python SDK makes of a plain return value."""
    return isinstance(structured, dict) and len(structured) == 1 and "result" in structured


def common_annotations(blocks: list[Any]) -> dict[str, Any] | None:
    """The annotations every text block of ``blocks`` carries alike (None: no text block, or none shared)."""
    texts = [b for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    if not texts:
        return None
    each: list[dict[str, Any]] = [_annotations_of(b) for b in texts]
    shared = {key: value for key, value in each[0].items() if all(key in a and a[key] == value for a in each[1:])}
    return shared or None


def _annotations_of(block: dict[str, Any]) -> dict[str, Any]:
    found = block.get("annotations")
    return found if isinstance(found, dict) else {}


def mcp_tool_return(result: dict[str, Any], output_schema: dict[str, Any] | None) -> ToolReturn:
    """What one MCP ``CallToolResult`` (its JSON fields) gives the pipeline; see the module text."""
    blocks = list(result["content"])
    links = [b for b in blocks if isinstance(b, dict) and b.get("type") == "resource_link"]
    shown = [b for b in blocks if not (isinstance(b, dict) and b.get("type") == "resource_link")]
    if is_mcp_error(result):  # an MCP tool error keeps its flag; the text of its blocks is the error
        return ToolReturn(is_error=True, error=result_text({**result, "content": shown}), blocks=links)
    structured = result.get("structuredContent")
    value = structured
    if output_schema is None and is_sdk_wrapper(structured):
        inner = structured["result"]
        structured, value = None, None if isinstance(inner, str) else inner
    content: dict[str, Any] = {"content": shown}
    note = None
    if value is not None:
        content["structuredContent"] = value
        if links:  # the value is what the model reads: the links are named after it
            note = "\n".join(_link_line(link) for link in links)
    return ToolReturn(
        content=content,
        note=note,
        blocks=links,
        annotations=common_annotations(shown),
        structured=structured if output_schema is not None and isinstance(structured, dict) else None,
    )


def _link_line(link: dict[str, Any]) -> str:
    facts = [str(link["mimeType"])] if link.get("mimeType") else []
    if isinstance(link.get("size"), int):
        facts.append(f"{link['size']:,} bytes")
    line = f"[resource_link {link.get('uri', '')}: {link.get('name', '')}"
    line += f" ({', '.join(facts)})" if facts else ""
    line += f" — {link['description']}" if link.get("description") else ""
    return line + "]"
