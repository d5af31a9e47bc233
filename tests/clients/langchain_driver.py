"""LangChain's MCP adapter (``langchain-mcp-adapters``) with its default session handling, driven by the scripted
walk: ``MultiServerMCPClient({...}).get_tools()``, then each tool invoked with a model's tool call, so the result is
the ``ToolMessage`` a LangChain agent would put in front of its model. By default every tool call opens a session
of its own — over stdio, a new server process.

Runs in ``.venv-langchain`` (the adapter pins ``mcp<2``) as ``python -m tests.clients.langchain_driver`` from the
repository root. stdin: ``{"connection": <a MultiServerMCPClient connection>}``; stdout: the walk's report as JSON,
with each ``ToolMessage`` (content blocks, status, artifact) as the return's ``raw``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

# only installed in .venv-langchain: the project's mypy settings take both as missing elsewhere (type-check this
# file against them with --python-executable .venv-langchain/bin/python)
from langchain_core.messages import ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.sessions import Connection

from tests.clients.walk import ScriptedModel


def _text(content: Any) -> str:
    """The text a chat model reads in a ToolMessage's content (a string, or a list of content blocks)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block["text"]))
    return "\n".join(parts)


async def walk(connection: Connection, timeout_s: float) -> dict[str, Any]:
    client = MultiServerMCPClient({"sandbox-runtime": connection})
    tools = {tool.name: tool for tool in await asyncio.wait_for(client.get_tools(), timeout_s)}
    model = ScriptedModel()
    while (call := model.next_call()) is not None:
        tool_call = {"type": "tool_call", "id": f"model-call-{len(model.calls)}", "name": call.tool}
        message = await asyncio.wait_for(tools[call.tool].ainvoke({**tool_call, "args": call.arguments}), timeout_s)
        assert isinstance(message, ToolMessage), repr(message)
        raw = {"content": message.content, "status": message.status, "artifact": message.artifact}
        model.receive(call.tool, _text(message.content), is_error=message.status == "error", raw=raw)
    metadata = {name: tool.metadata for name, tool in tools.items()}
    return {**model.report(), "offered": list(tools), "metadata": metadata}


def main() -> None:
    request = json.load(sys.stdin)
    report = asyncio.run(walk(request["connection"], float(request.get("timeout_s", 120.0))))
    sys.stdout.write(json.dumps(report, default=repr) + "\n")


if __name__ == "__main__":
    main()
