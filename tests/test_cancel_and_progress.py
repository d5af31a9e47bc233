"""A caller cancels a long run and hears its progress; a sandbox removed under a run says so.

Each story runs real code in a real sandbox. A run is started on a worker thread; the test waits (bounded) for
the script to say it is under way by a file it writes in the results folder, and then acts: cancels, or removes
the container. What is left is then looked at from inside the sandbox, by a command started straight through
the backend (not through the runner, whose start-up sweep would hide a process a cancel missed).
"""

from __future__ import annotations

import itertools
import re
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime.api.runtime import Conversation, Runtime
from sandbox_runtime.control import CallControl
from sandbox_runtime.models import ToolCall
from sandbox_runtime.policy import Policy
from sandbox_runtime.tools.run_python import RunPythonResult, run_python
from tests.conftest import RuntimeFactory, self_checked
from tests.sandbox_processes import code_processes, run_processes, sandbox_container

CANCEL_RETURNS_WITHIN_S = 3.0  # the backend ends every process within 2 s; the rest is reading and classifying
WAIT_FOR_START_S = 60.0  # a first run may start the sandbox (and the self-check) first
NEXT_RUN_WITHIN_S = 10.0

# Prints a marker, starts a double-forked daemon that would write `late` at the time written to `started`,
# and then sleeps far past any wait of the test. Argument: a folder of the results folder, made for the run.
LONG_RUN_WITH_A_DAEMON = textwrap.dedent(
    """
    import os, sys, time
    folder = sys.argv[1]
    os.makedirs(folder, exist_ok=True)
    due = time.time() + 3
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            open(os.path.join(folder, "daemon-ready"), "w").close()
            time.sleep(max(0.0, due - time.time()))
            with open(os.path.join(folder, "late"), "w") as handle:
                handle.write("the daemon outlived its run")
            os._exit(0)
        os._exit(0)
    os.wait()
    give_up = time.monotonic() + 30
    while not os.path.exists(os.path.join(folder, "daemon-ready")) and time.monotonic() < give_up:
        time.sleep(0.01)
    print("run-marker: under way", flush=True)
    print("a line on stderr before the cancel", file=sys.stderr, flush=True)
    with open(os.path.join(folder, "started.tmp"), "w") as handle:
        handle.write(repr(due))
    os.rename(os.path.join(folder, "started.tmp"), os.path.join(folder, "started"))
    time.sleep(60)
    print("run-marker: finished", flush=True)
    """
)


# helpers -----------------------------------------------------------------------------------------------------
@pytest.fixture
def worker() -> Iterator[ThreadPoolExecutor]:
    """A thread to run a call on while the test acts as its caller."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-run") as pool:
        yield pool


def _checked_runtime(runtime_factory: RuntimeFactory, policy: Policy) -> Runtime:
    """A runtime whose self-check passed; runsc refused by this host is skipped (and fails under CI)."""
    return self_checked(runtime_factory(policy))


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` has passed; whether it held."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _run_folder(conversation: Conversation) -> tuple[str, Path]:
    """A fresh name in the results folder (the run makes it): its in-sandbox path and where the host sees it."""
    name = f"run-{uuid.uuid4().hex[:8]}"
    return f"/mnt/results/{name}", conversation.folders.results / name


def _start_long_run(
    worker: ThreadPoolExecutor, runtime: Runtime, conversation: Conversation, control: CallControl | None
) -> tuple[Future[RunPythonResult], Path]:
    """Start the long run with its daemon on the worker, and wait (bounded) until it is under way."""
    sandbox_folder, host_folder = _run_folder(conversation)
    arguments: dict[str, object] = {"code": LONG_RUN_WITH_A_DAEMON, "args": [sandbox_folder], "timeout_s": 120}
    future = worker.submit(run_python, runtime.conversations.handle(conversation.id), arguments, control=control)
    started = _wait_for(lambda: (host_folder / "started").exists() or future.done(), WAIT_FOR_START_S)
    assert not future.done(), future.result()
    assert started, "the run never got under way"
    return future, host_folder


def _container(runtime: Runtime, conversation: Conversation) -> str:
    """The conversation's container, found by its labels (``conversation.sandbox()`` would wait for a run to end:
    it takes the conversation's lock)."""
    return sandbox_container(runtime, conversation.id)


