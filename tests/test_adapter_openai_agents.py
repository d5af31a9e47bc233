"""The OpenAI Agents SDK's sandbox client contract over a conversation (``SandboxRuntimeSandboxClient``), tried the
way the SDK's own tests try its clients (it ships no conformance suite for third parties): a ``SandboxAgent`` driven
offline by the SDK's ``ScriptedModel`` through a shell command and a file edit (``apply_patch``); what the sandbox
cannot be refused at ``create`` with a message naming it; a run resumed from its serialised state keeps its
files; a workspace tar round-trips, and a hostile one is refused before anything is extracted.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from agents import RunConfig, Runner
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.entries import Dir, File, GitRepo
from agents.sandbox.errors import ConfigurationError, WorkspaceArchiveWriteError
from agents.sandbox.snapshot import NoopSnapshotSpec
from agents.testing import ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseCustomToolCall

from sandbox_runtime.adapters.openai_agents import (
    SandboxRuntimeClientOptions,
    SandboxRuntimeSandboxClient,
    SandboxRuntimeSession,
)
from sandbox_runtime.api.runtime import Runtime
from tests.conftest import SESSION, TEST_LABEL

ENGINES = [
    pytest.param("default", marks=pytest.mark.docker, id="docker"),
    pytest.param("podman", marks=[pytest.mark.docker, pytest.mark.podman], id="podman"),
]
PATCH = "*** Begin Patch\n*** Update File: notes.txt\n@@\n-total = 41\n+total = 42\n*** End Patch\n"


@pytest.fixture(params=ENGINES)
def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runtime]:
    request.getfixturevalue("executor_image" if request.param == "default" else "podman_image")
    with Runtime(
        tmp_path / "state",
        request.param,
        extra_labels={TEST_LABEL: SESSION},
        reap_interval_s=None,
        retention_interval_s=None,
    ) as runtime:
        try:
            yield runtime
        finally:
            for record in runtime.state.conversations():
                runtime.conversation(record.id).delete()


def test_a_sandbox_agent_runs_a_shell_command_and_edits_a_file_in_the_conversation(runtime: Runtime) -> None:
    model = ScriptedModel(
        [
            [
                function_call(
                    "exec_command", {"cmd": "cat notes.txt; whoami; python3 -c 'import openpyxl'"}, call_id="c1"
                )
            ],
            [ResponseCustomToolCall(type="custom_tool_call", id="c2", call_id="c2", name="apply_patch", input=PATCH)],
            [assistant_message("done")],
        ]
    )
    agent = SandboxAgent(
        name="clerk",
        model=model,
        instructions="Fix the total.",
        default_manifest=Manifest(entries={"notes.txt": File(content=b"total = 41\n"), "data": Dir()}),
    )
    client = SandboxRuntimeSandboxClient(runtime)
    options = SandboxRuntimeClientOptions(conversation_id="agents-clerk")
    config = RunConfig(
        tracing_disabled=True,
        sandbox=SandboxRunConfig(client=client, options=options, snapshot=NoopSnapshotSpec()),
    )
    result = anyio.run(lambda: Runner.run(agent, "go", run_config=config))
    assert result.final_output == "done"
    model.assert_complete()
    shell_output = model.calls[1].input[-1]["output"]
    assert "Process exited with code 0" in shell_output
    assert "total = 41\nsandbox\n" in shell_output
    assert model.calls[2].input[-1]["output"] == "Updated notes.txt"
    conversation = runtime.conversation("agents-clerk")  # the same conversation, from Python: its files kept
    assert conversation.read_bytes("notes.txt") == b"total = 42\n"
    assert conversation.stat("data").is_dir


@pytest.mark.parametrize(
    ("manifest", "named"),
    [
        (Manifest(users=[{"name": "bob"}]), "other users"),
        (Manifest(entries={"repo": GitRepo(repo="openai/openai-agents-python", ref="main")}), "git repository"),
        (Manifest(root="/srv/work"), "workspace root /srv/work"),
    ],
    ids=["users", "git", "root"],
)
def test_what_the_sandbox_cannot_be_is_refused_at_create_with_its_name(
    runtime: Runtime, manifest: Manifest, named: str
) -> None:
    client = SandboxRuntimeSandboxClient(runtime)
    with pytest.raises(ConfigurationError, match=named):
        anyio.run(lambda: client.create(manifest=manifest, options=SandboxRuntimeClientOptions()))
    assert runtime.state.conversations() == []  # nothing was made


def test_a_resumed_session_keeps_the_conversations_files_and_refuses_other_users(runtime: Runtime) -> None:
    client = SandboxRuntimeSandboxClient(runtime)

    async def first() -> dict[str, object]:
        session = await client.create(
            manifest=Manifest(entries={"n.txt": File(content=b"original\n")}),
            options=SandboxRuntimeClientOptions(conversation_id="agents-resume"),
            snapshot=NoopSnapshotSpec(),
        )
        async with session:
            assert (await session.exec("echo changed > n.txt")).ok()
            with pytest.raises(ConfigurationError, match="one user"):
                await session.exec("id", user="root")
        await client.delete(session)
        return client.serialize_session_state(session.state)

    async def second(payload: dict[str, object]) -> bytes:
        session = await client.resume(client.deserialize_session_state(payload))
        async with session:
            return (await session.exec("cat n.txt")).stdout

    payload = anyio.run(first)
    assert payload["conversation_id"] == "agents-resume"
    assert anyio.run(lambda: second(payload)) == b"changed\n"


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        for info, body in members:
            info.size = len(body) if body is not None else 0
            archive.addfile(info, io.BytesIO(body) if body is not None else None)
    data.seek(0)
    return data


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


def test_a_workspace_tar_round_trips_and_a_hostile_one_is_refused_before_extraction(runtime: Runtime) -> None:
    client = SandboxRuntimeSandboxClient(runtime)

    async def check() -> None:
        session = await client.create(options=SandboxRuntimeClientOptions(conversation_id="agents-tar"))
        inner = session._inner
        assert isinstance(inner, SandboxRuntimeSession)
        async with session:
            assert (await session.exec("mkdir -p d && echo kept > d/f.txt && ln -s d/f.txt link")).ok()
            archive = await inner.persist_workspace()
            with tarfile.open(fileobj=archive, mode="r") as tar:
                names = sorted(member.name for member in tar.getmembers())
            assert {".", "./d", "./d/f.txt", "./link"} <= set(names)  # beside the runtime's own folders (spill/, ...)
            assert "./lost+found" not in names
            archive.seek(0)
            assert (await session.exec("rm -rf d link")).ok()
            await inner.hydrate_workspace(archive)
            archive.close()
            assert (await session.exec("cat link")).stdout == b"kept\n"
            for hostile in (
                _tar((_member("../escaped.txt"), b"x")),
                _tar((_member("/etc/escaped.txt"), b"x")),
                _tar((_member("./out", tarfile.SYMTYPE, "/etc/passwd"), None)),
                _tar((_member("./hard", tarfile.LNKTYPE, "d/f.txt"), None)),
            ):
                with pytest.raises(WorkspaceArchiveWriteError):
                    await inner.hydrate_workspace(hostile)
            assert not (await session.exec("ls out hard ../escaped.txt")).ok()

    anyio.run(check)
