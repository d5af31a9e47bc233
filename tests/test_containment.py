"""Containment, tried from inside a real sandbox: the "Escape" and "Resources" rows of SECURITY.md's catalogue.

Every test runs hostile code through ``run_python`` in its own conversation, has the code print one JSON line
describing what it observed, and asserts on that observation (and on the run's status). Every test runs on each
backend (``subject``: Docker under runc and runsc, Podman, and the fake), and is left out only for a backend that
declares the protection it tries in its ``not_enforced`` (the fake declares network, identity, filesystem,
resources and processes; what it keeps, such as output caps and time limits, it is held to here too). Where the
two kernels legitimately differ, the difference is stated at the assertion (under gVisor a fork bomb or an
out-of-memory kill can end the whole sandbox; the run is then classified and the next run gets a fresh sandbox).
Where the runtime's fail-closed self-check refuses runsc on this host, the runsc tests are skipped, and fail under
CI.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime.api.runtime import Conversation, Runtime
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.profile import exec_environment
from sandbox_runtime.tools.run_python import RunPythonResult
from tests.conftest import Subject, self_checked

SIGABRT_EXIT = 128 + 6


# helpers -----------------------------------------------------------------------------------------------------
def _is_gvisor(policy: Policy) -> bool:
    return policy.sandbox.runtime == "runsc"


def _runtime(subject: Subject) -> Runtime:
    """A runtime whose fail-closed self-check passed."""
    return self_checked(subject.make())


def _conversation(subject: Subject, name: str) -> Conversation:
    return _runtime(subject).conversation(f"{name}-{uuid.uuid4().hex[:8]}")


def _run(conversation: Conversation, code: str, **kwargs: Any) -> RunPythonResult:
    return conversation.run_python(textwrap.dedent(code), **kwargs)


def _observed(result: RunPythonResult) -> dict[str, Any]:
    """The JSON object the sandboxed code printed on its last stdout line."""
    lines = result.stdout.strip().splitlines()
    assert lines, f"the sandbox printed nothing: {result.status} {result.exit_code} {result.stderr[-2000:]}"
    observed = json.loads(lines[-1])
    assert isinstance(observed, dict)
    return observed


def _ok_json(conversation: Conversation, code: str, **kwargs: Any) -> dict[str, Any]:
    result = _run(conversation, code, **kwargs)
    assert result.status == "ok", (result.status, result.exit_code, result.stderr[-2000:])
    return _observed(result)


def _assert_next_run_ok(conversation: Conversation) -> None:
    result = conversation.run_python("print(1)", timeout_s=30)
    assert (result.status, result.stdout) == ("ok", "1\n"), (result.status, result.stderr[-2000:])


# Escape ------------------------------------------------------------------------------------------------------
def test_code_cannot_create_a_user_namespace(subject: Subject) -> None:
    subject.enforces("identity")
    conversation = _conversation(subject, "userns")
    seen = _ok_json(
        conversation,
        """
        import ctypes, json
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.unshare(0x10000000)  # CLONE_NEWUSER
        print(json.dumps({"rc": rc, "errno": ctypes.get_errno()}))
        """,
    )
    assert seen["rc"] == -1, seen
    if _is_gvisor(subject.policy):
        assert seen["errno"] != 0, seen  # gVisor's own kernel decides the errno; refused is what matters
    else:
        assert seen["errno"] == errno.EPERM, seen


def test_code_is_refused_mount_keyctl_bpf_setns_and_ptrace_of_pid_1(subject: Subject) -> None:
    subject.enforces("identity")
    conversation = _conversation(subject, "syscalls")
    seen = _ok_json(
        conversation,
        """
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        L = ctypes.c_long
        def call(nr, *args):
            ctypes.set_errno(0)
            rc = libc.syscall(L(nr), *args)
            return {"rc": rc, "errno": ctypes.get_errno()}
        ns_fd = -1
        for path in ("/proc/1/ns/net", "/proc/self/ns/net"):
            try:
                ns_fd = os.open(path, os.O_RDONLY)
                break
            except OSError:
                continue
        bpf_attr = ctypes.create_string_buffer(128)
        out = {
            "mount": call(165, ctypes.c_char_p(b"none"), ctypes.c_char_p(b"/tmp"), ctypes.c_char_p(b"tmpfs"),
                          L(0), ctypes.c_void_p(None)),
            "keyctl": call(250, L(0), L(-3), L(1)),  # KEYCTL_GET_KEYRING_ID of the session keyring, create
            "bpf": call(321, L(0), bpf_attr, L(128)),  # BPF_MAP_CREATE
            "setns": call(308, L(ns_fd), L(0)),
            "ptrace": call(101, L(16), L(1), L(0), L(0)),  # PTRACE_ATTACH to pid 1
        }
        print(json.dumps(out))
        """,
    )
    assert set(seen) == {"mount", "keyctl", "bpf", "setns", "ptrace"}
    for name, outcome in seen.items():
        assert outcome["rc"] == -1, (name, outcome)
        assert outcome["errno"] != 0, (name, outcome)


def test_code_runs_with_no_capabilities_no_new_privileges_and_seccomp(subject: Subject) -> None:
    subject.enforces("identity")
    conversation = _conversation(subject, "status")
    seen = _ok_json(
        conversation,
        """
        import json
        fields = {}
        with open("/proc/self/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        print(json.dumps(fields))
        """,
    )
    for cap in ("CapEff", "CapPrm", "CapBnd"):
        assert int(seen[cap], 16) == 0, (cap, seen[cap])
    assert int(seen.get("CapAmb", "0"), 16) == 0, seen  # gVisor's kernel reports no ambient set
    assert seen["Uid"].split()[0] == str(subject.policy.sandbox.uid), seen["Uid"]
    assert seen["Seccomp"] == "2", seen  # the runner installs its own filter; Docker's applies too under runc
    if not _is_gvisor(subject.policy):
        # Meaningless under gVisor: its /proc/self/status describes gVisor's own kernel, which has no NoNewPrivs
        # field (no-new-privileges is still set on the container; the self-check verifies that on the host)
        assert seen["NoNewPrivs"] == "1", seen


def test_code_cannot_write_the_root_filesystem_etc_or_proc_sys(subject: Subject) -> None:
    subject.enforces("filesystem")
    conversation = _conversation(subject, "rofs")
    seen = _ok_json(
        conversation,
        """
        import json, os
        def attempt(path, flags):
            try:
                fd = os.open(path, flags, 0o644)
            except OSError as exc:
                return exc.errno
            try:
                os.write(fd, b"sandbox\\n")
            except OSError as exc:
                return exc.errno
            finally:
                os.close(fd)
            return 0
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        print(json.dumps({
            "/escape-probe": attempt("/escape-probe", create),
            "/etc/escape-probe": attempt("/etc/escape-probe", create),
            "/etc/passwd": attempt("/etc/passwd", os.O_WRONLY | os.O_APPEND),
            "/proc/sys/kernel/hostname": attempt("/proc/sys/kernel/hostname", os.O_WRONLY | os.O_TRUNC),
        }))
        """,
    )
    refused = {errno.EROFS, errno.EACCES, errno.EPERM}
    assert len(seen) == 4
    for path, err in seen.items():
        assert err in refused, (path, errno.errorcode.get(err, err))


def test_code_sees_only_the_allow_listed_environment_and_no_host_secret(
    subject: Subject, monkeypatch: pytest.MonkeyPatch
) -> None:
    subject.enforces("identity")
    secret_name = f"SANDBOX_TEST_HOST_SECRET_{uuid.uuid4().hex[:8].upper()}"
    secret_value = f"host-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv(secret_name, secret_value)
    conversation = _conversation(subject, "env")
    seen = _ok_json(
        conversation,
        """
        import json, os
        environs = {}
        for pid in [name for name in os.listdir("/proc") if name.isdigit()]:
            try:
                with open(f"/proc/{pid}/environ", "rb") as handle:
                    environs[pid] = handle.read().decode("utf-8", "replace")
            except OSError as exc:
                environs[pid] = exc.errno
        print(json.dumps({"env": dict(os.environ), "environs": environs}))
        """,
    )
    # Docker itself adds HOSTNAME (the container's fixed hostname, "sandbox", not the host's) to every exec
    env = dict(seen["env"])
    assert env.pop("HOSTNAME", "sandbox") == "sandbox", seen["env"]
    assert env == exec_environment(subject.policy), seen["env"]
    assert socket.gethostname() not in env.values()
    assert "1" in seen["environs"], seen["environs"]
    for pid, environ in seen["environs"].items():
        if isinstance(environ, int):
            continue  # not readable: nothing leaks through it
        assert secret_name not in environ, pid
        assert secret_value not in environ, pid
    allowed = exec_environment(subject.policy)
    readable = [environ for environ in seen["environs"].values() if isinstance(environ, str)]
    leaked = [
        key
        for key, value in os.environ.items()
        if allowed.get(key) != value
        and (seen["env"].get(key) == value or any(f"\0{key}={value}\0" in "\0" + environ for environ in readable))
    ]
    assert leaked == [], leaked  # no variable of the test process, with its value, is seen inside


def test_code_sees_only_the_loopback_interface(subject: Subject) -> None:
    subject.enforces("network")
    conversation = _conversation(subject, "netif")
    seen = _ok_json(
        conversation,
        """
        import json, os, socket
        print(json.dumps({"sys": sorted(os.listdir("/sys/class/net")),
                          "if_nameindex": sorted(name for _, name in socket.if_nameindex())}))
        """,
    )
    assert seen["sys"] == ["lo"], seen
    assert seen["if_nameindex"] == ["lo"], seen


def test_code_cannot_connect_to_a_listener_on_the_host_loopback(subject: Subject, host_listener: socket.socket) -> None:
    subject.enforces("network")
    port = host_listener.getsockname()[1]
    conversation = _conversation(subject, "hostlo")
    seen = _ok_json(
        conversation,
        """
        import json, socket, sys
        port = int(sys.argv[1])
        outcomes = {}
        for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            try:
                with socket.socket(family, socket.SOCK_STREAM) as sock:
                    sock.settimeout(3)
                    sock.connect((address, port))
                    sock.sendall(b"escaped")
                outcomes[address] = "connected"
            except OSError as exc:
                outcomes[address] = exc.errno if exc.errno is not None else repr(exc)
        print(json.dumps(outcomes))
        """,
        args=[str(port)],
        timeout_s=30,
    )
    assert seen["127.0.0.1"] != "connected", seen
    assert seen["::1"] != "connected", seen
    with pytest.raises(BlockingIOError):
        host_listener.accept()


# Resources ---------------------------------------------------------------------------------------------------
def test_fork_bomb_meets_the_pids_limit_and_the_next_run_works(subject: Subject) -> None:
    subject.enforces("resources")
    pids_max = subject.policy.sandbox.limits.pids_max
    timeout_s = 5.0
    conversation = _conversation(subject, "forkbomb")
    result = _run(
        conversation,
        """
        import json, os, sys, time
        forked, error = 0, None
        for _ in range(int(sys.argv[1])):
            try:
                pid = os.fork()
            except OSError as exc:
                error = {"type": type(exc).__name__, "errno": exc.errno}
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            forked += 1
        print(json.dumps({"forked": forked, "error": error}), flush=True)
        """,
        args=[str(pids_max * 4)],
        timeout_s=timeout_s,
    )
    # the run ends by itself (or by the runner at its limit), never only by the host's backstop
    assert result.duration_s < timeout_s + subject.policy.run.kill_grace_s + 5, result
    assert result.status in {"ok", "error", "timeout", "memory_limit"}, result
    if result.stdout.strip():
        seen = _observed(result)
        assert seen["error"] == {"type": "BlockingIOError", "errno": errno.EAGAIN}, seen
        assert 0 < seen["forked"] < pids_max, seen
    else:
        # gVisor may end the whole sandbox at the limit instead of returning EAGAIN; the host is unaffected
        # and the conversation must carry on (the next run below)
        assert _is_gvisor(subject.policy), (result.status, result.exit_code, result.stderr[-2000:])
    _assert_next_run_ok(conversation)


def test_allocating_10_gb_ends_the_run_with_memory_limit(subject: Subject) -> None:
    subject.enforces("resources")
    conversation = _conversation(subject, "oom")
    result = _run(
        conversation,
        """
        chunks = []
        for _ in range(10 * 1024 // 64):  # 10 GB in 64 MiB pieces, every page written
            chunks.append(b"\\x01" * (64 * 1024 * 1024))
        print("allocated", len(chunks))
        """,
        timeout_s=3,  # 512 MiB are filled well within this; a kill by the clock would be a wrong status
    )
    assert result.status == "memory_limit", (result.status, result.exit_code, result.stderr[-2000:])
    assert "allocated" not in result.stdout
    _assert_next_run_ok(conversation)


def test_a_child_killed_for_memory_is_reported_even_when_the_parent_exits_0(subject: Subject) -> None:
    subject.enforces("resources")
    conversation = _conversation(subject, "childoom")
    result = _run(
        conversation,
        """
        import json, subprocess, sys
        hog = "chunks = [b'\\\\x01' * (64 * 1024 * 1024) for _ in range(10 * 1024 // 64)]"
        child = subprocess.run([sys.executable, "-c", hog], check=False)
        print(json.dumps({"child_returncode": child.returncode}))
        """,
        timeout_s=3,
    )
    assert result.status == "memory_limit", (result.status, result.exit_code, result.stderr[-2000:])
    # under gVisor an OOM may end the whole sandbox, parent included: then the status is what must still hold
    if result.stdout.strip() or not _is_gvisor(subject.policy):
        assert _observed(result) == {"child_returncode": -9}  # SIGKILL from the OOM killer
        assert result.exit_code == 0, result
    _assert_next_run_ok(conversation)


def test_filling_tmp_fails_with_enospc_at_the_tmpfs_size(subject: Subject) -> None:
    subject.enforces("resources")
    tmpfs_bytes = subject.policy.sandbox.limits.tmpfs_bytes
    conversation = _conversation(subject, "tmpfull")
    seen = _ok_json(
        conversation,
        """
        import json, os, sys
        bound = int(sys.argv[1])
        written, err = 0, None
        chunk = b"\\x01" * (1024 * 1024)
        with open("/tmp/fill", "wb", buffering=0) as handle:
            while written <= bound:
                try:
                    written += handle.write(chunk)
                except OSError as exc:
                    err = exc.errno
                    break
        os.remove("/tmp/fill")
        print(json.dumps({"errno": err, "written": written}))
        """,
        args=[str(4 * tmpfs_bytes)],
        timeout_s=60,
    )
    assert seen["errno"] == errno.ENOSPC, seen
    assert 0 < seen["written"] <= tmpfs_bytes, seen


def test_printing_forever_ends_with_output_limit_and_capped_stdout(subject: Subject) -> None:
    conversation = _conversation(subject, "flood")
    result = _run(
        conversation,
        """
        while True:
            print("flood " * 20)
        """,
        timeout_s=60,
    )
    cap = subject.policy.run.stdout_max_bytes
    assert result.status == "output_limit", (result.status, result.exit_code, result.stderr[-2000:])
    assert 0 < len(result.stdout.encode()) <= cap
    assert cap < result.stdout_bytes <= cap + 1, result.stdout_bytes  # the runner relays cap + 1, then kills
    assert result.output_path is not None
    saved = conversation.folders.results / Path(result.output_path).relative_to(
        subject.policy.sandbox.results_mount_path
    )
    assert 0 < saved.stat().st_size <= cap
    assert result.stdout.startswith("flood ")
    _assert_next_run_ok(conversation)


def test_a_busy_loop_ignoring_sigterm_is_killed_at_the_timeout(subject: Subject) -> None:
    conversation = _conversation(subject, "busy")
    timeout_s = 2.0
    result = _run(
        conversation,
        """
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("spinning", flush=True)
        while True:
            pass
        """,
        timeout_s=timeout_s,
    )
    assert result.status == "timeout", (result.status, result.exit_code, result.stderr[-2000:])
    assert result.stdout == "spinning\n"
    assert timeout_s <= result.duration_s < timeout_s + subject.policy.run.kill_grace_s + 5, result.duration_s
    _assert_next_run_ok(conversation)


def test_sleeping_forever_is_killed_at_the_timeout(subject: Subject) -> None:
    conversation = _conversation(subject, "sleeper")
    timeout_s = 1.0
    result = _run(
        conversation,
        """
        import time
        time.sleep(10**6)
        """,
        timeout_s=timeout_s,
    )
    assert result.status == "timeout", (result.status, result.exit_code, result.stderr[-2000:])
    assert timeout_s <= result.duration_s < timeout_s + subject.policy.run.kill_grace_s + 5, result.duration_s


def test_opening_10000_files_fails_with_emfile(subject: Subject) -> None:
    subject.enforces("resources")
    conversation = _conversation(subject, "fds")
    seen = _ok_json(
        conversation,
        """
        import json, os, resource
        fds, err = [], None
        for _ in range(10_000):
            try:
                fds.append(os.open("/dev/null", os.O_RDONLY))
            except OSError as exc:
                err = exc.errno
                break
        for fd in fds:
            os.close(fd)
        print(json.dumps({"errno": err, "opened": len(fds),
                          "limit": list(resource.getrlimit(resource.RLIMIT_NOFILE))}))
        """,
        timeout_s=60,
    )
    limit = subject.policy.sandbox.limits.open_files_max
    assert seen["errno"] == errno.EMFILE, seen
    assert seen["limit"] == [limit, limit], seen
    assert seen["opened"] < limit, seen


def _host_processes_with(marker: str) -> list[int]:
    """Host pids whose command line holds ``marker`` (runc's processes are host processes)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(name))
    return found


def test_a_double_forked_daemon_is_gone_when_the_run_ends(subject: Subject) -> None:
    subject.enforces("processes")
    token = uuid.uuid4().hex  # the runner's and the script's own command lines hold only the bare token
    marker = f"daemon-marker-{token}"
    conversation = _conversation(subject, "daemon")
    started = _ok_json(
        conversation,
        """
        import json, os, sys, time
        marker = "daemon-marker-" + sys.argv[1]
        def daemons():
            found = []
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        with open(f"/proc/{name}/cmdline", "rb") as handle:
                            if marker.encode() in handle.read():
                                found.append(int(name))
                    except OSError:
                        pass
            return found
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(10**6)", marker])
            os._exit(0)
        os.wait()
        deadline = time.monotonic() + 10
        while not daemons() and time.monotonic() < deadline:
            time.sleep(0.05)
        print(json.dumps({"daemons": daemons()}))
        """,
        args=[token],
        timeout_s=30,
    )
    assert len(started["daemons"]) == 1, "the daemon never started, so the test would prove nothing"
    if not _is_gvisor(subject.policy):
        # under runc the sandbox's processes are host processes: the daemon must already be gone, before the
        # next run's own clean-up could hide a miss (under gVisor they live inside the sentry, out of sight)
        assert _host_processes_with(marker) == []
    listing = _ok_json(
        conversation,
        """
        import json, os
        processes = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    cmdline = handle.read().replace(b"\\0", b" ").decode("utf-8", "replace").strip()
                with open(f"/proc/{name}/status") as handle:
                    fields = dict(line.split(":", 1) for line in handle if ":" in line)
            except OSError:
                continue
            processes.append({"pid": int(name), "uid": int(fields["Uid"].split()[0]),
                              "state": fields["State"].split()[0], "cmdline": cmdline})
        print(json.dumps({"me": os.getpid(), "processes": processes}))
        """,
        timeout_s=30,
    )
    code_uid = subject.policy.sandbox.uid
    alive = [p for p in listing["processes"] if p["state"] not in {"Z", "X"}]
    assert not [p for p in alive if marker in p["cmdline"]], alive
    code_processes = [p for p in alive if p["uid"] == code_uid]
    # the run is a fork of the sandbox's resident executor, and shares its command line
    runner = [p for p in code_processes if "/opt/sandbox/executor.py" in p["cmdline"] and p["pid"] != listing["me"]]
    assert len(runner) == 1, code_processes
    assert {p["pid"] for p in code_processes} == {listing["me"], runner[0]["pid"]}, code_processes
    others = [p for p in alive if p["uid"] != code_uid]
    assert len(others) <= 2, others  # init (pid 1) and the keeper, both under another uid
    assert 1 in {p["pid"] for p in others}, others


def test_abort_leaves_no_core_file(subject: Subject) -> None:
    subject.enforces("resources")
    conversation = _conversation(subject, "abort")
    seen = _ok_json(
        conversation,
        """
        import json, resource
        print(json.dumps({"core": list(resource.getrlimit(resource.RLIMIT_CORE))}))
        """,
    )
    assert seen["core"] == [0, 0], seen
    result = _run(
        conversation,
        """
        import os
        print("aborting", flush=True)
        os.abort()
        """,
        timeout_s=30,
    )
    assert result.status == "error", (result.status, result.exit_code, result.stderr[-2000:])
    assert result.exit_code == SIGABRT_EXIT or "SIGABRT" in result.message or "abort" in result.message.lower()
    listing = _ok_json(
        conversation,
        """
        import json, os
        names = []
        for top in (os.getcwd(), os.environ["SANDBOX_RESULTS"], "/tmp"):
            for folder, _, files in os.walk(top):
                names += [os.path.join(folder, name) for name in files]
        print(json.dumps({"files": names}))
        """,
    )
    assert not [name for name in listing["files"] if os.path.basename(name).startswith("core")], listing
    results = conversation.folders.results
    on_host = [path for path in results.rglob("*") if path.name.startswith("core")]
    assert on_host == []


def test_two_conversations_cannot_see_each_others_results(subject: Subject) -> None:
    subject.enforces("filesystem")
    runtime = _runtime(subject)
    suffix = uuid.uuid4().hex[:8]
    first, second = runtime.conversation(f"alice-{suffix}"), runtime.conversation(f"bob-{suffix}")
    marker = f"private-{uuid.uuid4().hex}"
    written = _ok_json(
        first,
        """
        import json, os, sys
        path = os.path.join(os.environ["SANDBOX_RESULTS"], sys.argv[1] + ".txt")
        with open(path, "w") as handle:
            handle.write(sys.argv[1])
        print(json.dumps({"path": path}))
        """,
        args=[marker],
    )
    host_file = first.folders.results / f"{marker}.txt"
    assert host_file.read_text() == marker
    seen = _ok_json(
        second,
        """
        import json, os, sys
        found = []
        for top in (os.environ["SANDBOX_RESULTS"], "/tmp", "/mnt"):
            for folder, dirs, files in os.walk(top):
                found += [os.path.join(folder, name) for name in dirs + files]
        print(json.dumps({"found": found, "same_path_exists": os.path.exists(sys.argv[2]),
                          "host_path_exists": os.path.exists(sys.argv[3])}))
        """,
        args=[marker, written["path"], str(host_file)],
    )
    assert not [name for name in seen["found"] if marker in name], seen["found"]
    assert seen["same_path_exists"] is False
    assert seen["host_path_exists"] is False
    assert not list(second.folders.results.rglob(f"{marker}*"))
