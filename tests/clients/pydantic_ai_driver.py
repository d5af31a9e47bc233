"""pydantic-ai's MCP client (``MCPToolset`` over stdio) driven by a scripted ``FunctionModel`` (no LLM).

Imported by ``tests/test_clients_pydantic_ai.py`` when pydantic-ai is installed beside the project; else run in
its own environment as ``.venv-pydantic-ai/bin/python -m tests.clients.pydantic_ai_driver`` from the repository
root, with a JSON request on stdin (``{"command": [...], "env": {...}, "timeout_s": 120}``) and the walk's report
as JSON on stdout.

What the model "received" is what pydantic-ai would put in front of a real model: each tool return part's
``model_response_str()`` (a retried call — an MCP ``isError`` result, which pydantic-ai turns into ``ModelRetry``
— included), taken from the message history the model function is handed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.clients.walk import ScriptedModel

PROMPT = "Export every order to a spreadsheet, sorted by total, and give it to me."


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


async def walk(command: list[str], env: dict[str, str], timeout_s: float = 120.0) -> dict[str, Any]:
    """Run the scripted walk against ``command`` (an MCP server over stdio); the report of what the model saw."""
    model = ScriptedModel()
    offered: list[str] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered[:] = [tool.name for tool in info.function_tools]
        last = messages[-1]
        if isinstance(last, ModelRequest):
            for part in last.parts:
                if isinstance(part, ToolReturnPart):
                    model.receive(
                        part.tool_name,
                        part.model_response_str(),
                        is_error=part.outcome != "success",
                        raw={"outcome": part.outcome, "content": _jsonable(part.content)},
                    )
                elif isinstance(part, RetryPromptPart):  # older pydantic-ai: a retry is its own part
                    model.receive(
                        part.tool_name or "?", part.model_response(), is_error=True, raw=_jsonable(part.content)
                    )
        call = model.next_call()
        if call is None:
            return ModelResponse(parts=[TextPart("Here is your spreadsheet.")])
        return ModelResponse(
            parts=[ToolCallPart(call.tool, call.arguments, tool_call_id=f"model-call-{len(model.calls)}")]
        )

    # keep_alive=False: the server process ends with the session instead of outliving the test
    transport = StdioTransport(command[0], command[1:], env=env, keep_alive=False)
    toolset: MCPToolset[None] = MCPToolset(transport, init_timeout=60.0, read_timeout=timeout_s, max_retries=3)
    agent = Agent(FunctionModel(respond), toolsets=[toolset])
    result = await agent.run(PROMPT)
    return {**model.report(), "offered": offered, "output": str(result.output)}


def main() -> None:
    request = json.load(sys.stdin)
    report = anyio.run(walk, request["command"], request["env"], float(request.get("timeout_s", 120.0)))
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
