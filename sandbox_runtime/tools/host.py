"""The host's own tools (``Runtime.register_tool``, the gateway's upstream tools) as the pipeline sees them.

A handler gets the validated arguments, and — when it was registered with ``pass_call=True`` — a
:class:`HostCall` too: the conversation, the call id, its results folder (to save files a result refers to) and
the call's :class:`~sandbox_runtime.control.CallControl` (cancellation, progress). What it returns goes through
the spill like any result; an MCP ``CallToolResult`` keeps its ``isError`` flag, and its ``resource_link``
blocks are passed on to an MCP client as they are. An exception it raises becomes a tool error the model reads.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from sandbox_runtime.control import CallControl
from sandbox_runtime.spill.spiller import is_mcp_error, result_text
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tools.base import SpillMode, ToolContext, ToolReturn, ToolSpec

__all__ = ["HostCall", "host_tool"]

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
        if is_mcp_error(result):
            return ToolReturn(is_error=True, error=result_text(result))  # an MCP tool error keeps its flag
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
