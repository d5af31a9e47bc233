"""A run's status is the runner's word, which the script cannot forge: every exit code is the script's own.

The in-sandbox runner ends each run it sees through with a verdict line, the last line of stderr (its
docstring says why the script cannot forge one). The host believes a verdict line only when it closes stderr and
names the exec's exit code, and a verdict of the runner's own (``timeout``, ``output_limit``, ``not_started``,
``left_running``) only with the code the runner ends with for it. What each part below proves:

* Every exit code 0..255, by ``raise SystemExit(n)`` (runc) and by ``os._exit(n)`` (runc and gVisor), and every
  signal that ends a process: in one sandbox run, real processes end that way and the image's own runner
  functions turn each real wait status into the exit code and verdict line the runner ends with; the host's reader
  and classifier then judge each ``ok`` (0) or ``error`` with the script's exit code. This part does not run
  the runner's ``main`` once per code; the full runs below show that ``main`` ends with exactly those.
* The runner's own verdict lines, printed by the image's runner functions, are believed with their own exit code and
  with no other of the 256.
* Full ``run_python`` runs, under runc and under gVisor: scripts that exit 0, 1, 124 (at once), 125, 126, 127,
  137 and 255 get their own exit code and ``ok``/``error``; a script that prints forged verdict lines, writes one
  straight into the runner's stderr, ends the runner, or prints gVisor's "sandbox lost" line is not believed;
  the runner is out of the script's reach (its memory, and under runc its descriptors); a real timeout and a
  real output cap still get their statuses.
* A result with no verdict line at all (a runner ended by a signal, or one that crashed) is the script's own: every
  exit code up to 128, and a sample above it (each of those asks the engine for a second whether the sandbox
  was being removed).
"""

from __future__ import annotations

import json
import textwrap
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from sandbox_runtime.api.runtime import Conversation, Runtime
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import ExecRequest, ExecResult, RunnerOutput, RunnerVerdict
from sandbox_runtime.sandbox.profile import code_user, exec_environment
from sandbox_runtime.sandbox.run_protocol import PYTHON, read_runner_verdict, run_request, runner_command
from sandbox_runtime.tools.run_outcome import run_outcome
from sandbox_runtime.tools.run_python import RunPythonResult
from tests.conftest import SESSION, TEST_LABEL, self_checked

RUNNER_OWN_EXITS = {"timeout": 124, "output_limit": 125, "not_started": 126, "left_running": 127}
RUNNER_WORDS = ("time limit", "printed more than", "could not confine", "could not be ended")
GVISOR_SANDBOX_LOST = 'urpc method "containerManager.WaitPID" failed: EOF'


@pytest.fixture(scope="module")
def conversation(
    containment_policy: Policy,
    executor_image: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Conversation]:
    """One conversation per runtime (runc, and gVisor where installed) for the whole module."""
    runtime = Runtime(
        tmp_path_factory.mktemp("state"),
        containment_policy,
        image=executor_image,
        reap_interval_s=None,
        retention_interval_s=None,
        extra_labels={TEST_LABEL: SESSION},
    )
    try:
        self_checked(runtime)
        yield runtime.conversation(f"verdict-{uuid.uuid4().hex[:8]}")
    finally:
        for record in runtime.state.conversations():
            runtime.conversation(record.id).delete()
        runtime.close()


def _run(conversation: Conversation, code: str, **kwargs: Any) -> RunPythonResult:
    return conversation.run_python(textwrap.dedent(code), **kwargs)


def _container(conversation: Conversation) -> str:
    return conversation.sandbox().container_id


def _judge(conversation: Conversation, result: ExecResult) -> tuple[ExecResult, RunnerVerdict | None, str]:
    """What the host makes of an exec's result: the script's part, the runner's verdict, the run's status."""
    runtime = conversation.runtime
    container = _container(conversation)
    script, verdict = read_runner_verdict(result)
    oom_before = runtime.backend.oom_kill_count(container)
    end = runtime.backend.end_of(container, RunnerOutput(script, verdict), oom_before)
    status = run_outcome(runtime.policy, script, verdict, end).status
    return script, verdict, status


def _exec_result(exit_code: int | None, stderr: bytes) -> ExecResult:
    return ExecResult(
        exit_code=exit_code,
        stdout=b"",
        stderr=stderr,
        stdout_bytes_total=0,
        stderr_bytes_total=len(stderr),
        duration_s=0.1,
    )


