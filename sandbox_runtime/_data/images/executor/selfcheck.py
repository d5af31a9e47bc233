"""In-sandbox probe for the host's self-check: reads back, from inside, what protects this container.

Prints one JSON object on stdout. It only reads and tries harmless writes; the host decides what passes.
Standard library only: this file runs inside the executor image.
"""

import errno
import json
import os
import socket
import subprocess
import sys


def _status_fields():
    fields = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _read_first(paths):
    for path in paths:
        try:
            with open(path) as handle:
                return handle.read().strip()
        except OSError:
            continue
    return None


def _try_write(path):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    os.close(fd)
    os.unlink(path)
    return "written"


def _mounts():
    found = {}
    with open("/proc/self/mounts") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) >= 4:
                found[parts[1]] = {"type": parts[2], "options": parts[3].split(",")}
    return found


def _interfaces():
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        with open("/proc/net/dev") as handle:
            return sorted(line.split(":")[0].strip() for line in handle.readlines()[2:])


def _loopback_connect(port):
    if port <= 0:
        return "not tried"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError as exc:
            return errno.errorcode.get(exc.errno or 0, str(exc))
    return "connected"


def _try_user_namespace():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER
        return "allowed"
    return errno.errorcode.get(ctypes.get_errno(), "refused")


def _login_shell_python():
    """What ``python3`` is in a login shell (``sh -l`` reads /etc/profile, which sets PATH anew)."""
    try:
        done = subprocess.run(
            ["/bin/sh", "-lc", "command -v python3"], capture_output=True, timeout=20, check=False, text=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return repr(exc)
    return done.stdout.strip() or done.stderr.strip()[-200:]


def main():
    results_path = sys.argv[1]
    host_port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    status = _status_fields()
    mounts = _mounts()
    tmp = os.statvfs("/tmp")
    report = {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "euid": os.geteuid(),
        "groups": os.getgroups(),
        "cap_eff": status.get("CapEff"),
        "cap_prm": status.get("CapPrm"),
        "cap_bnd": status.get("CapBnd"),
        "no_new_privs": status.get("NoNewPrivs"),
        "seccomp": status.get("Seccomp"),
        "memory_limit_bytes": _read_first(["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]),
        "memory_swap_limit_bytes": _read_first(
            ["/sys/fs/cgroup/memory.swap.max", "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"]
        ),
        "pids_limit": _read_first(["/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"]),
        "root_mount": mounts.get("/"),
        "root_write": _try_write("/sandbox-selfcheck"),
        "etc_write": _try_write("/etc/sandbox-selfcheck"),
        "tmp_mount": mounts.get("/tmp"),
        "tmp_size_bytes": tmp.f_blocks * tmp.f_frsize,
        "results_mount": mounts.get(results_path),
        "results_write": _try_write(os.path.join(results_path, ".selfcheck-%d" % os.getpid())),
        "interfaces": _interfaces(),
        "loopback_host_listener": _loopback_connect(host_port),
        "env_keys": sorted(os.environ),
        "python": sys.version.split()[0],
        "executable": sys.executable,
    }
    for module in ("openpyxl", "docx", "pptx", "defusedxml", "pip", "numpy", "pandas"):
        try:
            __import__(module)
        except ImportError:
            report["import_" + module] = False
        else:
            report["import_" + module] = True
    report["login_shell_python"] = _login_shell_python()
    report["user_namespace"] = _try_user_namespace()  # last: if it were allowed, it changes this process
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
