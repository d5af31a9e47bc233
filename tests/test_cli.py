"""The command line as an operator uses it: doctor, image build, ls, gc, and exit codes that mean something."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_runtime.errors import EngineUnavailable
from sandbox_runtime.sandbox.docker_backend import DockerBackend

pytestmark = pytest.mark.docker


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox_runtime.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_doctor_shows_every_protection_in_force(tmp_path: Path, executor_image: str) -> None:
    done = cli("--state-dir", str(tmp_path), "doctor")
    assert done.returncode == 0, done.stderr
    for check in (
        "capabilities",
        "no-new-privileges",
        "seccomp",
        "non-root uid",
        "memory limit",
        "pids limit",
        "read-only root",
        "network",
        "host loopback",
    ):
        assert check in done.stdout
    assert "disk quota mode" in done.stdout
    assert "FAIL" not in done.stdout


def test_doctor_json_is_machine_readable(tmp_path: Path, executor_image: str) -> None:
    done = cli("--state-dir", str(tmp_path), "doctor", "--json")
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert {c["name"] for c in report["checks"]} >= {"capabilities", "seccomp", "network"}
    assert report["engine"]["engine_version"]


def test_image_build_does_nothing_when_nothing_changed(executor_image: str) -> None:
    done = cli("image", "build")
    assert done.returncode == 0, done.stderr
    assert f"{executor_image} already present" in done.stdout


def test_an_unreachable_engine_exits_3_with_a_clear_message(tmp_path: Path) -> None:
    done = cli("--state-dir", str(tmp_path), "doctor", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert done.returncode == 3
    assert "Docker engine" in done.stderr


def test_an_unreachable_engine_is_a_clear_error_that_leaves_no_socket_open(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable, match=r"no\.sock: No such file or directory\); is dockerd running\?"):
        DockerBackend({"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    gc.collect()  # a leaked socket would warn here, and warnings are errors in this suite


def test_a_bad_policy_file_exits_2_naming_the_field(tmp_path: Path) -> None:
    policy = tmp_path / "bad.toml"
    policy.write_text("[sandbox.limits]\nmemory = 1\n")
    done = cli("--state-dir", str(tmp_path), "--policy", str(policy), "ls")
    assert done.returncode == 2
    assert "sandbox.limits.memory" in done.stderr


def test_ls_lists_conversations_with_their_disk_use(tmp_path: Path, docker_backend: DockerBackend) -> None:
    from sandbox_runtime.runtime import Runtime  # noqa: PLC0415
    from tests.conftest import SESSION, TEST_LABEL  # noqa: PLC0415

    with Runtime(tmp_path, reap_interval_s=None, extra_labels={TEST_LABEL: SESSION}) as runtime:
        runtime.conversation("listed").run_python("print(1)")
        try:
            listing = json.loads(cli("--state-dir", str(tmp_path), "ls", "--json").stdout)
            assert [row["conversation"] for row in listing] == ["listed"]
            assert listing[0]["used_bytes"] > 0
            assert listing[0]["runs"] == 1
            assert cli("--state-dir", str(tmp_path), "gc").returncode == 0
        finally:
            runtime.conversation("listed").delete()


def test_ls_shows_a_conversations_execution_record_and_attachments(
    tmp_path: Path, docker_backend: DockerBackend
) -> None:
    from sandbox_runtime.runtime import Runtime  # noqa: PLC0415
    from tests.conftest import SESSION, TEST_LABEL  # noqa: PLC0415

    with Runtime(tmp_path, reap_interval_s=None, retention_interval_s=None, extra_labels={TEST_LABEL: SESSION}) as rt:
        conversation = rt.conversation("recorded")
        try:
            conversation.call("write_file", {"path": "exports/a.txt", "content": "x"}, call_id="w1")
            conversation.call("attach_file", {"path": "exports/a.txt"}, call_id="a1")
            calls = json.loads(cli("--state-dir", str(tmp_path), "ls", "recorded", "--json").stdout)
            assert [(c["call_id"], c["tool"], c["status"]) for c in calls] == [
                ("w1", "write_file", "ok"),
                ("a1", "attach_file", "ok"),
            ]
            table = cli("--state-dir", str(tmp_path), "ls", "recorded").stdout
            assert "write_file" in table
            assert "attach_file" in table
            cards = json.loads(cli("--state-dir", str(tmp_path), "ls", "recorded", "--attachments", "--json").stdout)
            assert [c["filename"] for c in cards] == ["a.txt"]
            assert cli("--state-dir", str(tmp_path), "ls", "nobody").returncode == 2
        finally:
            conversation.delete()