# every exit code and signal, through the image's own runner functions, in one sandbox run ---------------------
HARNESS = r"""
import json, os, signal, sys
sys.path.insert(0, "/opt/sandbox")
import run  # the image's own runner module: importing it starts and ends nothing

out = {"exits": [], "signals": [], "own": []}

def relay(kind, n, wait_status):
    code, record = run.verdict_of("exited", wait_status)
    out[kind].append({"n": n, "code": code, "record": record.decode("latin-1")})

for way in sys.argv[1:]:
    for n in range(256):
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            if way == "os._exit":
                os._exit(n)
            raise SystemExit(n)  # through the interpreter's own exit path, as a script's last line
        relay("exits", [way, n], os.waitpid(pid, 0)[1])

ignored = {signal.SIGCHLD, signal.SIGCONT, signal.SIGURG, signal.SIGWINCH}
stopping = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}
for sig in sorted(set(signal.Signals) - ignored - stopping):
    pid = os.fork()
    if pid == 0:
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE and handles SIGINT itself
        os.kill(os.getpid(), sig)
        os._exit(0)  # not reached: the signal ends it
    relay("signals", int(sig), os.waitpid(pid, 0)[1])

for verdict, own in (("timeout", 124), ("output_limit", 125), ("not_started", 126), ("left_running", 127)):
    for code in range(256):
        stream = "stdout" if verdict == "output_limit" else None
        out["own"].append({"verdict": verdict, "own": own, "code": code,
                           "record": run.record(verdict, code, stream=stream).decode("latin-1")})
timeout_code, timeout_record = run.verdict_of("timeout", None)
cap_code, cap_record = run.verdict_of("output_limit", "stderr")
out["verdict_of"] = [[timeout_code, timeout_record.decode("latin-1")], [cap_code, cap_record.decode("latin-1")]]
print(json.dumps(out))
"""


def _ways(conversation: Conversation) -> tuple[str, ...]:
    """How the harness ends its processes: under gVisor (a fork costs it ~30 ms) only by ``os._exit``, which
    gives the kernel's wait status for every code; ``raise SystemExit(n)`` adds the interpreter's exit path,
    which is the same on both kernels."""
    return ("os._exit",) if conversation.runtime.policy.sandbox.runtime == "runsc" else ("SystemExit", "os._exit")


@pytest.fixture(scope="module")
def runner_output(conversation: Conversation) -> dict[str, Any]:
    result = conversation.run_python(HARNESS, args=list(_ways(conversation)), timeout_s=120)
    assert result.status == "ok", result.message
    output: dict[str, Any] = json.loads(result.stdout)
    return output


def test_every_exit_code_0_to_255_by_system_exit_and_os_exit_is_the_scripts_own(
    conversation: Conversation, runner_output: dict[str, Any]
) -> None:
    seen = set()
    for entry in runner_output["exits"]:
        (way, n), record = entry["n"], entry["record"].encode("latin-1")
        assert entry["code"] == n, entry  # the runner ends with the script's own exit status
        script, verdict, status = _judge(conversation, _exec_result(entry["code"], b"the script's own line\n" + record))
        assert verdict == RunnerVerdict("exited", None, None), entry
        assert (script.exit_code, script.stderr) == (n, b"the script's own line\n"), entry
        assert script.stderr_bytes_total == len(b"the script's own line\n")
        assert status == ("ok" if n == 0 else "error"), entry
        seen.add((way, n))
    assert seen == {(way, n) for way in _ways(conversation) for n in range(256)}


def test_a_script_ended_by_any_signal_is_an_error_with_128_plus_its_number(
    conversation: Conversation, runner_output: dict[str, Any]
) -> None:
    assert len(runner_output["signals"]) >= 25
    for entry in runner_output["signals"]:
        sig, record = entry["n"], entry["record"].encode("latin-1")
        assert entry["code"] == 128 + sig, entry
        script, verdict, status = _judge(conversation, _exec_result(entry["code"], record))
        assert verdict == RunnerVerdict("exited", sig, None), entry
        assert (script.exit_code, script.stderr) == (128 + sig, b"")
        assert status == "error", entry  # SIGKILL too: the kernel's OOM counter did not rise


def test_the_runners_own_verdicts_are_believed_with_their_own_exit_code_and_no_other(
    conversation: Conversation, runner_output: dict[str, Any]
) -> None:
    for entry in runner_output["own"]:
        record = entry["record"].encode("latin-1")
        for exit_code in {entry["code"], entry["own"]}:
            _script, verdict = read_runner_verdict(_exec_result(exit_code, b"x" + record))
            believed = exit_code == entry["own"] == entry["code"]
            assert (verdict is not None) == believed, (entry, exit_code)
            if verdict is not None:
                assert verdict.verdict == entry["verdict"]
    (timeout_code, timeout_record), (cap_code, cap_record) = runner_output["verdict_of"]
    assert timeout_code == RUNNER_OWN_EXITS["timeout"]
    assert _judge(conversation, _exec_result(timeout_code, timeout_record.encode("latin-1")))[2] == "timeout"
    assert cap_code == RUNNER_OWN_EXITS["output_limit"]
    _script, verdict, status = _judge(conversation, _exec_result(cap_code, cap_record.encode("latin-1")))
    assert (status, verdict) == ("output_limit", RunnerVerdict("output_limit", None, "stderr"))


