"""The conformance suite: what every sandbox backend must do for the runtime, run against Docker with runc, Docker
with runsc (gVisor), Podman with runc and the shipped fake. A new backend (Kubernetes, say) joins the parameter
list and passes the same tests; what a backend does not enforce it declares (``confines``, ``not_enforced``), and
only then may a test of that protection be left out for it.

The scripts use relative paths (every run starts in the results folder) so that one text runs on every backend.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import SandboxGone
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import ExecRequest
from sandbox_runtime.sandbox.labels import (
    LABEL_CONVERSATION,
    LABEL_CREATED_AT,
    LABEL_POLICY,
    LABEL_RUNTIME,
    LABEL_STATE_DIR,
)
from sandbox_runtime.sandbox.profile import code_user, sandbox_identity
from sandbox_runtime.state.location import STATE_FILE, STATE_URL_FILE
from sandbox_runtime.tools.run_python import RunPythonResult, run_python

from .conftest import SUBJECTS_ON_EVERY_STORE, Subject, make_subject


@pytest.fixture(params=SUBJECTS_ON_EVERY_STORE)
def subject(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Subject:
    """Each backend, and the fake and Docker with their state on PostgreSQL: these stories involve the state."""
    return make_subject(request, tmp_path_factory)


WAIT_S = 60.0  # the longest any wait here may take


def _wait_for(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# statuses and exit codes -----------------------------------------------------------------------------------
def test_a_script_that_prints_and_exits_0_is_ok_with_its_output(subject: Subject) -> None:
    result = subject.make().conversation("ok").run_python("print(6 * 7)")
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "42\n")


def test_an_exception_is_an_error_whose_message_keeps_the_exception_line_and_saves_the_whole_of_it(
    subject: Subject,
) -> None:
    conversation = subject.make().conversation("error")
    result = conversation.run_python("def f():\n    raise KeyError('missing-key')\nf()")
    assert (result.status, result.exit_code) == ("error", 1)
    assert "KeyError: 'missing-key'" in (result.message or "")
    assert result.error_path is not None
    saved = conversation.folders.results / result.error_path.removeprefix("/mnt/results/")
    assert "Traceback" in saved.read_text()


@pytest.mark.parametrize("code", [3, 124, 125, 126])
def test_every_exit_code_is_the_scripts_own(subject: Subject, code: int) -> None:
    result = subject.make().conversation(f"exit-{code}").run_python(f"import sys; sys.exit({code})")
    assert (result.status, result.exit_code) == ("error", code)


def test_a_script_past_its_time_limit_is_a_timeout_and_leaves_no_process(subject: Subject) -> None:
    conversation = subject.make().conversation("timeout")
    code = "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    code += "time.sleep(600)"
    began = time.monotonic()
    result = conversation.run_python(code, timeout_s=1)
    assert result.status == "timeout", result.message
    assert time.monotonic() - began < WAIT_S
    after = conversation.run_python("print('next')")
    assert (after.status, after.stdout) == ("ok", "next\n")


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_past_a_streams_cap_is_an_output_limit_and_the_first_bytes_are_kept(
    subject: Subject, stream: str
) -> None:
    cap = subject.policy.run.stdout_max_bytes if stream == "stdout" else subject.policy.run.stderr_max_bytes
    conversation = subject.make().conversation(f"cap-{stream}")
    result = conversation.run_python(f"import sys\nfor _ in range({cap // 4096 + 8}): sys.{stream}.write('o' * 4096)")
    assert result.status == "output_limit", result.message
    assert result.output_path is not None
    kept = (conversation.folders.results / result.output_path.removeprefix("/mnt/results/")).read_bytes()
    assert kept == b"o" * cap


def test_a_cancelled_run_ends_every_process_and_says_cancelled(subject: Subject) -> None:
    runtime = subject.make()
    conversation = runtime.conversation("cancel")
    control = CallControl()
    code = "import pathlib, subprocess, sys, time\n"
    code += "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    code += "pathlib.Path('started').write_text('yes')\ntime.sleep(600)"
    outcome: list[RunPythonResult] = []
    started = conversation.folders.results / "started"
    handle = runtime.conversations.handle(conversation.id)
    worker = threading.Thread(target=lambda: outcome.append(run_python(handle, {"code": code}, control=control)))
    worker.start()
    assert _wait_for(started.exists), "the run never started"
    control.cancel()
    worker.join(WAIT_S)
    assert not worker.is_alive()
    (result,) = outcome
    assert result.status == "cancelled", result.message
    assert conversation.run_python("print('after')").stdout == "after\n"


def test_progress_is_heard_about_once_a_second_while_a_run_goes_on(subject: Subject) -> None:
    heard: list[tuple[float, float | None]] = []
    control = CallControl(progress=lambda done, total, _message: heard.append((done, total)))
    conversation = subject.make().conversation("progress")
    result = conversation.call("run_python", {"code": "import time; time.sleep(2.6)", "timeout_s": 30}, control=control)
    assert not result.is_error, result.text
    assert len(heard) >= 2
    assert all(total == 30 for _, total in heard)


def test_a_script_past_the_memory_limit_ends_as_memory_limit_or_the_backend_says_it_sets_none(
    subject: Subject,
) -> None:
    if not subject.backend.confines:  # a backend that does not limit memory must say so, and then it is not tried
        assert any("memory" in said for said in subject.backend.not_enforced), subject.backend.not_enforced
        return
    code = "blocks = []\nwhile True: blocks.append(bytearray(64 * 1024 * 1024))"
    result = subject.make().conversation("memory").run_python(code, timeout_s=60)
    assert result.status == "memory_limit", result.message


# containers: labels, re-attach, removal from outside, sweep ----------------------------------------------
def test_a_sandbox_carries_the_runtimes_labels_and_is_found_by_them(subject: Subject) -> None:
    runtime = subject.make()
    sandbox = runtime.conversation("labels").sandbox()
    own = {LABEL_CONVERSATION: "labels", LABEL_RUNTIME: "1", LABEL_STATE_DIR: str(runtime.state_dir.resolve())}
    (info,) = subject.backend.list_containers(own)
    assert info.id == sandbox.container_id
    assert info.running
    assert info.labels[LABEL_STATE_DIR] == str(runtime.state_dir.resolve())
    assert info.labels[LABEL_POLICY] == sandbox_identity(subject.policy, runtime.manager.image)  # what shapes it
    assert LABEL_CREATED_AT in info.labels
    inspected = subject.backend.inspect(sandbox.container_id)
    assert inspected is not None
    assert (inspected.id, inspected.running, inspected.labels) == (info.id, True, info.labels)
    assert subject.backend.list_containers({LABEL_CONVERSATION: "labels", "io.sandbox-runtime.no-such": "x"}) == []


def test_a_second_runtime_on_the_state_directory_reattaches_the_running_sandbox(subject: Subject) -> None:
    first = subject.make()
    first.conversation("shared").run_python("open('marker', 'w').write('kept')")
    container = first.conversation("shared").sandbox().container_id
    first.close()
    second = subject.make(state_dir=first.state_dir)
    result = second.conversation("shared").run_python("print(open('marker').read())")
    assert (result.status, result.stdout) == ("ok", "kept\n")
    assert second.conversation("shared").sandbox().container_id == container


def test_a_sandbox_removed_from_outside_is_replaced_on_the_next_run_with_its_folder_kept(subject: Subject) -> None:
    conversation = subject.make().conversation("removed")
    conversation.run_python("open('kept.txt', 'w').write('still here')")
    old = conversation.sandbox().container_id
    subject.backend.remove(old)
    assert subject.backend.inspect(old) is None
    with pytest.raises(SandboxGone):
        subject.backend.exec(old, _request(subject.policy))
    result = conversation.run_python("print(open('kept.txt').read())")
    assert (result.status, result.stdout) == ("ok", "still here\n")
    assert conversation.sandbox().container_id != old


def test_gc_removes_the_sandbox_of_a_state_directory_that_is_gone(subject: Subject, tmp_path: Path) -> None:
    doomed = subject.make(state_dir=tmp_path / "doomed")
    container = doomed.conversation("left-behind").sandbox().container_id
    for store in (STATE_FILE, STATE_URL_FILE):  # as when the state directory was deleted (its store's file, either)
        (tmp_path / "doomed" / store).unlink(missing_ok=True)
    survivor = subject.make(sweep_on_start=False)  # gc by hand (a start sweeps as well)
    removed = {r.container_id: r.reason for r in survivor.gc()}
    # every runtime on the engine sweeps such orphans: a parallel worker's may have been first (or be removing it
    # still, when this gc found it too)
    assert container not in removed or "state directory is gone" in removed[container]
    left = subject.backend.inspect(container)
    assert left is None or left.status == "removing", left  # the engine may still be finishing a removal


def test_close_removes_the_sandbox_and_keeps_the_folder(subject: Subject) -> None:
    conversation = subject.make().conversation("closing")
    conversation.run_python("open('kept.txt', 'w').write('x')")
    container = conversation.sandbox().container_id
    assert conversation.close() is True
    assert subject.backend.inspect(container) is None
    assert conversation.run_python("print(open('kept.txt').read())").stdout == "x\n"


def _request(policy: Policy) -> ExecRequest:
    return ExecRequest(
        command=("true",), user=code_user(policy), stdout_max_bytes=1024, stderr_max_bytes=1024, deadline_s=30
    )
