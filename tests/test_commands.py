"""Commands a host program runs in a conversation's sandbox (``Conversation.exec``), as a framework's shell and
file tools do: any program of the image, input streamed in, bytes out, every protection of a script's run kept.

Stories: an agent framework runs ``bash --login -c`` and gets the image's Python with its libraries; pipes a large
file through a command without the host holding it; reads exit codes as a shell gives them; and cannot use a
command to write outside the results folder and /tmp, reach the network, leave a process running, or pass the
output caps. Each runs on every backend (``subject``), left out only where a backend declares the protection.
"""

from __future__ import annotations

import hashlib
import io
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from sandbox_runtime.api.runtime import Conversation
from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.tools.command import CommandResult
from tests.conftest import Subject, self_checked

WAIT_S = 60.0
STREAMED_BYTES = 8 * 1024 * 1024


def _conversation(subject: Subject, name: str) -> Conversation:
    return self_checked(subject.make()).conversation(f"{name}-{uuid.uuid4().hex[:8]}")


def _ok(result: CommandResult) -> CommandResult:
    assert result.status == "ok", (result.status, result.exit_code, result.stderr[-2000:])
    return result


def test_a_command_gives_its_exit_code_and_output_as_bytes_as_a_shell_would(subject: Subject) -> None:
    conversation = _conversation(subject, "shell-codes")
    done = conversation.exec(["sh", "-c", "printf 'out\\377'; printf err >&2; exit 3"])
    assert (done.status, done.exit_code, done.stdout, done.stderr) == ("error", 3, b"out\xff", b"err")
    missing = conversation.exec(["no-such-program-here"])
    assert (missing.exit_code, missing.stderr) == (127, b"no-such-program-here: command not found\n")
    (conversation.folders.results / "plain.sh").write_text("echo never\n")  # no execute bit
    assert conversation.exec(["./plain.sh"]).exit_code == 126
    assert conversation.exec(["sh", "-c", "kill -TERM $$"]).exit_code == 128 + 15
    assert conversation.exec(["true"]).ok


