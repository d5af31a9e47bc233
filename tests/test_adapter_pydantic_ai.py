"""pydantic-ai's own workspace conformance suite (``pydantic_ai.workspaces.conformance.WorkspaceBackendSuite``: 40
rules, as they ship in pydantic-ai-slim 2.68) against :class:`SandboxRuntimeWorkspace` on Docker and on Podman,
every rule this workspace does not pass declared in one place with its reason; and an agent whose scripted model
(``FunctionModel``, offline) runs a shell command and edits a file through ``ctx.workspace``.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.workspaces import Workspace, WorkspaceBackend, WorkspaceRef
from pydantic_ai.workspaces.conformance import _FINISH_ONCE_RELEASED as FINISH_ONCE_RELEASED
from pydantic_ai.workspaces.conformance import WorkspaceBackendSuite

from sandbox_runtime.adapters.pydantic_ai import SandboxRuntimeWorkspace
from sandbox_runtime.api.runtime import Runtime
from tests.conftest import SESSION, TEST_LABEL

ENGINES = [
    pytest.param("default", marks=pytest.mark.docker, id="docker"),
    pytest.param("podman", marks=[pytest.mark.docker, pytest.mark.podman], id="podman"),
]
RULE_COUNT = 40
# the rules this workspace does not pass, each with why (skipped: each would wait out a 30-60 s hang guard)
DECLARED = {
    "test_cancellation_stops_foreground_work": "the calls of one conversation are serialised: the rule polls "
    "exists() while the command runs, and that call waits for the command",
    "test_destroying_environment_during_command_raises_unavailable": "the calls of one conversation are "
    "serialised: the rule polls exists() while the command runs, and that call waits for the command",
    "test_a_backend_attached_by_ref_reaches_a_detached_process": "no process outlives its command: a process the "
    "command detached into its own session is ended with it",
}


# the rules run here in a copy of their own, each with why
ADAPTED = {
    "test_background_child_does_not_hold_up_completed_command": "the same command and assertions, less the rule's "
    "closing wait (up to 30 s) for the background child to finish: here it ends with its command",
}


def _runtime(policy: str, request: pytest.FixtureRequest, state_dir: Path) -> Runtime:
    request.getfixturevalue("executor_image" if policy == "default" else "podman_image")
    return Runtime(
        state_dir, policy, extra_labels={TEST_LABEL: SESSION}, reap_interval_s=None, retention_interval_s=None
    )


class TestSandboxRuntimeWorkspace(WorkspaceBackendSuite):
    """The suite as it ships, its ``backend`` a conversation of a runtime on each engine."""

    @pytest.fixture(scope="class")
    @classmethod
    def anyio_backend(cls) -> str:
        return "asyncio"

    @pytest.fixture(scope="class", params=ENGINES)
    @classmethod
    def runtime(cls, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
        runtime = _runtime(request.param, request, tmp_path_factory.mktemp("pydantic-ai-state"))
        try:
            yield runtime
        finally:
            for record in runtime.state.conversations():
                runtime.conversation(record.id).delete()
            runtime.close()

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, runtime: Runtime) -> WorkspaceBackend:
        return SandboxRuntimeWorkspace(runtime)

    @pytest.fixture
    def fresh_backend(self, runtime: Runtime) -> Callable[[], WorkspaceBackend]:
        return lambda: SandboxRuntimeWorkspace(runtime)

    @pytest.fixture
    def attach_backend(self, runtime: Runtime) -> Callable[[WorkspaceRef], WorkspaceBackend]:
        return lambda ref: SandboxRuntimeWorkspace(runtime, ref=ref)

    @pytest.fixture
    def destroy_environment(self, runtime: Runtime) -> Callable[[WorkspaceBackend], Awaitable[None]]:
        async def destroy(backend: WorkspaceBackend) -> None:
            assert backend.ref is not None
            runtime.conversation(backend.ref.id).delete()

        return destroy

    async def test_background_child_does_not_hold_up_completed_command(  # type: ignore[override]
        self, backend: WorkspaceBackend
    ) -> None:
        """The rule as it ships, less its closing wait (up to 30 s) for the background child to finish once released:
        here the child ends with its command (no process outlives it), so that wait could only run out."""
        workspace = Workspace(backend)
        root = posixpath.join(await workspace.working_dir(), f"background-{uuid.uuid4().hex}")
        await workspace.make_dir(root)
        release, finished = posixpath.join(root, "release"), posixpath.join(root, "finished")
        assert isinstance(backend, SandboxRuntimeWorkspace)
        with anyio.fail_after(60):
            command = ["sh", "-c", f"({FINISH_ONCE_RELEASED}) & printf done", "sh", release, finished]
            result = await backend.run(command)
        assert (result.exit_code, result.stdout) == (0, "done")
        assert not await workspace.exists(finished)
        await workspace.remove(root)

    # the declared rules, each skipped with its reason (they take none of the rule's fixtures)
    async def test_cancellation_stops_foreground_work(self) -> None:  # type: ignore[override]
        pytest.skip(DECLARED["test_cancellation_stops_foreground_work"])

    async def test_destroying_environment_during_command_raises_unavailable(self) -> None:  # type: ignore[override]
        pytest.skip(DECLARED["test_destroying_environment_during_command_raises_unavailable"])

    async def test_a_backend_attached_by_ref_reaches_a_detached_process(self) -> None:  # type: ignore[override]
        pytest.skip(DECLARED["test_a_backend_attached_by_ref_reaches_a_detached_process"])


def test_every_rule_is_collected_and_the_declared_ones_are_real_rules() -> None:
    rules = [name for name in dir(WorkspaceBackendSuite) if name.startswith("test_")]
    assert len(rules) == RULE_COUNT
    assert set(DECLARED) | set(ADAPTED) <= set(rules)


def test_the_documentation_gives_these_counts() -> None:
    page = (Path(__file__).parent.parent / "docs" / "how-to" / "pydantic-ai.md").read_text()
    assert f"{RULE_COUNT - len(DECLARED) - len(ADAPTED)} of the suite's {RULE_COUNT} rules pass as they ship" in page
    for name in [*DECLARED, *ADAPTED]:
        assert f"`{name}`" in page


@pytest.mark.parametrize("policy", ENGINES)
def test_an_agent_runs_a_command_and_edits_a_file_in_its_workspace(
    policy: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    agent: Agent[None, str] = Agent()

    @agent.tool
    async def run_command(ctx: RunContext[None], command: str) -> str:
        result = await ctx.workspace.run(command, shell=True, timeout=60)  # noqa: S604  (the sandbox's own shell)
        return f"exit={result.exit_code}\n{result.stdout}{result.stderr}"

    @agent.tool
    async def edit_file(ctx: RunContext[None], path: str, old: str, new: str) -> str:
        text = await ctx.workspace.read_text(path)
        await ctx.workspace.write_text(path, text.replace(old, new, 1))
        return "edited"

    steps = [
        ToolCallPart("run_command", {"command": "printf 'total = 41\\n' > sum.txt; whoami"}),
        ToolCallPart("edit_file", {"path": "sum.txt", "old": "41", "new": "42"}),
        ToolCallPart("run_command", {"command": "cat sum.txt; python3 -c 'import openpyxl; print(1)'"}),
    ]

    def script(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        done = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
        if len(done) < len(steps):
            return ModelResponse(parts=[steps[len(done)]])
        return ModelResponse(parts=[TextPart(" | ".join(str(part.content) for part in done))])

    with _runtime(policy, request, tmp_path / "state") as runtime:
        workspace = SandboxRuntimeWorkspace(runtime)
        # anyio.run, not run_sync: run_sync leaves its event loop open for the next call
        result = anyio.run(lambda: agent.run("go", model=FunctionModel(script), workspace=workspace))
        assert result.output == "exit=0\nsandbox\n | edited | exit=0\ntotal = 42\n1\n"
        assert workspace.conversation_id is not None
        conversation = runtime.conversation(workspace.conversation_id)  # the same conversation, from Python
        assert conversation.read_bytes("sum.txt") == b"total = 42\n"
        ran = conversation.run_python("print(open('sum.txt').read().split()[-1])")  # and from the model's own tool
        assert ran.stdout == "42\n"
        conversation.delete()
