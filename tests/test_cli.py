"""The command line as an operator uses it: doctor, image build, ls, gc, serve's start-up checks, and exit codes
that mean something. The commands run in the test's process (tests/cli_helpers.py), except the entry points, ``serve
--http`` and a stdio client's server, which run as the operator's own process would."""

from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import EngineUnavailable
from sandbox_runtime.sandbox.docker.backend import DockerBackend
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION
from tests.cli_helpers import CliRun
from tests.cli_helpers import run_cli as cli
from tests.conftest import FAKE_POLICY, SESSION, TEST_LABEL
from tests.mcp_helpers import serve_command


def serve_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command in a process of its own: ``serve --http`` (what it refuses before it listens is HTTP safety)."""
    return subprocess.run(
        [sys.executable, "-m", "sandbox_runtime.cli.main", *args],
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


def test_doctor_on_podman_names_the_service_its_version_runtime_and_the_api_it_speaks(
    tmp_path: Path, podman_image: str
) -> None:
    done = cli("--policy", "podman", "--state-dir", str(tmp_path), "doctor", "--json")
    assert done.returncode == 0, done.stderr
    engine = json.loads(done.stdout)["engine"]
    said = json.loads(subprocess.run(["podman", "info", "--format", "json"], capture_output=True, check=True).stdout)
    runtime = said["host"]["ociRuntime"]
    assert (engine["product"], engine["engine_version"]) == ("Podman", said["version"]["Version"])
    assert engine["runtimes"] == [engine["default_runtime"]] == [runtime["name"]]
    assert engine[f"{runtime['name']}_version"] == runtime["version"].splitlines()[0]
    assert engine["api_version"].startswith("1.")  # the Docker-compatible API the client speaks
    assert any(option.startswith("name=seccomp") for option in engine["security_options"])


def test_image_build_does_nothing_when_nothing_changed(executor_image: str) -> None:
    done = cli("image", "build")
    assert done.returncode == 0, done.stderr
    assert f"{executor_image} already present" in done.stdout


def test_an_unreachable_engine_exits_3_with_a_clear_message(tmp_path: Path) -> None:
    done = cli("--state-dir", str(tmp_path), "doctor", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert done.returncode == 3
    assert "Docker engine" in done.stderr


def test_an_unreachable_engine_is_a_clear_error_that_leaves_no_socket_open(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable, match=r"no\.sock: [^)]+\); is dockerd running\?"):
        DockerBackend({"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    gc.collect()  # a leaked socket would warn here, and warnings are errors in this suite


def test_a_bad_policy_file_exits_2_naming_the_field(tmp_path: Path) -> None:
    policy = tmp_path / "bad.toml"
    policy.write_text("[sandbox.limits]\nmemory = 1\n")
    done = cli("--state-dir", str(tmp_path), "--policy", str(policy), "ls")
    assert done.returncode == 2
    assert "sandbox.limits.memory" in done.stderr


# ls and gc read the state directory: these run on the fake backend (a policy file naming it), with no engine
def test_ls_lists_conversations_with_their_disk_use(tmp_path: Path, fake_policy_file: Path) -> None:
    state = tmp_path / "state"
    common = ("--state-dir", str(state), "--policy", str(fake_policy_file))
    with Runtime(state, fake_policy_file, reap_interval_s=None) as runtime:
        runtime.conversation("listed").run_python("print(1)")
        try:
            listing = json.loads(cli(*common, "ls", "--json").stdout)
            assert [row["conversation"] for row in listing] == ["listed"]
            assert listing[0]["used_bytes"] > 0
            assert listing[0]["runs"] == 1
            assert cli(*common, "gc").returncode == 0
        finally:
            runtime.conversation("listed").delete()


def test_ls_shows_a_conversations_execution_record_and_attachments(tmp_path: Path, fake_policy_file: Path) -> None:
    state = tmp_path / "state"
    common = ("--state-dir", str(state), "--policy", str(fake_policy_file))
    with Runtime(state, fake_policy_file, reap_interval_s=None, retention_interval_s=None) as rt:
        conversation = rt.conversation("recorded")
        try:
            conversation.call("write_file", {"path": "exports/a.txt", "content": "x"}, call_id="w1")
            conversation.call("attach_file", {"path": "exports/a.txt"}, call_id="a1")
            calls = json.loads(cli(*common, "ls", "recorded", "--json").stdout)
            assert [(c["call_id"], c["tool"], c["status"]) for c in calls] == [
                ("w1", "write_file", "ok"),
                ("a1", "attach_file", "ok"),
            ]
            table = cli(*common, "ls", "recorded").stdout
            assert "write_file" in table
            assert "attach_file" in table
            cards = json.loads(cli(*common, "ls", "recorded", "--attachments", "--json").stdout)
            assert [c["filename"] for c in cards] == ["a.txt"]
            assert cli(*common, "ls", "nobody").returncode == 2
        finally:
            conversation.delete()


SMALL_OUTPUTS_POLICY = "[tools]\noutputs_max_bytes = 3145728\noutputs_files_max = 5\n"


def test_ls_shows_each_conversations_attachments_against_the_policys_limits(tmp_path: Path) -> None:
    policy = tmp_path / "small.toml"
    policy.write_text(FAKE_POLICY + SMALL_OUTPUTS_POLICY)
    state = tmp_path / "state"
    with Runtime(state, policy, reap_interval_s=None) as runtime:
        conversation = runtime.conversation("attaching")
        try:
            conversation.call("write_file", {"path": "exports/a.txt", "content": "a" * 1000})
            conversation.call("write_file", {"path": "exports/b.txt", "content": "b" * 300})
            for path in ("exports/a.txt", "exports/a.txt", "exports/b.txt"):  # a.txt's content is stored once
                assert not conversation.call("attach_file", {"path": path}).is_error
            base = ("--state-dir", str(state), "--policy", str(policy), "ls")
            [row] = json.loads(cli(*base, "--json").stdout)
            assert {k: v for k, v in row.items() if k.startswith("outputs_")} == {
                "outputs_files": 3,
                "outputs_files_max": 5,
                "outputs_bytes": 1300,
                "outputs_max_bytes": 3145728,
            }
            table = cli(*base).stdout
            assert "attachments / max" in table
            assert "attachment bytes / quota" in table
            assert "3 / 5" in table
            assert "1,300 / 3,145,728" in table
            shown = cli(*base, "attaching", "--attachments").stdout
            assert "outputs/: 3 of at most 5 attachments (tools.outputs_files_max); 1,300 of 3,145,728 bytes" in shown
            assert "in 2 distinct contents" in shown
        finally:
            conversation.delete()


def test_doctor_shows_the_attachments_quota_of_the_policy(tmp_path: Path, executor_image: str) -> None:
    policy = tmp_path / "small.toml"
    policy.write_text(SMALL_OUTPUTS_POLICY)
    done = cli("--state-dir", str(tmp_path / "state"), "--policy", str(policy), "doctor")
    assert done.returncode == 0, done.stderr
    assert (
        "outputs  attachments per conversation: at most 5 (tools.outputs_files_max), 3,145,728 bytes of distinct "
        "content (tools.outputs_max_bytes); the same content is stored once"
    ) in done.stdout
    report = json.loads(cli("--state-dir", str(tmp_path / "state"), "--policy", str(policy), "doctor", "--json").stdout)
    assert report["outputs"] == {"outputs_max_bytes": 3145728, "outputs_files_max": 5}


# ------------------------------------------------------------------------------------ conventions of every command
@pytest.mark.process
def test_version_is_the_installed_one_from_the_script_and_from_python_m() -> None:
    expected = f"sandbox-runtime {importlib.metadata.version('sandbox-runtime')}"
    script = Path(sys.executable).with_name("sandbox-runtime")
    for command in ([str(script)], [sys.executable, "-m", "sandbox_runtime"]):
        done = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60, check=False)
        assert (done.returncode, done.stdout.strip(), done.stderr) == (0, expected, "")


@pytest.mark.process
def test_python_m_sandbox_runtime_is_the_same_command(tmp_path: Path, fake_policy_file: Path) -> None:
    options = ("--state-dir", str(tmp_path / "state"), "--policy", str(fake_policy_file))
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_runtime", *options, "ls", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, json.loads(done.stdout)) == (0, [])
    usage = subprocess.run([sys.executable, "-m", "sandbox_runtime"], capture_output=True, text=True, check=False)
    assert usage.returncode == 2
    assert usage.stderr.startswith("usage: sandbox-runtime ")


def _one_line_usage_error(done: subprocess.CompletedProcess[str] | CliRun) -> str:
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()  # one line: never a traceback
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "text", "bad-header"])
def test_serve_refuses_a_database_it_could_not_read_before_anything_starts(tmp_path: Path, kind: str) -> None:
    database = tmp_path / f"{kind}.sqlite3"
    if kind == "directory":
        database.mkdir()
    elif kind == "fifo":
        os.mkfifo(database)  # opening it would block: it is refused as "not a file" without being opened
    elif kind == "text":
        database.write_text("id,name\n1,a\n")
    elif kind == "bad-header":
        database.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    state = tmp_path / "state"
    line = _one_line_usage_error(cli("--state-dir", str(state), "serve", "--database", str(database)))
    assert str(database) in line
    assert "--database" in line
    assert not state.exists()  # no runtime started


def test_serve_refuses_a_database_named_by_the_policy_file_too(tmp_path: Path) -> None:
    policy = tmp_path / "sql.toml"
    policy.write_text(f'name = "sql"\n[sql]\ndatabase_path = "{tmp_path / "gone.sqlite3"}"\n')
    state = tmp_path / "state"
    line = _one_line_usage_error(cli("--state-dir", str(state), "--policy", str(policy), "serve"))
    assert "sql.database_path" in line
    assert not state.exists()


@pytest.mark.process
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_serve_http_on_a_port_in_use_is_a_usage_error_at_start(tmp_path: Path, host: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as taken:
        try:
            taken.bind((host, 0))
        except OSError as exc:
            pytest.skip(f"no {host} on this machine: {exc}")
        taken.listen()
        port = taken.getsockname()[1]
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        state = tmp_path / "state"
        line = _one_line_usage_error(serve_cli("--state-dir", str(state), "serve", "--http", shown))
    assert line == f"error: cannot serve HTTP at {shown}: Address already in use"
    assert not state.exists()


@pytest.mark.process
def test_serve_http_off_loopback_without_a_token_is_a_usage_error(tmp_path: Path) -> None:
    env = {"SANDBOX_RUNTIME_MCP_TOKEN": ""}
    line = _one_line_usage_error(serve_cli("--state-dir", str(tmp_path / "s"), "serve", "--http", "0.0.0.0:0", env=env))
    assert "needs OAuth (mcp.auth) or a bearer token" in line


def test_a_stdio_client_keeps_its_sandbox_between_sessions_and_its_exit_ends_it_keeping_the_folder(
    served_state: Path, docker_backend: DockerBackend
) -> None:
    command = [sys.executable, "-m", "tests.clients.sessions_then_exit", json.dumps(serve_command(served_state))]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as client:
        try:
            assert client.stdout is not None
            assert client.stdin is not None
            first = json.loads(client.stdout.readline())
            labels = {TEST_LABEL: SESSION, LABEL_CONVERSATION: first["conversation"]}
            (running,) = docker_backend.list_containers(labels)  # the session ended; its client did not
            client.stdin.write("go\n")
            client.stdin.flush()
            second = json.loads(client.stdout.readline())
            assert client.wait(timeout=60) == 0
        finally:
            if client.poll() is None:
                client.kill()
    assert second["conversation"] == first["conversation"]  # one conversation per client process
    assert second["text"].startswith("kept")
    assert [c.id for c in docker_backend.list_containers(labels)] in ([running.id], [])  # never a second one
    deadline = time.monotonic() + 30
    while docker_backend.list_containers(labels):
        assert time.monotonic() < deadline, "the sandbox still runs 30 s after its client exited"
        time.sleep(0.2)
    assert (served_state / "conversations" / first["conversation"] / "results").is_dir()


def test_the_help_lists_the_commands_an_operator_runs_and_no_internal_one() -> None:
    done = cli("--help")
    assert done.returncode == 0
    assert "{doctor,image,serve,demo,gc,ls,kube,state,audit}" in done.stdout
    assert "release-when-client-exits" not in done.stdout  # serve's own helper process: still runs, never listed
    assert "exit codes: 0 success" in done.stdout
    assert cli("release-when-client-exits", "--help").returncode == 0
