"""A :class:`~sandbox_runtime.sandbox.backend.ContainerSpec` as Podman's own container description (libpod's
``SpecGenerator``, the body of ``POST /libpod/containers/create``); no engine client here.

Podman's native create, not its Docker-compatible one, because only the native one can leave out what Podman adds
to every container on its own: the ``container`` and ``TERM`` variables (``unsetenvall``), so the code's
environment is exactly the runtime's allow-list, as on Docker. Every other field is the hardened profile, one for
one; a field this mapping does not carry is an error here, never dropped.
"""

from __future__ import annotations

from typing import Any

from sandbox_runtime.sandbox.backend import ContainerSpec

__all__ = ["CPU_PERIOD_US", "spec_generator"]

CPU_PERIOD_US = 100_000  # the CFS period the CPU quota is a share of (Docker's for nano_cpus)


def spec_generator(spec: ContainerSpec) -> dict[str, Any]:
    """Podman's create body for ``spec``: identity, filesystem, network, resources and labels."""
    if spec.network_mode != "none":  # the model allows nothing else; a change there must come through here
        raise ValueError(f"network mode {spec.network_mode!r} has no mapping (only 'none')")
    unmapped = set(spec.security_opt) - {"no-new-privileges"}
    if unmapped:
        raise ValueError(f"security options {sorted(unmapped)} have no mapping (only 'no-new-privileges')")
    mounts: list[dict[str, Any]] = [
        {"destination": path, "type": "tmpfs", "source": "tmpfs", "options": options.split(",")}
        for path, options in spec.tmpfs.items()
    ]
    mounts += [
        {
            "destination": mount.container_path,
            "type": "bind",
            "source": mount.host_path,
            "options": ["rbind", "ro" if mount.read_only else "rw", *mount.options],
        }
        for mount in spec.mounts
    ]
    return {
        "image": spec.image,
        "command": list(spec.command),
        "user": spec.user,
        "labels": dict(spec.labels),
        "env": dict(spec.environment),
        "unsetenvall": True,
        "work_dir": spec.working_dir,
        "hostname": "sandbox",
        "oci_runtime": spec.runtime,
        "netns": {"nsmode": spec.network_mode},
        "ipcns": {"nsmode": "private"},
        "read_only_filesystem": spec.read_only_root,
        "cap_drop": list(spec.cap_drop),
        "no_new_privileges": "no-new-privileges" in spec.security_opt,
        "privileged": False,
        "init": spec.init,
        "mounts": mounts,
        "resource_limits": {
            "memory": {"limit": spec.memory_bytes, "swap": spec.memory_swap_bytes},
            "cpu": {"quota": spec.nano_cpus * CPU_PERIOD_US // 1_000_000_000, "period": CPU_PERIOD_US},
            "pids": {"limit": spec.pids_limit},
        },
        "r_limits": [{"type": name, "soft": value, "hard": value} for name, value in spec.ulimits.items()],
        "log_configuration": {"driver": "none"},
        "stdin": False,
        "terminal": False,
    }