def test_input_is_streamed_from_bytes_a_file_or_chunks_and_nothing_when_none_is_given(subject: Subject) -> None:
    conversation = _conversation(subject, "stdin")
    assert _ok(conversation.exec(["cat"], stdin=b"given")).stdout == b"given"
    assert _ok(conversation.exec(["cat"], stdin=io.BytesIO(b"from a file"))).stdout == b"from a file"
    chunks: Iterator[bytes] = (b"x" * 65536 for _ in range(STREAMED_BYTES // 65536))
    counted = _ok(conversation.exec(["sh", "-c", "wc -c"], stdin=chunks))
    assert int(counted.stdout) == STREAMED_BYTES
    assert _ok(conversation.exec(["cat"])).stdout == b""  # no input: the command reads its end at once
    # a command that stops reading early ends well, and the next one gets its own input
    head = _ok(conversation.exec(["head", "-c", "5"], stdin=(b"y" * 65536 for _ in range(64))))
    assert head.stdout == b"yyyyy"
    # input and output at once, both far larger than any buffer between the host and the command
    echoed = _ok(conversation.exec(["cat"], stdin=(bytes([i % 256]) * 65536 for i in range(64))))
    assert echoed.stdout == b"".join(bytes([i % 256]) * 65536 for i in range(64))
    digest = hashlib.sha256(b"after").hexdigest()
    assert _ok(conversation.exec(["sha256sum"], stdin=b"after")).stdout.split()[0].decode() == digest


def test_variables_and_the_working_directory_are_the_callers_and_bad_ones_are_typed_errors(subject: Subject) -> None:
    conversation = _conversation(subject, "env-cwd")
    # the results folder as the command sees it (the fake backend's is this host's own folder)
    results = (
        subject.policy.sandbox.results_mount_path if subject.backend.confines else str(conversation.folders.results)
    )
    seen = _ok(conversation.exec(["sh", "-c", 'echo "$GREETING:$(pwd)"'], env={"GREETING": "hello"}))
    assert seen.stdout.decode().strip() == f"hello:{results}"
    (conversation.folders.results / "sub").mkdir()
    assert _ok(conversation.exec(["pwd"], cwd="sub")).stdout.decode().strip() == f"{results}/sub"
    assert _ok(conversation.exec(["pwd"], cwd="/tmp")).stdout == b"/tmp\n"
    nowhere = conversation.exec(["pwd"], cwd="no/such/folder")
    assert nowhere.exit_code == 126
    assert b"no/such/folder" in nowhere.stderr
    with pytest.raises(InvalidToolArguments, match="not variable names"):
        conversation.exec(["true"], env={"1BAD": "x"})
    with pytest.raises(InvalidToolArguments, match="encode it"):
        conversation.exec(["cat"], stdin="text")  # type: ignore[arg-type]
    with pytest.raises(InvalidToolArguments, match="command_output_max_bytes"):
        conversation.exec(["true"], stdout_max_bytes=subject.policy.run.command_output_max_bytes + 1)
    with pytest.raises(InvalidToolArguments):
        conversation.exec([])


def test_a_command_is_ended_at_its_time_limit_and_at_its_output_cap(subject: Subject) -> None:
    conversation = _conversation(subject, "limits")
    slow = conversation.exec(["sleep", "30"], timeout_s=1)
    assert (slow.status, slow.exit_code) == ("timeout", None)
    loud = conversation.exec(["sh", "-c", "yes | head -c 3000000; echo done >&2"], stdout_max_bytes=1000)
    assert (loud.status, loud.truncated, loud.stdout) == ("output_limit", True, b"y\n" * 500)
    assert _ok(conversation.exec(["echo", "next"])).stdout == b"next\n"


def test_a_cancelled_command_ends_and_the_next_one_runs(subject: Subject) -> None:
    conversation = _conversation(subject, "cancel")
    control = CallControl()
    outcome: list[CommandResult] = []
    worker = threading.Thread(
        target=lambda: outcome.append(conversation.exec(["sh", "-c", "touch started; sleep 600"], control=control))
    )
    worker.start()
    deadline = time.monotonic() + WAIT_S
    while not (conversation.folders.results / "started").exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    control.cancel()
    worker.join(WAIT_S)
    assert not worker.is_alive()
    assert outcome[0].status == "cancelled"
    assert _ok(conversation.exec(["echo", "after"])).stdout == b"after\n"


def test_each_command_is_a_call_in_the_record_with_its_variables_names_only(subject: Subject) -> None:
    conversation = _conversation(subject, "record")
    conversation.exec(["sh", "-c", "exit 4"], env={"TOKEN": "secret-value"})
    (record,) = [call for call in conversation.calls() if call.tool == "exec"]
    assert record.status == "ok"  # the command exited: it did what was asked, whatever its code
    assert record.arguments is not None
    assert '"TOKEN"' in record.arguments
    assert "secret-value" not in record.arguments
    audited = [e for e in conversation.runtime.state.audit.entries() if e.call_id == record.call_id]
    assert [e.kind for e in audited] == ["call"]
    assert "secret-value" not in audited[0].detail


def test_a_login_shell_runs_the_images_python_with_its_libraries_and_ps_and_pkill_are_there(
    subject: Subject,
) -> None:
    subject.enforces("filesystem")  # the image's own files: the fake backend runs on this host's
    conversation = _conversation(subject, "login")
    script = b"import openpyxl, docx, pptx, sys; print(sys.executable)"
    for shell in (["bash", "--login", "-c", "python3 -"], ["sh", "-lc", "python3 -"]):
        assert _ok(conversation.exec(shell, stdin=script)).stdout == b"/opt/venv/bin/python3\n", shell
    # procps, as an agent's shell reaches for it: ps lists the sandbox's processes (none of the host's), pkill ends one
    shell_text = 'sleep 60 & ps -o pid= --ppid $$ | grep -qx " *$!" && echo listed; pkill -P $$; wait $!; echo ended $?'
    assert _ok(conversation.exec(["sh", "-c", shell_text])).stdout == b"listed\nended 143\n"
    names = _ok(conversation.exec(["ps", "-e", "-o", "comm="])).stdout.decode().split()
    assert "ps" in names
    assert "dockerd" not in names


# Containment ----------------------------------------------------------------------------------------------------
def test_a_command_writes_only_in_the_results_folder_and_tmp(subject: Subject) -> None:
    subject.enforces("filesystem")
    conversation = _conversation(subject, "writes")
    for path in ("/etc/escaped", "/opt/venv/escaped", "/usr/escaped", "/escaped"):
        tried = conversation.exec(["sh", "-c", f"echo x > {path}"])
        assert tried.exit_code != 0, path
    assert _ok(conversation.exec(["sh", "-c", "echo x > kept.txt && echo y > /tmp/scratch"])).ok
    assert (conversation.folders.results / "kept.txt").read_text() == "x\n"
    # /tmp holds no program: it is mounted noexec
    _ok(conversation.exec(["sh", "-c", "printf '#!/bin/sh\\necho ran\\n' > /tmp/tool && chmod +x /tmp/tool"]))
    assert conversation.exec(["/tmp/tool"]).exit_code == 126


def test_a_command_cannot_reach_a_listener_on_the_host(subject: Subject, host_listener: socket.socket) -> None:
    subject.enforces("network")
    conversation = _conversation(subject, "network")
    port = host_listener.getsockname()[1]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"
    tried = conversation.exec(["python3", "-c", code], timeout_s=30)
    assert tried.exit_code == 1, tried
    assert b"Error" in tried.stderr, tried
    with pytest.raises(BlockingIOError):
        host_listener.accept()


def test_no_process_of_a_command_outlives_it(subject: Subject) -> None:
    subject.enforces("processes")
    conversation = _conversation(subject, "outlive")
    started = _ok(conversation.exec(["sh", "-c", "nohup sleep 600 >/dev/null 2>&1 & setsid sleep 601 & echo $!"]))
    assert started.stdout.strip().isdigit()
    listing = _ok(conversation.exec(["python3", "-c", _LIST_SLEEPERS]))
    assert listing.stdout == b"[]\n"


_LIST_SLEEPERS = """
import os
found = []
for name in os.listdir('/proc'):
    if name.isdigit():
        try:
            found.append(open(f'/proc/{name}/cmdline', 'rb').read())
        except OSError:
            pass
print([c.decode() for c in found if c in (b'sleep\\x00600\\x00', b'sleep\\x00601\\x00')])
"""
