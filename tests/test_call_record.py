"""One record follows a call from its request to its decision: why a call failed is data, set where the failure was
caught, kept in the execution record and in the stored decision (a script's replayed call reads it there, never
from the text), and a file retention removed is said to have expired, in one place, whichever tool asked for it.
All on the fake backend: no engine."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sandbox_runtime import CallControl, Runtime
from sandbox_runtime.models import CallFailure, CallStatus
from sandbox_runtime.pipeline.script_tools import PipelineScriptTools
from sandbox_runtime.policy import policy_from_mapping
from sandbox_runtime.tools.run_python import run_python
from tests.conftest import RuntimeFactory

DAY_S = 86_400
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def refusing(arguments: dict[str, Any]) -> str:
    """A host tool that fails on its input (the model reads why)."""
    raise ValueError(f"cannot handle {sorted(arguments)}")


def graph(arguments: dict[str, Any]) -> dict[str, Any]:
    """A host tool whose result no writer takes (a graph, not a tree): a fault while its result is saved."""
    looped: dict[str, Any] = {"name": "node"}
    looped["self"] = looped
    return looped


@pytest.fixture
def runtime(fake_runtime_factory: RuntimeFactory) -> Runtime:
    policy = policy_from_mapping(
        {
            "approval": {"tool_rules": {"edit_file": "deny", "note": "deny"}},
            "script_tools": {"allowed": ["note", "read_file"]},
        }
    )
    runtime = fake_runtime_factory(policy)
    runtime.register_tool("refusing", refusing, description="Fails on its input.", input_schema=ANY_OBJECT)
    runtime.register_tool("graph", graph, description="A graph.", input_schema=ANY_OBJECT)
    runtime.register_tool("note", lambda arguments: "noted", description="Note it.", input_schema=ANY_OBJECT)
    return runtime


def test_every_way_a_call_can_fail_is_recorded_as_data_where_it_was_caught(runtime: Runtime) -> None:
    conversation = runtime.conversation("failures")
    cancelled = CallControl()
    cancelled.cancel()
    conversation.call("write_file", {"path": "a.txt", "content": "x"}, call_id="ok")
    conversation.call("edit_file", {"path": "a.txt", "old": "x", "new": "y"}, call_id="denied")
    conversation.call("read_file", {"offset": 3}, call_id="invalid")
    conversation.call("read_file", {"path": "missing.txt"}, call_id="missing")
    conversation.call("refusing", {"a": 1}, call_id="refused")
    conversation.call("graph", {}, call_id="internal")
    conversation.call("run_python", {"code": "print(1)"}, call_id="cancelled", control=cancelled)
    conversation.submit("crm__lookup", "host-error", "the CRM said no", is_error=True)

    expected: dict[str, tuple[CallStatus, CallFailure | None]] = {
        "ok": ("ok", None),
        "denied": ("denied", "denied"),
        "invalid": ("error", "invalid_arguments"),
        "missing": ("error", "tool_error"),
        "refused": ("error", "tool_error"),
        "internal": ("error", "internal"),
        "cancelled": ("cancelled", "cancelled"),
        "host-error": ("error", "tool_error"),
    }
    records = {record.call_id: (record.status, record.failure) for record in conversation.calls()}
    assert records == expected
    decisions = {decision.call_id: decision.failure for decision in conversation.decisions()}
    assert decisions == {call_id: failure for call_id, (_status, failure) in expected.items()}


def test_a_scripts_replayed_call_fails_the_way_it_was_decided(runtime: Runtime) -> None:
    """A run tried again with the same call id gets its script's decided calls replayed: the replay says why the
    call failed from the stored decision, as the first answer did."""
    conversation = runtime.conversation("replay")
    handle = runtime.conversations.handle(conversation.id)
    code = (
        "import sandbox_tools as t\n"
        "for call in (lambda: t.note(text='x'), lambda: t.read_file(offset=2)):\n"
        "    try:\n"
        "        call()\n"
        "    except t.ToolError as e:\n"
        "        print(type(e).__name__)\n"
    )
    outputs = []
    for _ in range(2):
        scripts = PipelineScriptTools(
            runtime.dispatcher, runtime.dispatcher.context(conversation.id), "run-1", None, None
        )
        ran = run_python(handle, {"code": code}, scripts=scripts)
        assert ran.status == "ok", ran.message
        outputs.append(ran.stdout)
    assert outputs == ["ToolDenied\nToolArgumentsInvalid\n"] * 2
    assert [(r.call_id, r.failure) for r in conversation.calls()] == [
        ("run-1/1", "denied"),
        ("run-1/2", "invalid_arguments"),
    ]  # recorded once: the second run's calls were replays


PATH_TOOLS: dict[str, Any] = {
    "read_file": lambda path: {"path": path},
    "edit_file": lambda path: {"path": path, "old": "a", "new": "b"},
    "attach_file": lambda path: {"path": path},
    "export_table": lambda path: {"source": path, "format": "csv"},
    "render_table": lambda path: {"source": path},
    "delegate_call": lambda path: {"tool": "note", "args_file": path},
    "run_python": lambda path: {"script_path": path},
}


@pytest.mark.parametrize("tool", list(PATH_TOOLS))
def test_a_file_retention_removed_has_expired_whichever_tool_asks_for_it(
    fake_runtime_factory: RuntimeFactory, tool: str
) -> None:
    runtime = fake_runtime_factory()
    runtime.register_tool("note", lambda arguments: "noted", description="Note it.", input_schema=ANY_OBJECT)
    conversation = runtime.conversation("expiry")
    rows = [{"n": n, "lib": "libpthread.so.0"} for n in range(200)]
    spilled = conversation.submit("inventory", "rows", rows)
    assert spilled.descriptor is not None
    runtime.expire_files(now=time.time() + 8 * DAY_S)

    late = conversation.call(tool, PATH_TOOLS[tool](spilled.descriptor.path), call_id="late")
    assert late.is_error
    assert f"PathExpired: {spilled.descriptor.path} has expired" in late.text
    assert [(r.status, r.failure) for r in conversation.calls() if r.call_id == "late"] == [("error", "tool_error")]
