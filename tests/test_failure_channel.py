"""One channel for the model's failures: whatever a tool's library raises on what the sandbox wrote or the model
sent is a result with ``is_error``; only infrastructure failures raise, and never at the cost of the decisions of
the other calls of their turn."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime import HostResult, Runtime, ToolCall, errors
from sandbox_runtime.errors import ImageError, InvalidToolArguments
from sandbox_runtime.pipeline.call import is_infrastructure
from sandbox_runtime.policy import policy_from_mapping
from sandbox_runtime.spill.fast_json import fast_json_file
from sandbox_runtime.tables.jsonio import loads, nesting_depth, text_nesting_depth
from sandbox_runtime.tools.base import check_nesting
from tests.conftest import RuntimeFactory

ANY_OBJECT: dict[str, Any] = {"type": "object"}
NESTING_MAX = 8  # a small cap, so that every depth around it is cheap to try
PARSER_DEPTHS = [*range(990, 1031), 5_000, 100_000]  # around Python's recursion limit, and far past it
MISSING_IMAGE = "sandbox-runtime-test-missing:never-built"


def nested_list(depth: int, leaf: object = 1) -> object:
    """A value whose arrays nest ``depth`` levels (0: the leaf itself)."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nested_object(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


class Notes:
    """A host tool with a side effect: every run appends what it was sent (a retry must not run it again)."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []

    def __call__(self, arguments: dict[str, Any]) -> str:
        self.runs.append(arguments)
        return f"noted {len(self.runs)}"


def _with_notes(factory: RuntimeFactory) -> tuple[Runtime, Notes]:
    runtime = factory(policy_from_mapping({"tools": {"json_nesting_max": NESTING_MAX}}))
    notes = Notes()
    runtime.register_tool("note", notes, description="Note something down.", input_schema=ANY_OBJECT)
    return runtime, notes


@pytest.fixture
def runtime(fake_runtime_factory: RuntimeFactory) -> tuple[Runtime, Notes]:
    """For the tests that start no sandbox: the fake backend (no engine needed)."""
    return _with_notes(fake_runtime_factory)


@pytest.fixture
def docker_runtime(runtime_factory: RuntimeFactory) -> tuple[Runtime, Notes]:
    """For the tests whose turns run code in a real sandbox."""
    return _with_notes(runtime_factory)


@pytest.fixture
def captured(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.ERROR, logger="sandbox_runtime"):
        yield caplog


# ------------------------------------------------------------------------------------------ a fault inside a tool
EDGE_RECORDS = [  # datetimes at the edge of the range with a UTC offset: one step from overflowing
    {"id": 1, "when": "9999-12-31T23:59:59-05:00"},
    {"id": 2, "when": "0001-01-01T00:00:00+05:00"},
]
TABLE_HEADER = {"format": "sandbox-runtime.table", "version": 1, "columns": ["a"], "column_types": ["string"]}
DEEP_ROW = "[" + "[" * 5_000 + "]" * 5_000 + "]"  # one cell nested 5,000 levels: past what msgspec parses
BROKEN_REF_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}


def write_files(results: Path) -> None:
    (results / "edge.json").write_text(json.dumps(EDGE_RECORDS))
    (results / "deep.table.jsonl").write_text(f'{json.dumps(TABLE_HEADER)}\n["fine"]\n{DEEP_ROW}\n')


def test_library_failures_in_a_turn_are_error_results_and_its_run_python_is_not_run_again(
    docker_runtime: tuple[Runtime, Notes], captured: pytest.LogCaptureFixture
) -> None:
    rt, _notes = docker_runtime
    rt.register_tool("lookup", lambda arguments: "found", description="Look up.", input_schema=BROKEN_REF_SCHEMA)
    conversation = rt.conversation("library-failures")
    write_files(conversation.folders.results)
    turn: list[ToolCall | HostResult] = [
        ToolCall(
            tool="run_python", arguments={"code": "open('/mnt/results/ran.log', 'a').write('ran\\n')"}, call_id="r"
        ),
        ToolCall(tool="export_table", arguments={"source": "deep.table.jsonl", "format": "csv"}, call_id="deep"),
        ToolCall(tool="export_table", arguments={"source": "edge.json", "format": "xlsx"}, call_id="edge"),
        ToolCall(
            tool="export_table",
            arguments={"source": "edge.json", "format": "csv", "sort": {"column": "when"}},
            call_id="sort",
        ),
        ToolCall(tool="lookup", arguments={"a": 1}, call_id="ref"),  # the validator cannot resolve the $ref
    ]
    first = conversation.run_turn(turn)  # RecursionError, OverflowError or the $ref error raised before: nothing kept
    outcomes = {o.call_id: o for o in first.outcomes}
    assert not outcomes["r"].is_error, outcomes["r"].text
    assert outcomes["deep"].is_error
    assert outcomes["ref"].is_error
    assert "Internal error in lookup" in outcomes["ref"].text
    assert "PointerToNowhere" in outcomes["ref"].text
    assert any("lookup" in r.getMessage() and r.exc_info for r in captured.records)  # logged with its traceback
    assert {d.call_id for d in conversation.decisions()} == {"r", "deep", "edge", "sort", "ref"}

    again = conversation.run_turn(turn)  # the same call ids: every decision replayed, nothing runs again
    assert all(o.replayed for o in again.outcomes)
    assert [o.text for o in again.outcomes] == [o.text for o in first.outcomes]
    assert (conversation.folders.results / "ran.log").read_text() == "ran\n"
    statuses = {r.call_id: r.status for r in conversation.calls()}
    assert (statuses["r"], statuses["deep"], statuses["ref"]) == ("ok", "error", "error")


def test_a_table_file_nested_deeper_than_the_parser_goes_is_an_error_result(runtime: tuple[Runtime, Notes]) -> None:
    rt, _notes = runtime
    conversation = rt.conversation("deep-table")
    write_files(conversation.folders.results)
    for tool, arguments in (
        ("export_table", {"source": "deep.table.jsonl", "format": "xlsx"}),
        ("render_table", {"source": "deep.table.jsonl"}),
    ):
        out = conversation.call(tool, arguments)  # RecursionError escaped msgspec before
        assert out.is_error, (tool, out.text)


def test_a_host_result_no_writer_takes_is_an_internal_error_naming_the_tool(
    runtime: tuple[Runtime, Notes], captured: pytest.LogCaptureFixture
) -> None:
    rt, notes = runtime
    looped: dict[str, Any] = {"name": "node"}
    looped["self"] = looped  # a graph, not a tree: no JSON form
    rt.register_tool("graph", lambda arguments: looped, description="A graph.", input_schema=ANY_OBJECT)
    conversation = rt.conversation("looped")
    report = conversation.run_turn([ToolCall(tool="graph", call_id="g"), ToolCall(tool="note", call_id="n")])
    graph, noted = report.outcomes
    assert graph.is_error
    assert "Internal error in graph" in graph.text
    assert "ValueError" in graph.text
    assert not noted.is_error
    assert any("graph" in r.getMessage() and r.exc_info for r in captured.records)  # logged with its traceback
    assert (
        conversation.run_turn([ToolCall(tool="graph", call_id="g"), ToolCall(tool="note", call_id="n")])
        .outcomes[1]
        .replayed
    )
    assert len(notes.runs) == 1


def test_a_host_result_nested_far_past_any_parser_is_spilled_as_text(runtime: tuple[Runtime, Notes]) -> None:
    rt, _notes = runtime
    deep_text = "[" * 100_000 + '"' + "x" * 30_000 + '"' + "]" * 100_000
    rt.register_tool("deep_text", lambda arguments: deep_text, description="Deep.", input_schema=ANY_OBJECT)
    rt.register_tool(
        "deep_value", lambda arguments: nested_list(5_000, "x" * 30_000), description="Deep.", input_schema=ANY_OBJECT
    )
    conversation = rt.conversation("deep-results")
    text, value = conversation.run_turn([ToolCall(tool="deep_text"), ToolCall(tool="deep_value")]).outcomes
    assert not text.is_error
    assert text.descriptor is not None
    assert text.descriptor.format == "text"
    assert (conversation.folders.results / text.descriptor.path.removeprefix("/mnt/results/")).read_text() == deep_text
    assert not value.is_error, value.text  # said to be too deep to show, not a crash


# ------------------------------------------------------------------------------------------ nesting of arguments
@pytest.mark.parametrize("depth", range(1, 2 * NESTING_MAX + 1))
def test_arguments_nest_up_to_the_cap_and_one_level_more_is_refused_naming_depth_and_cap(
    runtime: tuple[Runtime, Notes], depth: int
) -> None:
    rt, notes = runtime
    arguments = {"value": nested_object(depth - 1)}  # the arguments object is level 1
    assert nesting_depth(arguments) == depth
    out = rt.conversation("nesting").call("note", arguments)
    if depth <= NESTING_MAX:
        assert not out.is_error, out.text
        assert notes.runs == [arguments]
    else:
        assert out.is_error
        assert f"InvalidToolArguments: note: the arguments nest arrays and objects {depth} levels deep" in out.text
        assert f"tools.json_nesting_max = {NESTING_MAX}" in out.text
        assert "`value`" in out.text
        assert notes.runs == []


@pytest.mark.parametrize("depth", [999, 1_000, 1_001, 5_000, 100_000])
def test_arguments_nested_past_pythons_recursion_limit_are_refused_and_recorded_without_a_crash(
    runtime: tuple[Runtime, Notes], depth: int
) -> None:
    rt, notes = runtime
    conversation = rt.conversation("very-deep")
    for tool in ("note", "run_python", "delegate_call"):
        out = conversation.call(tool, {"code": "print(1)", "value": nested_list(depth)}, call_id=f"{tool}-{depth}")
        assert out.is_error
        assert f"{depth + 1:,} levels deep" in out.text
        assert f"tools.json_nesting_max = {NESTING_MAX}" in out.text
    assert notes.runs == []
    records = {r.call_id: r for r in conversation.calls()}
    assert {r.status for r in records.values()} == {"error"}
    assert all(r.arguments for r in records.values())  # the record says why they are not kept, or keeps them


def test_a_call_whose_arguments_refer_to_themselves_is_refused(runtime: tuple[Runtime, Notes]) -> None:
    rt, notes = runtime
    arguments: dict[str, Any] = {"a": 1}
    arguments["me"] = arguments
    out = rt.conversation("cycle").call("note", arguments)
    assert out.is_error
    assert "the arguments are not JSON" in out.text
    assert notes.runs == []


# ------------------------------------------------------------------------------------------ infrastructure
def test_an_infrastructure_failure_raises_after_the_other_calls_of_its_turn_are_decided(
    runtime_factory: RuntimeFactory,
) -> None:
    rt = runtime_factory(image=MISSING_IMAGE)  # run_python cannot start a sandbox: an infrastructure failure
    notes = Notes()
    rt.register_tool("note", notes, description="Note something down.", input_schema=ANY_OBJECT)
    conversation = rt.conversation("infra")
    turn: list[ToolCall | HostResult] = [
        ToolCall(tool="note", arguments={"n": 1}, call_id="n1"),
        ToolCall(tool="run_python", arguments={"code": "print(1)"}, call_id="py"),
        ToolCall(tool="note", arguments={"n": 2}, call_id="n2"),
        HostResult(tool="search", result="found it", call_id="h"),
    ]
    with pytest.raises(ImageError) as raised:
        conversation.run_turn(turn)
    assert any("run the turn again with the same call ids" in note for note in raised.value.__notes__)
    assert {d.call_id for d in conversation.decisions()} == {"n1", "n2", "h"}
    assert {r.call_id: r.status for r in conversation.calls()} == {"n1": "ok", "n2": "ok", "h": "ok"}
    ended = {entry.call_id: json.loads(entry.detail) for entry in rt.state.audit.entries() if entry.kind == "call"}
    assert set(ended) == {"h", "n1", "n2", "py"}  # the failed call is in the trail too, with why it ended
    assert (ended["py"]["status"], ended["py"]["error_type"]) == ("infrastructure", "ImageError")
    assert "not built" in ended["py"]["reason"]

    with pytest.raises(ImageError):  # the retry runs only the failed call
        conversation.run_turn(turn)
    assert sorted(run["n"] for run in notes.runs) == [1, 2]  # once each (the first turn ran them in parallel)


def test_what_raises_and_what_the_model_reads() -> None:
    for model_reads in (
        errors.InvalidToolArguments("x"),
        errors.BadTableFile("x"),
        errors.OutputsFull("x"),
        errors.PathExpired("x"),
        errors.UpstreamError("x"),
        RecursionError("x"),
        OverflowError("x"),
        ValueError("x"),
        MemoryError(),
    ):
        assert not is_infrastructure(model_reads), model_reads
    for infrastructure in (
        errors.EngineUnavailable("x"),
        errors.SandboxGone("x"),
        errors.ImageError("x"),
        errors.QuotaError("x"),
        errors.SelfCheckFailed("x"),
        errors.ConversationDeleted("x"),
        ConnectionResetError("x"),
        KeyboardInterrupt(),
    ):
        assert is_infrastructure(infrastructure), infrastructure


# ------------------------------------------------------------------------------------------ the JSON layer
@pytest.mark.parametrize("depth", PARSER_DEPTHS)
def test_json_nested_past_the_parser_is_a_value_error_and_the_fast_spill_declines_it(depth: int) -> None:
    for text in (
        "[" * depth + "]" * depth,
        '{"a":' * depth + "1" + "}" * depth,
        '[{"a":' + "[" * depth + "]" * depth + "}]",  # a record whose cell nests
    ):
        try:
            parsed = loads(text)
        except ValueError as exc:  # never a RecursionError
            failure = str(exc)
            assert failure.startswith("JSON nested deeper than the parser can go")
            assert f"({text_nesting_depth(text):,} levels" in failure
        else:
            assert nesting_depth(parsed) == text_nesting_depth(text)
        found = fast_json_file(text)
        assert found is None or found.kind in ("json", "table")


@pytest.mark.parametrize("seed", range(20))
def test_the_depth_of_json_text_is_the_depth_of_its_value(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311  (reproducible data, not secrets)

    def value(budget: int) -> object:
        kind = rng.choice(["scalar", "string", "list", "object"] if budget else ["scalar", "string"])
        if kind == "scalar":
            return rng.choice([None, True, 1, -2.5])
        if kind == "string":
            return rng.choice(["[", "]", "{", '"}"', "\\", 'x[{"', ""])
        items = [value(budget - 1) for _ in range(rng.randint(0, 3))]
        return items if kind == "list" else {f"k{i}[": item for i, item in enumerate(items)}

    for _ in range(50):
        made = value(rng.randint(0, 12))
        assert text_nesting_depth(json.dumps(made)) == nesting_depth(made) == nesting_depth(loads(json.dumps(made)))


def test_a_container_shared_by_many_parents_is_measured_once() -> None:
    shared: list[object] = [1]
    for _ in range(200):  # 2**200 paths, 200 containers
        shared = [shared, shared]
    assert nesting_depth(shared) == 201
    looped: list[object] = []
    looped.append(looped)
    with pytest.raises(InvalidToolArguments, match="not JSON"):
        check_nesting({"x": looped}, 64, "t")
