"""Podman's facts: what its native ``info`` answer says, as our models (no engine client here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandbox_runtime.sandbox.backend import EngineInfo

__all__ = ["podman_engine_info"]


def podman_engine_info(info: Mapping[str, Any], *, api_version: str) -> EngineInfo:
    """The service's facts from its ``/libpod/info`` answer; ``api_version`` is the compatible API's version the
    client speaks. Only the service's default runtime is listed: it is the only one Podman 4.3's API starts a
    container under (see :mod:`~sandbox_runtime.sandbox.podman.backend`)."""
    host = info.get("host") or {}
    runtime = host.get("ociRuntime") or {}
    security = host.get("security") or {}
    default = str(runtime.get("name") or "runc")
    runtime_version = next(iter(str(runtime.get("version") or "").splitlines()), None)
    # the security options as Docker's /info names them (Podman's compatible /info says the same)
    options = [
        *(["name=apparmor"] if security.get("apparmorEnabled") else []),
        *(["name=seccomp,profile=default"] if security.get("seccompEnabled") else []),
        *(["name=selinux"] if security.get("selinuxEnabled") else []),
        *(["name=rootless"] if security.get("rootless") else []),
    ]
    return EngineInfo(
        product="Podman",
        engine_version=str((info.get("version") or {}).get("Version", "?")),
        api_version=api_version,
        kernel_version=str(host.get("kernel", "?")),
        operating_system=str((host.get("distribution") or {}).get("distribution", "?")),
        cgroup_version=str(host.get("cgroupVersion", "v1")).removeprefix("v"),
        cgroup_driver=str(host.get("cgroupManager", "?")),
        runtimes=(default,),
        default_runtime=default,
        runc_version=runtime_version if default == "runc" else None,
        runsc_version=runtime_version if default == "runsc" else None,
        security_options=tuple(options),
    )