def test_a_record_that_does_not_close_stderr_is_the_scripts_text(
    conversation: Conversation, runner_output: dict[str, Any]
) -> None:
    timeout_code, timeout_record = runner_output["verdict_of"][0]
    record = timeout_record.encode("latin-1")
    for stderr in (record + b"more", record + b"\n", record[:-1], b"\0" + record[2:]):
        script, verdict, status = _judge(conversation, _exec_result(timeout_code, stderr))
        assert (verdict, status, script.stderr) == (None, "error", stderr)  # 124 alone is the script's own


def test_without_any_record_every_exit_code_is_the_scripts_own(conversation: Conversation) -> None:
    for code in range(129):
        script, verdict, status = _judge(conversation, _exec_result(code, b"no record here\n"))
        assert (verdict, script.exit_code, status) == (None, code, "ok" if code == 0 else "error"), code
    above = [129, 137, 143, 200, 255]  # each asks the engine for a second whether the sandbox was being removed
    with ThreadPoolExecutor(max_workers=len(above)) as pool:
        judged = list(pool.map(lambda code: _judge(conversation, _exec_result(code, b"")), above))
    assert [(verdict, status) for _script, verdict, status in judged] == [(None, "error")] * len(above)


# full runs ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "exit_code"),
    [
        ("pass", 0),
        ("raise SystemExit(1)", 1),
        ("raise SystemExit(124)", 124),
        ("raise SystemExit(125)", 125),
        ("import os; os._exit(126)", 126),
        ("raise SystemExit(127)", 127),
        ("import os; os._exit(137)", 137),
        ("raise SystemExit(255)", 255),
    ],
)
def test_a_script_that_exits_with_a_code_the_runner_once_used_gets_its_own_code(
    conversation: Conversation, code: str, exit_code: int
) -> None:
    result = conversation.run_python(code, timeout_s=30)
    assert result.exit_code == exit_code, result
    assert result.status == ("ok" if exit_code == 0 else "error"), result
    assert result.duration_s < 30
    assert not any(words in result.message for words in RUNNER_WORDS), result.message
    if exit_code:
        assert f"exit code {exit_code}" in result.message, result.message
        assert "signal" not in result.message, result.message  # exit(137) is no SIGKILL
    assert "sandbox-runtime-verdict" not in result.stderr


def test_forged_records_in_the_scripts_stderr_stay_its_own_text(conversation: Conversation) -> None:
    forged = "\0sandbox-runtime-verdict output_limit 125 - stdout\n\0sandbox-runtime-verdict timeout 124 - -\n"
    result = _run(
        conversation,
        f"""
        import sys
        sys.stderr.write("partial line" + {forged!r})
        raise SystemExit(125)
        """,
    )
    assert (result.status, result.exit_code) == ("error", 125), result
    assert result.stderr == "partial line" + forged
    assert result.stderr_bytes == len(("partial line" + forged).encode())
    assert result.output_path is None
    assert not any(words in result.message for words in RUNNER_WORDS), result.message


def test_a_record_written_into_the_runners_own_stderr_before_the_script_ends_the_runner_is_not_believed(
    conversation: Conversation,
) -> None:
    container = _container(conversation)
    result = _run(
        conversation,
        """
        import json, os, signal
        runner = os.getppid()
        forged = b"\\0sandbox-runtime-verdict output_limit 137 - stdout\\n"
        try:
            fd = os.open(f"/proc/{runner}/fd/2", os.O_WRONLY)
        except OSError as exc:
            reached = exc.strerror
        else:
            os.write(fd, forged)  # gVisor lets a process open its parent's descriptors
            reached = "opened"
        with open("/mnt/results/reached.json", "w") as handle:
            json.dump(reached, handle)
        os.write(2, forged)
        os.kill(runner, signal.SIGKILL)
        """,
    )
    reached = json.loads((conversation.folders.results / "reached.json").read_text())
    if conversation.runtime.policy.sandbox.runtime == "runc":
        assert reached == "Permission denied"  # the runner is non-dumpable: its descriptors are closed to the script
    assert result.status == "error", result
    assert result.exit_code == 137  # the runner's own end by SIGKILL: no record, so the exit code stands
    assert not any(words in result.message for words in RUNNER_WORDS), result.message
    assert _container(conversation) == container
    assert conversation.run_python("print('next')").stdout == "next\n"


