"""What runs in a conversation's sandbox, seen from inside it by a command the code cannot reach.

Between runs the code's uid has two processes of the runtime's own: the sandbox's resident executor (named
``sr-executor``) and its spare (the fork that will be the next run: named as the executor from its fork, then
``sr-spare`` until it runs); :func:`run_processes` leaves them out.

The listing runs as ``nobody`` (65534), not as the code's uid: a cancel ends every process of the code's uid
with ``kill(-1)`` until none is left, and a listing under that uid could be ended by the very sweep it watches.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.sandbox.backend import ExecRequest
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION
from sandbox_runtime.sandbox.run_protocol import EXECUTOR, PYTHON

__all__ = ["code_processes", "run_processes", "sandbox_container"]

_LISTER_USER = "65534:65534"
EXECUTOR_NAME = "sr-executor"  # the resident executor's process name, and a spare's until it renames itself
SPARE_NAME = "sr-spare"  # the executor's idle spare, by its process name

# Lists the live processes of the uid given as argv[1], as JSON.
_LIST_CODE_PROCESSES = textwrap.dedent(
    """
    import json, os, sys
    uid, found = int(sys.argv[1]), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
            with open("/proc/" + name + "/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\\0", b" ").decode("utf-8", "replace").strip()
            with open("/proc/" + name + "/comm") as handle:
                comm = handle.read().strip()
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) == uid and fields["State"].split()[0] not in ("Z", "X"):
            found.append({"pid": int(name), "ppid": int(fields["PPid"]), "comm": comm, "cmdline": cmdline})
    print(json.dumps(found))
    """
)


_LISTING_ATTEMPTS = 3


def sandbox_container(runtime: Runtime, conversation_id: str) -> str:
    """The id of the conversation's one container."""
    labels = {**runtime.manager.base_labels, LABEL_CONVERSATION: conversation_id}
    (container,) = runtime.manager.backend.list_containers(labels)
    return container.id


def code_processes(runtime: Runtime, conversation_id: str) -> list[dict[str, Any]]:
    """The live processes of the code's uid in the conversation's sandbox (pid and command line each).

    The lister always prints a JSON list; an exec that ended well with no output at all lost it on the engine's
    attach stream (Podman's service does, now and then: containers/podman#25855), and is asked again."""
    for _attempt in range(_LISTING_ATTEMPTS):
        listing = runtime.manager.backend.exec(
            sandbox_container(runtime, conversation_id),
            ExecRequest(
                command=(PYTHON, "-I", "-S", "-c", _LIST_CODE_PROCESSES, str(runtime.policy.sandbox.uid)),
                user=_LISTER_USER,
                stdout_max_bytes=1024 * 1024,
                stderr_max_bytes=64 * 1024,
                deadline_s=30,
            ),
        )
        assert listing.exit_code == 0, (listing.exit_code, listing.stderr[-2000:])
        if listing.stdout:
            found = json.loads(listing.stdout)
            assert isinstance(found, list)
            return found
    raise AssertionError(f"the process listing printed nothing, {_LISTING_ATTEMPTS} times")


def run_processes(runtime: Runtime, conversation_id: str) -> list[dict[str, Any]]:
    """The live processes of the code's uid that are not the resident executor (its parent is not of the code's
    uid) or the executor's idle spare (its child, by name: a run renames itself ``python``): what runs or was left
    by runs."""
    found = code_processes(runtime, conversation_id)
    pids = {process["pid"] for process in found}
    executors = {p["pid"] for p in found if EXECUTOR in p["cmdline"] and p["ppid"] not in pids}
    spares = {p["pid"] for p in found if p["comm"] in (SPARE_NAME, EXECUTOR_NAME) and p["ppid"] in executors}
    return [p for p in found if p["pid"] not in executors | spares]
