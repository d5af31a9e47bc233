"""One backend choice for every face: the policy's ``sandbox.backend`` is what the Python API, ``serve``,
``doctor``, ``gc``, ``ls`` and ``image build`` run on. Here the fake, with no engine in reach (every test of this
file runs with ``DOCKER_HOST`` pointing at nothing): each face works, and none of them hides that the fake
confines nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.sandbox.fake import FakeBackend
from tests.cli_helpers import run_cli
from tests.mcp_helpers import run_bounded, stdio_params, structured, text_of


def test_the_python_api_builds_the_backend_the_policy_names(tmp_path: Path, fake_policy_file: Path) -> None:
    with Runtime(tmp_path / "state", fake_policy_file, reap_interval_s=None, retention_interval_s=None) as runtime:
        assert isinstance(runtime.backend, FakeBackend)
        done = runtime.conversation("chosen").run_python("print(6 * 7)")
        assert (done.status, done.stdout) == ("ok", "42\n")
        runtime.conversation("chosen").delete()


def test_doctor_names_the_backend_and_says_loudly_what_it_leaves_out(tmp_path: Path, fake_policy_file: Path) -> None:
    done = run_cli("--state-dir", str(tmp_path / "state"), "--policy", str(fake_policy_file), "doctor")
    assert done.returncode == 1  # a backend that confines nothing never passes doctor
    assert "engine   fake" in done.stdout
    assert done.stdout.count("NOT ENFORCED") == len(FakeBackend.not_enforced)
    assert "confines nothing" in done.stderr
    as_json = run_cli("--state-dir", str(tmp_path / "state"), "--policy", str(fake_policy_file), "doctor", "--json")
    report = json.loads(as_json.stdout)
    assert (as_json.returncode, report["ok"], report["backend"]) == (1, False, "fake")
    assert report["not_enforced"] == list(FakeBackend.not_enforced)


def test_gc_ls_and_image_build_run_on_the_chosen_backend(tmp_path: Path, fake_policy_file: Path) -> None:
    common = ("--state-dir", str(tmp_path / "state"), "--policy", str(fake_policy_file))
    with Runtime(tmp_path / "state", fake_policy_file, reap_interval_s=None, retention_interval_s=None) as runtime:
        runtime.conversation("listed").call("write_file", {"path": "a.txt", "content": "a"}, call_id="w")
    listed = run_cli(*common, "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [c["conversation"] for c in json.loads(listed.stdout)] == ["listed"]
    collected = run_cli(*common, "gc")
    assert collected.returncode == 0, collected.stderr
    built = run_cli(*common, "image", "build")
    assert (built.returncode, built.stdout.strip()) == (0, "the fake backend runs no executor image: nothing to build")


@pytest.mark.process
def test_serve_runs_on_the_chosen_backend_for_a_real_mcp_client(tmp_path: Path, fake_policy_file: Path) -> None:
    state = tmp_path / "state"
    params = stdio_params(state, "--conversation", "served", policy=fake_policy_file)

    async def scenario() -> dict[str, Any]:
        async with Client(params, read_timeout_seconds=60) as client:
            wrote = await client.call_tool("write_file", {"path": "scripts/hello.py", "content": "print('hi ' * 600)"})
            ran = await client.call_tool("run_python", {"script_path": "scripts/hello.py"})
            return {"wrote": wrote, "ran": ran}

    seen = run_bounded(scenario, limit_s=120)
    ran = seen["ran"]
    assert isinstance(ran, types.CallToolResult)
    assert not ran.is_error, text_of(ran)
    spilled = structured(ran)["file"]  # 1,800 characters: saved before the model sees them, on the fake too
    assert spilled["path"].startswith("/mnt/results/spill/")
    with Runtime(state, fake_policy_file, reap_interval_s=None, retention_interval_s=None) as runtime:
        assert [c.status for c in runtime.conversation("served").calls()] == ["ok", "ok"]
        runtime.conversation("served").delete()
