"""The resident executor, tried from inside real sandboxes under runc and gVisor: each run is a fresh fork of one
preloaded interpreter, nothing but files passes from a run to the next, and a run that kills, stops, signals or
writes into its executor costs the next run at most a fresh executor, whose status is still right.

The script's parent is the executor (``os.getppid()``), so a run can name it; a later run's parent shows whether
the executor is the same one.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from sandbox_runtime.api.runtime import Conversation, Runtime
from sandbox_runtime.sandbox import executors
from sandbox_runtime.sandbox.backend import RunRequest
from sandbox_runtime.sandbox.exec_stream import read_cgroup_file
from sandbox_runtime.sandbox.run_protocol import PYTHON, executor_command
from tests.conftest import Subject, self_checked
from tests.sandbox_processes import code_processes, run_processes
from tests.test_containment import _conversation, _run, _runtime

RuntimeFactory = Callable[..., Runtime]
# an idle sandbox with its executor and spare, the standard library loaded and no office library, in cgroup memory
# (measured: about 15 MiB under runc, 37 with all the office libraries; under gVisor the sentry's own memory counts
# too); a guard here, the benchmark (bench/bench_latency.py) measures it
IDLE_MEMORY_BUDGET_BYTES = {"runc": 32 * 1024 * 1024, "runsc": 256 * 1024 * 1024}
PRELOAD_WITHIN_S = 60.0  # an executor imports its modules while idle: about a second, 10 under gVisor
GONE_WITHIN_S = 10.0


def _observed(conversation: Conversation, code: str, **kwargs: Any) -> dict[str, Any]:
    result = _run(conversation, code, **kwargs)
    assert result.status == "ok", (result.status, result.exit_code, result.stderr[-2000:])
    observed = json.loads(result.stdout.strip().splitlines()[-1])
    assert isinstance(observed, dict)
    return observed


def _executor_pid(conversation: Conversation) -> int:
    return int(_observed(conversation, "import json, os; print(json.dumps({'executor': os.getppid()}))")["executor"])


def test_a_run_sees_no_global_module_or_environment_change_an_earlier_run_made(subject: Subject) -> None:
    conversation = _conversation(subject, "isolation")
    first = _observed(
        conversation,
        """
        import builtins, json, os, sys
        json.dumps.__globals__["dumps"] = None  # the preloaded module, changed in place
        builtins.left_behind = "by run 1"
        sys.modules["left_behind"] = sys
        sys.path.append("/tmp/left-behind")
        os.environ["LEFT_BEHIND"] = "1"
        os.chdir("/tmp")
        import wave  # not preloaded: imported by this run only
        print(json.JSONEncoder().encode({"executor": os.getppid()}))
        """,
    )
    second = _observed(
        conversation,
        """
        import builtins, json, os, sys
        print(json.dumps({
            "executor": os.getppid(),
            "json_dumps_works": json.dumps([1]) == "[1]",
            "builtin": hasattr(builtins, "left_behind"),
            "module": "left_behind" in sys.modules,
            "wave": "wave" in sys.modules,
            "path": "/tmp/left-behind" in sys.path,
            "env": "LEFT_BEHIND" in os.environ,
            "cwd": os.getcwd() == os.environ["SANDBOX_RESULTS"],  # the results folder, where every run starts
            "main": sys.modules["__main__"].__file__ == __file__,
        }))
        """,
    )
    assert second["executor"] == first["executor"], "both runs should come from the same executor"
    assert second == {
        "executor": first["executor"],
        "json_dumps_works": True,
        "builtin": False,
        "module": False,
        "wave": False,
        "path": False,
        "env": False,
        "cwd": True,
        "main": True,
    }


def _once_empty(listing: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The processes ``listing`` finds, once it finds none or ``GONE_WITHIN_S`` has passed (each listing is a
    command in the sandbox: the loop is paced by it)."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while (found := listing()) and time.monotonic() < deadline:
        pass
    return found


def _loaded(conversation: Conversation) -> dict[str, bool]:
    """Which modules a run finds imported as it starts (a run is a fork of its executor)."""
    code = "import json, sys; print(json.dumps({m: m in sys.modules for m in ('zipfile', 'openpyxl', 'docx')}))"
    return {name: bool(value) for name, value in _observed(conversation, code).items()}


def _until_loaded(conversation: Conversation, module: str) -> dict[str, bool]:
    """Runs until one finds ``module`` imported as it starts (bounded: the executor loads one module a round at
    least, while no request waits)."""
    deadline = time.monotonic() + PRELOAD_WITHIN_S
    while not (seen := _loaded(conversation))[module]:
        assert time.monotonic() < deadline, f"the executor never loaded {module}: {seen}"
    return seen


def _until_settled(conversation: Conversation) -> None:
    """Runs until one was forked from an executor that has loaded all it loads and frozen its heap (it swaps its
    spare then, once); bounded."""
    deadline = time.monotonic() + PRELOAD_WITHIN_S
    code = "import gc, json; print(json.dumps({'frozen': gc.get_freeze_count() > 0}))"
    while not _observed(conversation, code)["frozen"]:
        assert time.monotonic() < deadline, "the executor never finished loading"


def test_an_office_library_is_loaded_once_a_run_used_it_and_by_the_sandboxs_next_executor_too(subject: Subject) -> None:
    conversation = _conversation(subject, "preload")
    assert _until_loaded(conversation, "zipfile") == {"zipfile": True, "openpyxl": False, "docx": False}
    workbook = _observed(
        conversation,
        """
        import json, openpyxl
        book = openpyxl.Workbook()
        book.active.append(["a", 1])
        book.save("preloaded.xlsx")
        print(json.dumps({"rows": openpyxl.load_workbook("preloaded.xlsx").active.max_row}))
        """,
    )
    assert workbook == {"rows": 1}
    assert _until_loaded(conversation, "openpyxl") == {"zipfile": True, "openpyxl": True, "docx": False}
    conversation.runtime.backend.drop_idle_executors(0.0)  # the next run starts a fresh executor
    assert _until_loaded(conversation, "openpyxl") == {"zipfile": True, "openpyxl": True, "docx": False}


def test_a_run_that_claims_libraries_it_never_used_gets_nothing_but_known_ones_loaded(subject: Subject) -> None:
    conversation = _conversation(subject, "claims")
    _until_loaded(conversation, "zipfile")
    claimed = _run(
        conversation,
        """
        import os, sys
        for fd in range(3, 64):  # every descriptor the run has: the pipe it says its libraries on among them
            try:
                os.write(fd, b"docx ../../etc os;rm " + b"x" * 5000 + b"\\n")
            except OSError:
                pass
        sys.modules["docx"] = sys  # and a module it never imported, by the name the executor knows
        """,
    )
    assert claimed.status == "ok", claimed.message
    seen = _until_loaded(conversation, "docx")  # a known name: at worst it costs the memory of loading it
    assert seen == {"zipfile": True, "openpyxl": False, "docx": True}
    assert _observed(conversation, "import json, docx; print(json.dumps({'real': hasattr(docx, 'Document')}))") == {
        "real": True
    }


def test_an_idle_sandbox_with_its_loaded_executor_stays_within_its_memory_budget(subject: Subject) -> None:
    subject.enforces("resources")  # the sandbox's memory, from its cgroup
    conversation = _conversation(subject, "memory")
    _until_loaded(conversation, "zipfile")
    used = read_cgroup_file(conversation.sandbox().container_id, "memory", "memory.usage_in_bytes", "memory.current")
    assert used is not None, "the sandbox's cgroup has no memory counter here"
    assert used.isdigit(), used
    assert int(used) <= IDLE_MEMORY_BUDGET_BYTES[subject.policy.sandbox.runtime], int(used)


def test_killing_the_executor_from_a_run_costs_the_next_run_only_a_fresh_start(subject: Subject) -> None:
    subject.enforces("processes")  # its daemon leaves the run's session
    conversation = _conversation(subject, "kill-executor")
    runtime = conversation.runtime
    before = _executor_pid(conversation)
    result = _run(
        conversation,
        """
        import os, signal, sys, time
        if os.fork() == 0:  # a daemon the run leaves behind, which the host must end
            os.setsid()
            if os.fork() == 0:
                time.sleep(10**6)
            os._exit(0)
        os.wait()
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(10**6)
        """,
        timeout_s=60,
    )
    assert result.status == "error", (result.status, result.message)
    assert result.exit_code == 137, result  # the executor's own end by SIGKILL: no verdict, so its code stands
    assert run_processes(runtime, conversation.id) == []  # the run and its daemon were ended with it
    after = _executor_pid(conversation)
    assert after != before


def test_signals_that_end_a_process_by_default_leave_the_executor_serving(subject: Subject) -> None:
    conversation = _conversation(subject, "signal-executor")
    before = _executor_pid(conversation)
    result = _run(
        conversation,
        """
        import os, signal
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGALRM):
            os.kill(os.getppid(), sig)
        print("sent")
        """,
    )
    assert (result.status, result.stdout) == ("ok", "sent\n"), (result.status, result.message)
    assert _executor_pid(conversation) == before


def test_stopping_the_executor_from_a_run_ends_at_the_hosts_deadline_and_the_next_run_is_right(
    subject: Subject,
) -> None:
    quick = subject.policy.changed(
        {"run": {"host_deadline_margin_s": 2.0, "kill_grace_s": 0.5}}, "the test: short waits"
    )
    conversation = self_checked(subject.make(quick)).conversation(f"stop-executor-{uuid.uuid4().hex[:8]}")
    before = _executor_pid(conversation)
    result = _run(conversation, "import os, signal; os.kill(os.getppid(), signal.SIGSTOP)", timeout_s=1)
    assert result.status == "timeout", (result.status, result.message)  # the host's own deadline ended it
    # the stopped executor was killed: its run's end is reaped at once
    assert _once_empty(lambda: run_processes(conversation.runtime, conversation.id)) == []
    assert _executor_pid(conversation) != before
    ok = conversation.run_python("raise SystemExit(3)")
    assert (ok.status, ok.exit_code) == ("error", 3)


def test_a_done_frame_a_run_writes_into_the_executors_stdout_is_not_believed(subject: Subject) -> None:
    subject.enforces("identity")  # the executor is out of the run's reach by its uid split
    conversation = _conversation(subject, "forge-done")
    before = _executor_pid(conversation)
    result = _run(
        conversation,
        """
        import os, struct
        payload = b"0" * 32 + b" exited 0 - - keep -"
        try:
            fd = os.open(f"/proc/{os.getppid()}/fd/1", os.O_WRONLY)
        except OSError as exc:
            print(exc.strerror)
        else:
            os.write(fd, b"S" + struct.pack(">I", 32) + b"0" * 32 + b"D" + struct.pack(">I", len(payload)) + payload)
            print("written")
        raise SystemExit(3)
        """,
    )
    if subject.policy.sandbox.runtime == "runc":
        # the executor is non-dumpable: its descriptors are closed to the run
        assert (result.status, result.exit_code, result.stdout) == ("error", 3, "Permission denied\n")
        assert _executor_pid(conversation) == before
    else:
        # gVisor lets a process open its parent's descriptors: the forged frames break the channel
        assert result.status == "error", (result.status, result.message)
        assert result.exit_code != 0
        assert _executor_pid(conversation) != before
    assert conversation.run_python("print('next')").stdout == "next\n"


def test_a_request_a_run_writes_into_the_executors_stdin_never_runs(subject: Subject) -> None:
    subject.enforces("identity")  # the executor is out of the run's reach by its uid split
    conversation = _conversation(subject, "forge-request")
    before = _executor_pid(conversation)
    marker = conversation.folders.results / "forged-request-ran"
    (conversation.folders.results / "forged.py").write_text("open('/mnt/results/forged-request-ran', 'w')\n")
    result = _run(
        conversation,
        """
        import json, os
        request = {"op": "run", "nonce": "f" * 32, "argv": ["/opt/venv/bin/python", "/mnt/results/forged.py"],
                   "cwd": True, "timeout_s": 10, "grace_s": 0, "caps": [1000, 1000]}
        try:
            fd = os.open(f"/proc/{os.getppid()}/fd/0", os.O_WRONLY)
            os.write(fd, json.dumps(request).encode() + b"\\n")
        except OSError as exc:
            print(exc.strerror)
        else:
            print("written")
        """,
    )
    assert result.status == "ok", (result.status, result.message)
    if subject.policy.sandbox.runtime == "runc":
        assert result.stdout == "Permission denied\n"  # the executor is non-dumpable
    if result.stdout == "written\n":
        assert _executor_pid(conversation) != before  # the executor saw foreign bytes on its stdin and ended
    else:
        # gVisor opens the descriptor but gives the pipe's read end: the write fails (EBADF)
        assert _executor_pid(conversation) == before
    assert conversation.run_python("print('next')").stdout == "next\n"
    assert not marker.exists()


def test_an_executor_that_says_nothing_at_its_start_is_ended_and_another_serves_the_run(
    subject: Subject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Podman's service can lose an exec's first output (containers/podman#25855), the executor's ready frame
    with it; played here by a first executor that sleeps without a word."""
    subject.enforces("identity")  # the code's processes are told apart by the sandbox's uid
    opened: list[tuple[str, ...]] = []

    def first_one_silent(request: RunRequest, libraries: tuple[str, ...]) -> tuple[str, ...]:
        command = executor_command(request, libraries)
        opened.append(command)
        return (PYTHON, "-I", "-S", "-c", "import time; time.sleep(600)") if len(opened) == 1 else command

    monkeypatch.setattr(executors, "executor_command", first_one_silent)
    quick = subject.policy.changed({"sandbox": {"executor_start_timeout_s": 5.0}}, "the test: a short start wait")
    conversation = self_checked(subject.make(quick)).conversation(f"silent-start-{uuid.uuid4().hex[:8]}")
    result = conversation.run_python("print('served')")
    assert (result.status, result.stdout) == ("ok", "served\n"), (result.status, result.message)
    assert len(opened) == 2
    left = code_processes(conversation.runtime, conversation.id)
    assert not [p for p in left if "sleep(600)" in p["cmdline"]], left  # the silent one was ended


