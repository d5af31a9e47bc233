"""The per-turn budget over MCP: calls of one turn id (or calls that overlap in time) share 200,000 characters. The
server runs in the test's process (the SDK's in-memory transport): the turns are the server's, not a transport's."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp import Client

from tests.conftest import RuntimeFactory
from tests.mcp_helpers import call_meta, in_process_client, request_meta, run_bounded, structured, text_of

BUDGET = 200_000
PARALLEL = 10
CHARS = 30_000


def big(n: int) -> dict[str, Any]:
    return {"code": f"print('{n}' + 'x' * {CHARS - 2})"}


HOLD_S = 1.5  # the first call of a batch runs this long, so the others (sent at once) arrive while it runs


async def parallel_calls(client: Client, meta: types.RequestParamsMeta | None) -> list[types.CallToolResult]:
    """Ten calls sent at once; the first holds the sandbox for a while, so every other one arrives while it runs
    (a loaded machine may take a moment to read them), whether or not they name a turn."""
    results: list[types.CallToolResult | None] = [None] * PARALLEL

    async def one(n: int) -> None:
        arguments = big(n)
        if n == 0:
            arguments["code"] = f"import time; time.sleep({HOLD_S})\n" + arguments["code"]
        results[n] = await client.call_tool("run_python", arguments, meta=meta)

    async with anyio.create_task_group() as group:
        for n in range(PARALLEL):
            group.start_soon(one, n)
    return [r for r in results if r is not None]


def test_parallel_calls_of_one_turn_share_the_budget_and_later_calls_of_the_turn_count_it(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory()

    async def scenario() -> dict[str, Any]:
        async with in_process_client(runtime, read_timeout_seconds=120) as client:
            turn = request_meta({"sandbox-runtime/turn": "turn-1"})
            first = await parallel_calls(client, turn)
            late = await client.call_tool("run_python", big(99), meta=turn)
            alone = await client.call_tool("run_python", big(98))  # a new turn: nothing else in flight
            overlapping = await parallel_calls(client, None)  # no turn id: overlapping calls form a turn
        return {"first": first, "late": late, "alone": alone, "overlapping": overlapping}

    seen = run_bounded(scenario)
    for batch in ("first", "overlapping"):
        shown = [len(text_of(r)) for r in seen[batch]]
        assert sum(shown) <= BUDGET, (batch, shown)
        replaced = [call_meta(r)["replaced"] for r in seen[batch]]
        assert 0 < sum(replaced) < PARALLEL
        assert all(structured(r)["file"]["chars"] >= CHARS for r in seen[batch])
    assert call_meta(seen["late"])["replaced"]  # the turn had used its budget already
    assert not call_meta(seen["alone"])["replaced"]
    assert len(text_of(seen["alone"])) > CHARS
    (record,) = runtime.state.conversations()
    turns = {d.call_id: d.turn_id for d in runtime.conversation(record.id).decisions()}
    first_ids = {call_meta(r)["call-id"] for r in seen["first"]}
    assert {turns[call_id] for call_id in first_ids} == {"turn-1"}
    overlap_turns = {turns[call_meta(r)["call-id"]] for r in seen["overlapping"]}
    assert len(overlap_turns) == 1  # one generated turn id for the overlapping calls
