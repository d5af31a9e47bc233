"""delegate_call: a 200-byte call stands in for an 89,337-character body, which arrives byte for byte."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime import ApprovalRequest, Runtime
from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.pipeline.approval import judge, make_request
from sandbox_runtime.policy import Rule, policy_from_mapping
from sandbox_runtime.tools.delegate import merge_patch, resolve_pointer
from tests.conftest import RuntimeFactory

CAP = 1024 * 1024
TICKET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 200},
        "body": {"type": "string"},
        "labels": {"type": "array", "items": {"type": "string"}},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["title", "body"],
    "additionalProperties": False,
}


@pytest.fixture
def runtime_factory(fake_runtime_factory: RuntimeFactory) -> RuntimeFactory:
    """Delegation, approval and argument files need no sandbox: the fake backend (no engine needed)."""
    return fake_runtime_factory


def call_stack(chars: int) -> str:
    frames: list[str] = []
    n = 0
    while sum(map(len, frames)) < chars:
        frames.append(
            f"#{n} 0x00007f3a{n:08x} in start_thread (arg=<optimized out>) at pthread_create.c:{442 + n}\n"
            f"    from /lib/x86_64-linux-gnu/libpthread.so.0 os_thr_id@entry=232155 tid={232155 + n}\n"
        )
        n += 1
    return "".join(frames)[:chars]


def tracker(runtime: Runtime) -> list[dict[str, Any]]:
    """Register a host tool that keeps exactly what it was sent."""
    received: list[dict[str, Any]] = []

    def create_ticket(arguments: dict[str, Any]) -> dict[str, Any]:
        received.append(arguments)
        return {"id": 4711, "title": arguments["title"]}

    runtime.register_tool(
        "tracker__create_ticket", create_ticket, description="Create a ticket.", input_schema=TICKET_SCHEMA
    )
    return received


def test_a_delegated_call_carries_an_89337_character_body_byte_for_byte(
    docker_runtime_factory: RuntimeFactory,
) -> None:
    runtime = docker_runtime_factory()  # a script in a real sandbox writes the arguments file
    received = tracker(runtime)
    conversation = runtime.conversation("delegate")
    body = call_stack(89_337)
    crash = conversation.submit("debugger__backtrace", "bt", {"backtrace": body, "threads": 12})
    assert crash.descriptor is not None
    # the model's two short steps: a script turns the spill into an arguments file; delegate_call sends it
    script = (
        "import json\n"
        f"crash = json.load(open({crash.descriptor.path!r}))\n"
        "args = {'title': 'worker crash', 'body': crash['backtrace']}\n"
        "json.dump(args, open('/mnt/results/args/ticket.json', 'w'))\n"
    )
    made = conversation.call("run_python", {"code": script}, call_id="write-args")
    assert not made.is_error, made.text
    short = {"tool": "tracker__create_ticket", "args_file": "args/ticket.json", "overrides": {"priority": 2}}
    assert len(json.dumps(short)) < 300
    sent = conversation.call("delegate_call", short, call_id="send")
    assert not sent.is_error, sent.text

    assert received == [{"title": "worker crash", "body": body, "priority": 2}]
    assert "libpthread.so.0" in received[0]["body"]
    assert "os_thr_id@entry=232155" in received[0]["body"]
    record = next(r for r in conversation.calls() if r.call_id == "send")
    assert (record.tool, record.target, record.status) == ("delegate_call", "tracker__create_ticket", "ok")
    assert json.loads(record.arguments or "") == short  # the short call, as the model wrote it
    assert json.loads(record.expanded or "")["body"] == body  # the expanded one, in the record only
    assert record.arguments_sha256 is not None
    assert not record.arguments_cut
    rebuilt = conversation.rebuild_history([{"role": "tool", "tool_call_id": "send", "content": ""}])
    assert rebuilt[0]["content"] == sent.text  # the model's history holds the short result, never the body


def test_the_args_file_cap_is_counted_in_bytes(runtime: Runtime) -> None:
    tracker(runtime)
    conversation = runtime.conversation("cap")
    args_dir = conversation.folders.results / "args"
    prefix, suffix = '{"title": "t", "body": "', '"}'
    for name, size in (("exact.json", CAP), ("over.json", CAP + 1)):
        (args_dir / name).write_text(prefix + "x" * (size - len(prefix) - len(suffix)) + suffix)
        assert (args_dir / name).stat().st_size == size
    ok = conversation.call("delegate_call", {"tool": "tracker__create_ticket", "args_file": "args/exact.json"})
    assert not ok.is_error, ok.text
    over = conversation.call("delegate_call", {"tool": "tracker__create_ticket", "args_file": "args/over.json"})
    assert over.is_error
    assert "FileTooLarge" in over.text
    assert "1048576" in over.text.replace(",", "")


def test_links_fifos_and_folders_are_refused_as_args_files(runtime: Runtime, tmp_path: Path) -> None:
    tracker(runtime)
    conversation = runtime.conversation("hostile")
    args_dir = conversation.folders.results / "args"
    secret = tmp_path / "secret.json"
    secret.write_text('{"title": "host", "body": "secret"}')
    os.symlink(secret, args_dir / "link.json")
    os.mkfifo(args_dir / "fifo.json")
    (args_dir / "dir.json").mkdir()
    for name in ("link.json", "fifo.json", "dir.json", "../../../etc/passwd"):
        out = conversation.call("delegate_call", {"tool": "tracker__create_ticket", "args_file": f"args/{name}"})
        assert out.is_error, name
        assert "UnsafeFileType" in out.text or "PathOutsideResults" in out.text, out.text


def test_a_pointer_selects_part_of_a_spilled_result_and_overrides_merge_over_it(runtime: Runtime) -> None:
    received = tracker(runtime)
    conversation = runtime.conversation("pointer")
    listing = {"items": [{"title": f"issue {i}", "body": "b" * 200, "labels": ["x", "y"]} for i in range(10)]}
    spilled = conversation.submit("tracker__search", "s1", listing)
    assert spilled.descriptor is not None
    arguments = {
        "tool": "tracker__create_ticket",
        "args_file": f"{spilled.descriptor.path}#/items/3",
        "overrides": {"labels": None, "priority": 5},
    }
    out = conversation.call("delegate_call", arguments)
    assert not out.is_error, out.text
    assert received == [{"title": "issue 3", "body": "b" * 200, "priority": 5}]


@pytest.mark.parametrize(
    ("content", "overrides", "tool", "fragment"),
    [
        ('["not", "an", "object"]', None, "tracker__create_ticket", "holds a JSON list, not an object"),
        ('{"title": "t", "body": "b"}', {"priority": 9}, "tracker__create_ticket", "priority: 9 is greater than"),
        ('{"title": "t"}', None, "tracker__create_ticket", "'body' is a required property"),
        ('{"title": "t", "body": "b"}', None, "tracker__nope", "no tool named 'tracker__nope'"),
        ("{broken", None, "tracker__create_ticket", "is not valid JSON"),
        ('{"title": "t", "body": "b"}', None, "delegate_call", "cannot call delegate_call"),
    ],
)
def test_bad_delegations_are_errors_the_model_can_act_on_and_nothing_is_sent(
    runtime: Runtime, content: str, overrides: dict[str, Any] | None, tool: str, fragment: str
) -> None:
    received = tracker(runtime)
    conversation = runtime.conversation("bad")
    (conversation.folders.results / "args" / "a.json").write_text(content)
    out = conversation.call("delegate_call", {"tool": tool, "args_file": "args/a.json", "overrides": overrides})
    assert out.is_error
    assert fragment in out.text
    assert received == []


def test_overrides_that_are_not_an_object_are_refused(runtime: Runtime) -> None:
    tracker(runtime)
    conversation = runtime.conversation("overrides")
    out = conversation.call(
        "delegate_call", {"tool": "tracker__create_ticket", "args_file": "args/a.json", "overrides": [1, 2]}
    )
    assert out.is_error
    assert "overrides: Input should be a valid dictionary" in out.text


def test_approval_sees_the_expanded_arguments_and_a_denial_is_a_tool_error(
    runtime_factory: RuntimeFactory,
) -> None:
    seen: list[ApprovalRequest] = []

    def approver(request: ApprovalRequest) -> bool | str:
        seen.append(request)
        return True if request.arguments_chars < 1_000 else "the body is too long for a ticket"

    policy = policy_from_mapping({"approval": {"tool_rules": {"tracker__create_ticket": "ask"}}})
    runtime = runtime_factory(policy, approver=approver)
    received = tracker(runtime)
    conversation = runtime.conversation("approval")
    args_dir = conversation.folders.results / "args"
    (args_dir / "small.json").write_text(json.dumps({"title": "t", "body": "short"}))
    (args_dir / "big.json").write_text(json.dumps({"title": "t", "body": "z" * 50_000}))
    small = conversation.call("delegate_call", {"tool": "tracker__create_ticket", "args_file": "args/small.json"})
    big = conversation.call("delegate_call", {"tool": "tracker__create_ticket", "args_file": "args/big.json"})
    assert not small.is_error
    assert big.is_error
    assert "Denied: the body is too long for a ticket" in big.text
    assert len(received) == 1
    assert seen[0].tool == "tracker__create_ticket"
    assert '"body": "short"' in seen[0].arguments_json
    assert not seen[1].complete
    assert seen[1].source == "/mnt/results/args/big.json"
    assert next(r for r in conversation.calls() if r.target == "tracker__create_ticket" and r.status == "denied")


def test_ask_without_an_approver_follows_the_policy(runtime_factory: RuntimeFactory) -> None:
    policy = policy_from_mapping({"approval": {"default_rule": "ask"}})
    conversation = runtime_factory(policy).conversation("no-approver")
    out = conversation.call("run_python", {"code": "print(1)"})
    assert out.is_error
    assert "need approval, and no approver is available" in out.text


def test_an_expired_args_file_says_so(runtime: Runtime) -> None:
    tracker(runtime)
    conversation = runtime.conversation("expired-args")
    (conversation.folders.results / "args" / "old.json").write_text('{"title": "t", "body": "b"}')
    runtime.expire_files(now=time.time() + 8 * 86400)
    out = conversation.call("delegate_call", {"tool": "tracker__create_ticket", "args_file": "args/old.json"})
    assert out.is_error
    assert "has expired" in out.text


def test_merge_patch_and_pointer_follow_their_rfcs() -> None:
    assert merge_patch({"a": "b", "c": {"d": "e", "f": "g"}}, {"a": "z", "c": {"f": None}}) == {
        "a": "z",
        "c": {"d": "e"},
    }
    assert merge_patch({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}
    document = {"a/b": {"~x": [10, 20]}, "": 1}
    assert resolve_pointer(document, "/a~1b/~0x/1") == 20
    assert resolve_pointer(document, "/") == 1
    with pytest.raises(InvalidToolArguments, match="not an index"):
        resolve_pointer(document, "/a~1b/~0x/01")


def test_a_host_tool_with_a_bad_name_or_schema_is_refused_when_registered(runtime: Runtime) -> None:
    with pytest.raises(ValueError, match="tool names match"):
        runtime.register_tool("crm.search", lambda a: a, description="Search.", input_schema={"type": "object"})
    with pytest.raises(ValueError, match="not a valid JSON schema"):
        runtime.register_tool("crm__search", lambda a: a, description="Search.", input_schema={"type": 5})
    assert "crm__search" not in runtime.tools


# ------------------------------------------------------------------------------------------ nesting
NESTING_MAX = 64  # the default policy's tools.json_nesting_max


def nested(depth: int) -> object:
    """A value whose arrays nest ``depth`` levels."""
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def sink(runtime: Runtime) -> list[dict[str, Any]]:
    """Register a host tool that takes any object and keeps what it was sent."""
    received: list[dict[str, Any]] = []
    runtime.register_tool("sink", received.append, description="Keep it.", input_schema={"type": "object"})
    return received


@pytest.mark.parametrize("depth", [65, 1_000, 100_000])
def test_overrides_nested_past_the_cap_are_refused_naming_depth_and_cap(runtime: Runtime, depth: int) -> None:
    received = sink(runtime)
    conversation = runtime.conversation("deep-overrides")
    (conversation.folders.results / "args" / "a.json").write_text("{}")
    out = conversation.call(
        "delegate_call", {"tool": "sink", "args_file": "args/a.json", "overrides": {"v": nested(depth)}}
    )
    assert out.is_error  # a RecursionError escaped before, for 1,000 levels
    assert (
        f"InvalidToolArguments: delegate_call: the arguments nest arrays and objects {depth + 2:,} levels deep"
        in out.text
    )
    assert f"tools.json_nesting_max = {NESTING_MAX}" in out.text
    assert "`overrides`" in out.text
    assert received == []


@pytest.mark.parametrize("depth", range(NESTING_MAX - 3, NESTING_MAX + 4))
def test_an_args_file_nests_up_to_the_cap_and_one_level_more_is_refused(runtime: Runtime, depth: int) -> None:
    received = sink(runtime)
    conversation = runtime.conversation("deep-file")
    arguments = {"v": nested(depth - 1)}  # the arguments object is level 1
    (conversation.folders.results / "args" / "a.json").write_text(json.dumps(arguments))
    out = conversation.call("delegate_call", {"tool": "sink", "args_file": "args/a.json", "overrides": {"w": {"x": 1}}})
    if depth <= NESTING_MAX:
        assert not out.is_error, out.text
        assert received == [{**arguments, "w": {"x": 1}}]
    else:
        assert out.is_error
        assert f"/mnt/results/args/a.json nest arrays and objects {depth} levels deep" in out.text
        assert f"tools.json_nesting_max = {NESTING_MAX}" in out.text
        assert received == []


def test_an_args_file_nested_past_the_parser_is_refused_with_its_depth(runtime: Runtime) -> None:
    received = sink(runtime)
    conversation = runtime.conversation("parser-deep")
    (conversation.folders.results / "args" / "a.json").write_text('{"v": ' + "[" * 100_000 + "]" * 100_000 + "}")
    out = conversation.call("delegate_call", {"tool": "sink", "args_file": "args/a.json"})
    assert out.is_error
    assert "nest arrays and objects 100,001 levels deep" in out.text
    assert f"tools.json_nesting_max = {NESTING_MAX}" in out.text
    assert received == []


def test_a_pointer_to_flat_arguments_in_a_deeper_file_is_sent(runtime: Runtime) -> None:
    received = sink(runtime)
    conversation = runtime.conversation("pointer-flat")
    document = {"trace": nested(200), "arguments": {"title": "t"}}
    (conversation.folders.results / "args" / "a.json").write_text(json.dumps(document))
    out = conversation.call("delegate_call", {"tool": "sink", "args_file": "args/a.json#/arguments"})
    assert not out.is_error, out.text
    assert received == [{"title": "t"}]


# ------------------------------------------------------------------------------------------ approval: both rules
def test_a_rule_denying_delegate_call_stops_a_delegated_write_file(runtime_factory: RuntimeFactory) -> None:
    policy = policy_from_mapping({"approval": {"tool_rules": {"delegate_call": "deny"}}})
    conversation = runtime_factory(policy).conversation("deny-delegate")
    results = conversation.folders.results
    (results / "args" / "write.json").write_text(json.dumps({"path": "planted.txt", "content": "by delegation"}))
    out = conversation.call("delegate_call", {"tool": "write_file", "args_file": "args/write.json"})
    assert out.is_error  # the delegated write_file ran before
    assert "Denied: the policy denies calls of delegate_call" in out.text
    assert not (results / "planted.txt").exists()
    record = next(r for r in conversation.calls() if r.tool == "delegate_call")
    assert (record.target, record.status) == ("write_file", "denied")
    direct = conversation.call("write_file", {"path": "direct.txt", "content": "directly"})
    assert not direct.is_error, direct.text  # write_file itself stays allowed
    assert (results / "direct.txt").read_text() == "directly"


def test_ask_on_delegate_call_asks_once_showing_the_target_and_its_real_arguments(
    runtime_factory: RuntimeFactory,
) -> None:
    seen: list[ApprovalRequest] = []

    def approver(request: ApprovalRequest) -> bool | str:
        seen.append(request)
        return True

    policy = policy_from_mapping(
        {"approval": {"tool_rules": {"delegate_call": "ask", "tracker__create_ticket": "ask"}}}
    )
    runtime = runtime_factory(policy, approver=approver)
    received = tracker(runtime)
    conversation = runtime.conversation("ask-delegate")
    (conversation.folders.results / "args" / "t.json").write_text(json.dumps({"title": "t", "body": "b"}))
    out = conversation.call("delegate_call", {"tool": "tracker__create_ticket", "args_file": "args/t.json"})
    assert not out.is_error, out.text
    assert len(received) == 1
    assert [(r.tool, r.via, r.source) for r in seen] == [
        ("tracker__create_ticket", "delegate_call", "/mnt/results/args/t.json")
    ]
    assert '"body": "b"' in seen[0].arguments_json


RULES: list[Rule | None] = ["allow", "ask", "deny", None]  # None: not named in tool_rules


@pytest.mark.parametrize("default", ["allow", "ask", "deny"])
@pytest.mark.parametrize("delegate_rule", RULES)
@pytest.mark.parametrize("target_rule", RULES)
def test_the_stricter_of_delegate_calls_rule_and_the_targets_rule_wins(
    default: Rule, delegate_rule: Rule | None, target_rule: Rule | None
) -> None:
    named = {"delegate_call": delegate_rule, "write_file": target_rule}
    policy = policy_from_mapping(
        {"approval": {"default_rule": default, "tool_rules": {k: v for k, v in named.items() if v is not None}}}
    ).approval
    rules = {delegate_rule or default, target_rule or default}
    expected = "deny" if "deny" in rules else "ask" if "ask" in rules else "allow"
    request = make_request(
        policy, "c", "call", "write_file", {"path": "p", "content": "x"}, "/mnt/results/a.json", via="delegate_call"
    )
    asked: list[ApprovalRequest] = []

    def approver(seen: ApprovalRequest) -> bool | str:
        asked.append(seen)
        return "declined by the test"

    refusal = judge(policy, approver, request)
    if expected == "allow":
        assert refusal is None
    elif expected == "deny":
        assert refusal is not None
        assert refusal.startswith("the policy denies calls of ")
    else:
        assert refusal == "declined by the test"
    assert len(asked) == (expected == "ask")
    direct = make_request(policy, "c", "call", "write_file", {"path": "p", "content": "x"}, None)
    alone = judge(policy, lambda seen: True, direct)  # called directly, only write_file's own rule counts
    assert (alone is None) == ((target_rule or default) != "deny")