def _code_processes(runtime: Runtime, conversation: Conversation) -> list[dict[str, Any]]:
    """The live processes of the code's uid in the sandbox, seen by a command that is not run by the runner."""
    return code_processes(runtime, conversation.id)


def _assert_next_run_starts_at_once(conversation: Conversation) -> None:
    began = time.monotonic()
    result = conversation.run_python("print('next run')", timeout_s=30)
    assert (result.status, result.stdout) == ("ok", "next run\n"), (result.status, result.message)
    assert time.monotonic() - began < NEXT_RUN_WITHIN_S


# cancel ------------------------------------------------------------------------------------------------------
def test_cancelling_a_long_run_ends_every_process_of_it_at_once_and_frees_the_conversation(
    runtime_factory: RuntimeFactory, containment_policy: Policy, worker: ThreadPoolExecutor
) -> None:
    runtime = _checked_runtime(runtime_factory, containment_policy)
    conversation = runtime.conversation(f"cancel-{uuid.uuid4().hex[:8]}")
    control = CallControl()
    future, folder = _start_long_run(worker, runtime, conversation, control)
    due = float((folder / "started").read_text())
    # the listing sees the run while it runs: the runner, the script and its daemon
    assert len(_code_processes(runtime, conversation)) >= 3

    cancelled_at = time.monotonic()
    control.cancel()
    result = future.result(timeout=30)
    took_s = time.monotonic() - cancelled_at

    assert took_s < CANCEL_RETURNS_WITHIN_S, (took_s, result)
    assert result.status == "cancelled", (result.status, result.message)
    assert result.is_error
    assert result.message.startswith("Cancelled by the caller after "), result.message
    assert "every process of the run was ended" in result.message
    assert "run-marker: under way" in result.stdout
    assert "run-marker: finished" not in result.stdout
    assert result.error_path is not None
    assert result.error_path in result.message
    saved = conversation.folders.results / result.error_path.removeprefix("/mnt/results/")
    assert "a line on stderr before the cancel" in saved.read_text()

    # nothing of the code's uid is left in the sandbox: not the runner, not the script, not the daemon (a listing
    # may catch the executor's next spare in the instant between its fork and its naming itself: asked again)
    assert _wait_for(lambda: run_processes(runtime, conversation.id) == [], 5.0), run_processes(
        runtime, conversation.id
    )
    # and the daemon's file never appears, even past the moment it was due
    appeared = _wait_for((folder / "late").exists, max(0.0, due - time.time()) + 1.5)
    assert not appeared, "a process of the cancelled run wrote its file after the cancel"
    assert (folder / "daemon-ready").exists()  # files written before the cancel stay

    _assert_next_run_starts_at_once(conversation)


def test_a_run_cancelled_before_it_starts_runs_nothing(runtime: Runtime) -> None:
    conversation = runtime.conversation("cancel-before")
    sandbox_folder, host_folder = _run_folder(conversation)
    control = CallControl()
    control.cancel()

    result = run_python(
        runtime.conversations.handle(conversation.id),
        {"code": f"open('{sandbox_folder}', 'w').close()\nprint('ran')"},
        control=control,
    )

    assert (result.status, result.is_error, result.stdout, result.exit_code) == ("cancelled", True, "", None)
    assert result.message == "Cancelled by the caller before it started: nothing ran."
    assert not host_folder.exists()
    _assert_next_run_starts_at_once(conversation)


def test_a_call_cancelled_through_the_pipeline_reaches_the_run_and_the_model_is_told(
    runtime: Runtime, worker: ThreadPoolExecutor
) -> None:
    conversation = runtime.conversation("cancel-pipeline")
    sandbox_folder, host_folder = _run_folder(conversation)
    control = CallControl()
    call = ToolCall(
        tool="run_python",
        arguments={"code": LONG_RUN_WITH_A_DAEMON, "args": [sandbox_folder], "timeout_s": 120},
        call_id="c1",
    )
    prepared = worker.submit(runtime.dispatcher.prepare, conversation.id, call, control=control)
    assert _wait_for(lambda: (host_folder / "started").exists() or prepared.done(), WAIT_FOR_START_S)

    cancelled_at = time.monotonic()
    control.cancel()
    report = runtime.dispatcher.settle(conversation.id, [prepared.result(timeout=30)])
    assert time.monotonic() - cancelled_at < CANCEL_RETURNS_WITHIN_S

    outcome = report.outcomes[0]
    assert outcome.is_error
    assert "Cancelled by the caller after" in outcome.text, outcome.text
    assert outcome.details is not None
    assert outcome.details["status"] == "cancelled"
    assert run_processes(runtime, conversation.id) == []


