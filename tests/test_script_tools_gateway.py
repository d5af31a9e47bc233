"""A script calls an upstream MCP server's tools through the gateway, asked for approval by the MCP client's user.

The upstream is the reference server ``@modelcontextprotocol/server-everything`` (from npm; scripts/setup-dev.sh
installs it into .npm-tools); the client is the MCP SDK's own, in front of ``sandbox-runtime serve``. The user
sees each of the script's calls with its real arguments and the script that made it, approves one and declines
the other; the script reads the approved call's result and catches the declined one.
"""

from __future__ import annotations

import os
from pathlib import Path

import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext

from tests.conftest import RuntimeFactory
from tests.mcp_helpers import run_bounded, stdio_params, text_of

EVERYTHING = Path(__file__).resolve().parent.parent / ".npm-tools" / "node_modules" / ".bin" / "mcp-server-everything"

if not EVERYTHING.exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"{EVERYTHING} is missing: scripts/setup-dev.sh installs it")
    pytest.skip("server-everything is not installed (run scripts/setup-dev.sh)", allow_module_level=True)

SCRIPT = """
import sandbox_tools as tools
print(tools.everything__get_sum(a=2, b=40).text)
for words in ("yes, send this", "no, keep this"):
    try:
        print("sent:", tools.everything__echo(message=words).text)
    except tools.ToolDenied as denied:
        print("declined:", words, "|", denied.message)
"""


class User:
    """Approves a call whose arguments say yes; remembers every question."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        self.asked.append(params.message)
        if '"yes, send this"' in params.message:
            return types.ElicitResult(action="accept", content={"approve": True})
        return types.ElicitResult(action="decline")


def test_a_script_calls_upstream_tools_and_the_clients_user_approves_each_call(
    runtime_factory: RuntimeFactory, served_state: Path, tmp_path: Path
) -> None:
    policy = tmp_path / "scripts.toml"
    policy.write_text(
        'name = "scripts"\n[script_tools]\nallowed = ["everything__*"]\n'
        '[approval.tool_rules]\n"everything__echo" = "ask"\n'
    )
    params = stdio_params(served_state, "--upstream", f"everything={EVERYTHING} stdio", policy=policy)
    user = User()

    async def scenario() -> types.CallToolResult:
        async with Client(params, mode="legacy", elicitation_callback=user, read_timeout_seconds=120) as client:
            return await client.call_tool("run_python", {"code": SCRIPT})

    result = run_bounded(scenario)
    text = text_of(result)
    assert not result.is_error, text
    assert "The sum of 2 and 40 is 42." in text
    assert "sent: Echo: yes, send this" in text
    assert "declined: no, keep this | Denied: the user declined the call." in text
    assert "Tool calls from the script: 3 (2 ok, 1 failed)." in text
    assert len(user.asked) == 2  # get-sum is allowed without asking; each echo was asked about
    assert all("Approve a call of everything__echo (made by the script /mnt/results/scripts/" in q for q in user.asked)
    assert '"message": "no, keep this"' in user.asked[1]

    runtime = runtime_factory(state_dir=served_state)
    (conversation,) = runtime.state.conversations()
    made = [(r.target, r.status) for r in runtime.state.calls(conversation.id) if r.made_by is not None]
    assert made == [("everything__get-sum", "ok"), ("everything__echo", "ok"), ("everything__echo", "denied")]
