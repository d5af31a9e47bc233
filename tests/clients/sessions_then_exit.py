"""A stdio client process that opens two sessions with ``serve`` one after the other, then exits.

Usage: python -m tests.clients.sessions_then_exit '<serve command as a JSON list>'. After each session it prints
one JSON line (the conversation, the text of its run) and, after the first, waits for a line on stdin before the
second: the test looks at the sandbox in between. Runs in the project's .venv (the MCP SDK 2.x client).
"""

from __future__ import annotations

import json
import os
import sys

import anyio
from mcp import Client, StdioServerParameters

SESSION_S = 180


async def one_session(command: list[str], code: str) -> dict[str, str]:
    params = StdioServerParameters(command=command[0], args=command[1:], env={"PATH": os.environ.get("PATH", "")})
    with anyio.fail_after(SESSION_S):
        async with Client(params, mode="legacy", read_timeout_seconds=120) as client:
            ran = await client.call_tool("run_python", {"code": code})
    meta = dict(ran.meta or {})
    text = ran.content[0].text if ran.content and ran.content[0].type == "text" else ""
    return {"conversation": str(meta.get("sandbox-runtime/conversation")), "text": text}


async def main(command: list[str]) -> None:
    first = await one_session(command, "open('/mnt/results/kept.txt', 'w').write('kept'); print('first')")
    print(json.dumps(first), flush=True)
    await anyio.to_thread.run_sync(sys.stdin.readline)
    second = await one_session(command, "print(open('/mnt/results/kept.txt').read())")
    print(json.dumps(second), flush=True)


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[1]))