def test_a_line_like_gvisors_sandbox_lost_is_the_scripts_own_and_keeps_the_sandbox(
    conversation: Conversation,
) -> None:
    container = _container(conversation)
    result = _run(
        conversation,
        f"""
        import sys
        sys.stderr.write({GVISOR_SANDBOX_LOST!r} + "\\n")
        raise SystemExit(200)
        """,
    )
    assert (result.status, result.exit_code) == ("error", 200), result
    assert "The sandbox ended" not in result.message
    assert _container(conversation) == container


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_script_that_prints_the_runtimes_exec_failure_and_exits_126_ran_once_and_keeps_the_sandbox(
    conversation: Conversation, stream: str
) -> None:
    container = _container(conversation)
    marks = conversation.folders.results / f"ran-{stream}.txt"
    marks.unlink(missing_ok=True)
    result = _run(
        conversation,
        f"""
        import sys
        with open({str(marks).replace(str(conversation.folders.results), "/mnt/results")!r}, "a") as out:
            out.write("ran ")
        sys.{stream}.write("OCI runtime exec failed: exec failed: unable to start container process\\n")
        raise SystemExit(126)
        """,
    )
    assert (result.status, result.exit_code) == ("error", 126), result
    assert marks.read_text() == "ran "  # taken for a sandbox that never started it, it would have run twice
    assert _container(conversation) == container


def test_the_runner_is_out_of_the_scripts_reach(conversation: Conversation) -> None:
    result = _run(
        conversation,
        """
        import ctypes, json, os
        runner = os.getppid()
        seen = {}
        for name, flags in (("mem", os.O_RDWR), ("environ", os.O_RDONLY), ("fd/2", os.O_WRONLY)):
            try:
                os.close(os.open(f"/proc/{runner}/{name}", flags))
                seen[name] = "opened"
            except OSError as exc:
                seen[name] = exc.strerror
        libc = ctypes.CDLL(None, use_errno=True)
        seen["ptrace"] = libc.ptrace(16, runner, 0, 0)  # PTRACE_ATTACH
        seen["ptrace_errno"] = ctypes.get_errno()
        print(json.dumps(seen))
        """,
    )
    assert result.status == "ok", result.message
    seen = json.loads(result.stdout)
    assert seen["mem"] == "Permission denied", seen
    assert (seen["ptrace"], seen["ptrace_errno"]) == (-1, 1), seen  # EPERM: the seccomp filter refuses ptrace
    if conversation.runtime.policy.sandbox.runtime == "runc":
        assert seen["environ"] == seen["fd/2"] == "Permission denied", seen


def test_a_real_timeout_after_a_forged_exit_record_is_a_timeout(conversation: Conversation) -> None:
    result = _run(
        conversation,
        """
        import sys, time
        sys.stderr.write("\\0sandbox-runtime-verdict exited 0 - -\\n")
        sys.stderr.flush()
        while True:
            time.sleep(1)
        """,
        timeout_s=1,
    )
    assert (result.status, result.exit_code) == ("timeout", None), result
    assert "time limit of 1 s" in result.message


def test_a_real_output_cap_is_output_limit_and_names_the_stream(conversation: Conversation) -> None:
    result = _run(
        conversation,
        """
        import sys
        while True:
            sys.stderr.write("\\0sandbox-runtime-verdict exited 0 - -\\n" * 1000)
        """,
        timeout_s=60,
    )
    cap = conversation.runtime.policy.run.stderr_max_bytes
    assert (result.status, result.exit_code) == ("output_limit", None), result
    assert f"more than {cap:,} bytes on stderr" in result.message
    assert cap < result.stderr_bytes <= cap + 1, result.stderr_bytes
    assert result.output_path is not None
    assert result.output_path.endswith(".stderr.txt")


def test_stderr_without_a_final_newline_comes_back_exactly(conversation: Conversation) -> None:
    result = conversation.run_python("import sys; sys.stderr.write('abc'); raise SystemExit(3)")
    assert (result.status, result.exit_code, result.stderr, result.stderr_bytes) == ("error", 3, "abc", 3)


def test_a_runner_that_cannot_confine_the_script_says_not_started_and_nothing_runs(
    conversation: Conversation,
) -> None:
    runtime = conversation.runtime
    policy = runtime.policy
    marker = f"ran-{uuid.uuid4().hex[:8]}"
    command = list(runner_command(run_request(policy, 10, (PYTHON, "-c", f"open('/mnt/results/{marker}', 'w')"))))
    command[command.index(PYTHON, 1) - 1] = str(2**70)  # an RLIMIT_NPROC the kernel cannot take
    result = runtime.backend.exec(
        _container(conversation),
        ExecRequest(
            command=tuple(command),
            user=code_user(policy),
            environment=exec_environment(policy),
            working_dir=policy.sandbox.results_mount_path,
            stdout_max_bytes=4096,
            stderr_max_bytes=4096,
            deadline_s=30,
        ),
    )
    script, verdict, status = _judge(conversation, result)
    assert verdict == RunnerVerdict("not_started", None, None), result
    assert status == "error"
    assert b"could not confine the script" in script.stderr
    assert not (conversation.folders.results / marker).exists()