def test_a_call_waiting_for_its_conversation_gives_up_when_cancelled_and_never_runs(
    runtime: Runtime, worker: ThreadPoolExecutor
) -> None:
    conversation = runtime.conversation("cancel-waiting")
    first_control = CallControl()
    first, _folder = _start_long_run(worker, runtime, conversation, first_control)
    sandbox_folder, host_folder = _run_folder(conversation)
    waiting_control = CallControl()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-waiting") as second_worker:
        waiting = second_worker.submit(
            run_python,
            runtime.conversations.handle(conversation.id),
            {"code": f"open('{sandbox_folder}', 'w').close()"},
            control=waiting_control,
        )
        waiting_control.cancel()
        result = waiting.result(timeout=5)  # the first run holds the lock for another minute
    assert (result.status, result.message) == ("cancelled", "Cancelled by the caller before it started: nothing ran.")
    assert not first.done()

    first_control.cancel()
    assert first.result(timeout=30).status == "cancelled"
    assert not host_folder.exists()


# progress ----------------------------------------------------------------------------------------------------
def test_a_listener_hears_a_runs_progress_about_once_a_second(runtime: Runtime) -> None:
    conversation = runtime.conversation("progress")
    conversation.run_python("pass")  # the sandbox is up: the run's own time is what is reported
    heard: list[tuple[float, float, float | None, str | None]] = []

    def listen(progress: float, total: float | None, message: str | None) -> None:
        heard.append((time.monotonic(), progress, total, message))

    code = "import time\nfor i in range(40):\n    print('line', i, flush=True)\n    time.sleep(0.1)\n"
    began = time.monotonic()
    result = run_python(
        runtime.conversations.handle(conversation.id),
        {"code": code, "timeout_s": 30},
        control=CallControl(progress=listen),
    )
    ended = time.monotonic()

    assert result.status == "ok", result.message
    assert len(heard) >= 3, heard
    times = [began, *(at for at, _progress, _total, _message in heard)]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert max(gaps[1:]) <= 1.1, gaps  # at least once a second ...
    assert min(gaps[1:]) >= 0.45, gaps  # ... and never more often than about every half second
    assert ended - heard[-1][0] <= 1.1  # until the end of the run
    progress = [p for _at, p, _total, _message in heard]
    assert progress == sorted(progress), progress
    assert progress[0] > 0, progress
    assert {total for _at, _p, total, _message in heard} == {30.0}  # the run's time limit
    output = []
    for _at, p, _total, message in heard:
        assert message is not None
        matched = re.fullmatch(r"(\d+\.\d) s elapsed, ([\d,]+) bytes of output so far", message)
        assert matched, message
        assert abs(float(matched[1]) - p) < 0.06
        output.append(int(matched[2].replace(",", "")))
    assert output == sorted(output), output
    assert output[-1] > output[0] > 0, output
    assert output[-1] <= len(result.stdout.encode())


# removed from outside ------------------------------------------------------------------------------------------
def test_a_sandbox_removed_during_a_run_is_reported_as_removed_not_as_a_limit(
    runtime_factory: RuntimeFactory, containment_policy: Policy, worker: ThreadPoolExecutor
) -> None:
    runtime = _checked_runtime(runtime_factory, containment_policy)
    conversation = runtime.conversation(f"removed-{uuid.uuid4().hex[:8]}")
    future, _folder = _start_long_run(worker, runtime, conversation, None)
    container = _container(runtime, conversation)

    runtime.manager.backend.remove(container)  # as `sandbox-runtime gc` or `docker rm -f` would
    result = future.result(timeout=30)

    assert (result.status, result.is_error) == ("error", True), (result.status, result.message)
    assert result.message.startswith("The sandbox was removed while the script ran"), result.message
    assert "next call starts a fresh sandbox" in result.message
    assert "resource limit" not in result.message
    assert "memory" not in result.message
    assert "run-marker: under way" in result.stdout
    _assert_next_run_starts_at_once(conversation)
    assert conversation.sandbox().container_id != container