def test_an_idle_executor_is_dropped_and_the_next_run_starts_a_fresh_one(subject: Subject) -> None:
    subject.enforces("identity")  # the code's processes are told apart by the sandbox's uid
    conversation = _conversation(subject, "idle-executor")
    runtime = conversation.runtime
    _until_settled(conversation)  # while it loads, the executor swaps its spare for one forked after the load
    before = _executor_pid(conversation)
    assert len(code_processes(runtime, conversation.id)) == 2  # the executor and its spare
    assert runtime.manager.backend.drop_idle_executors(0.0) >= 1
    assert _once_empty(lambda: code_processes(runtime, conversation.id)) == []
    assert _executor_pid(conversation) != before


def test_two_conversations_have_executors_of_their_own(subject: Subject) -> None:
    subject.enforces("filesystem")  # /tmp is the sandbox's own
    runtime = _runtime(subject)
    first = runtime.conversation(f"own-a-{uuid.uuid4().hex[:8]}")
    second = runtime.conversation(f"own-b-{uuid.uuid4().hex[:8]}")
    _run(first, "open('/tmp/mine', 'w').write('a')")
    seen = _observed(second, "import json, os; print(json.dumps({'tmp': os.path.exists('/tmp/mine')}))")
    assert seen == {"tmp": False}
