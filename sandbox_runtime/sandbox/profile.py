"""The hardening profile: every protection and limit of a sandbox container, decided in one function.

Nothing here is optional or opt-in: identity (non-root, all capabilities dropped, no-new-privileges, default
seccomp), filesystem (read-only root, sized noexec /tmp, the results folder as the only bind mount), network
(``none``: only ``lo`` inside), resources (memory = memory+swap, CPU quota, pids, ulimits, init) and an
allow-listed environment. The code's processes run under ``uid``; the container's own command (the keeper that
holds it open) runs under a second non-root uid, so the code can neither signal it nor be mistaken for it.
"""

from __future__ import annotations

import hashlib
import json

from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import BindMount, ContainerSpec

__all__ = ["KEEPER_COMMAND", "code_user", "container_spec", "exec_environment", "keeper_uid", "sandbox_identity"]

KEEPER_COMMAND = ("sleep", "infinity")

_ENV_ALLOW_LIST = {
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PATH": "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONFAULTHANDLER": "1",
    "PYTHONIOENCODING": "utf-8:backslashreplace",
    "MPLCONFIGDIR": "/tmp",
}


def keeper_uid(policy: Policy) -> int:
    """The keeper's uid: the code's uid + 1 (both non-root, never equal)."""
    return policy.sandbox.uid + 1


def code_user(policy: Policy) -> str:
    """The ``uid:gid`` every exec runs as."""
    return f"{policy.sandbox.uid}:{policy.sandbox.gid}"


def exec_environment(policy: Policy) -> dict[str, str]:
    """The complete environment of code in the sandbox: an allow-list, nothing from the host."""
    return dict(_ENV_ALLOW_LIST, SANDBOX_RESULTS=policy.sandbox.results_mount_path)


def container_spec(policy: Policy, image: str, results_host_path: str, labels: dict[str, str]) -> ContainerSpec:
    """The one place where a sandbox container's protections and limits are decided."""
    limits = policy.sandbox.limits
    return ContainerSpec(
        image=image,
        command=KEEPER_COMMAND,
        user=f"{keeper_uid(policy)}:{policy.sandbox.gid}",
        labels=labels,
        runtime=policy.sandbox.runtime,
        network_mode="none",
        read_only_root=True,
        cap_drop=("ALL",),
        security_opt=("no-new-privileges",),
        init=True,
        tmpfs={"/tmp": f"rw,size={limits.tmpfs_bytes},mode=1777,noexec,nosuid,nodev"},
        mounts=(BindMount(host_path=results_host_path, container_path=policy.sandbox.results_mount_path),),
        memory_bytes=limits.memory_bytes,
        memory_swap_bytes=limits.memory_bytes,
        nano_cpus=int(limits.cpus * 1_000_000_000),
        pids_limit=limits.pids_max,
        ulimits={
            "nofile": limits.open_files_max,
            "nproc": limits.processes_per_uid_max,
            "fsize": limits.file_size_max_bytes,
            "core": 0,
            "cpu": limits.cpu_time_max_s,
        },
        environment=exec_environment(policy),
        working_dir=policy.sandbox.results_mount_path,
    )


def sandbox_identity(policy: Policy, image: str) -> str:
    """A short, stable hash of what shapes a sandbox: the container :func:`container_spec` makes from ``policy``
    and ``image`` (the image, its protections, limits, runtime, mounts and environment), less what differs per
    conversation (labels, the results folder's host path). Carried as the ``LABEL_POLICY`` label: a sandbox is used
    only by a runtime whose identity is the same. Settings that never reach the container (where a server listens,
    how it authenticates, where its state lives, its telemetry, the tools' and spill's rules) leave it unchanged, so
    replicas on other ports or hosts, and a restart on another port, share the conversations' sandboxes."""
    spec = container_spec(policy, image, "", {})
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
