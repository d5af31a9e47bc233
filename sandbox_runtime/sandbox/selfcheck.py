"""The fail-closed self-check: a canary container with the full profile reports, from inside, what holds.

``doctor`` shows the report; the runtime runs the same check before the first sandbox of a process and starts
no sandbox when any check fails. Each failed check says what is missing and how to fix it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.errors import SandboxError
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import ContainerSpec, EngineInfo, HostFacts, SandboxBackend
from sandbox_runtime.sandbox.profile import exec_environment
from sandbox_runtime.sandbox.run_protocol import PYTHON, SELFCHECK, run_by_exec, run_request

__all__ = ["Check", "SelfCheckReport", "evaluate_probe", "probe_sandbox", "run_self_check"]

logger = logging.getLogger(__name__)

_PROBE_DEADLINE_S = 60.0
_PROBE_OUTPUT_MAX_BYTES = 256 * 1024
_PROBE_ATTEMPTS = 2  # a probe whose output the engine lost is run again, once
_REQUIRED_IMPORTS = ("openpyxl", "docx", "pptx", "defusedxml")
_FORBIDDEN_IMPORTS = ("pip", "numpy", "pandas")


class Check(BaseModel):
    """One protection: what was expected, what the canary saw, and how to fix a miss."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    expected: str
    actual: str
    ok: bool
    fix: str = ""


class SelfCheckReport(BaseModel):
    """Every check, plus the facts doctor shows beside them. From a backend that does not confine (a test
    double) there are no checks: ``not_enforced`` names every protection it leaves out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str  # the engine sandboxes run on (the policy's ``sandbox.backend``)
    runtime: str
    image: str
    quota_mode: str
    engine: EngineInfo
    checks: tuple[Check, ...]
    not_enforced: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.ok]

    def summary(self) -> str:
        """One paragraph naming each failed check and its fix."""
        lines = [f"the sandbox self-check failed ({self.runtime}, {self.image}):"]
        lines += [f"  - {c.name}: expected {c.expected}, saw {c.actual}. Fix: {c.fix}" for c in self.failures()]
        return "\n".join(lines)


def _cap_is_empty(value: Any) -> bool:
    return isinstance(value, str) and value != "" and int(value, 16) == 0


def _mount_options(entry: Any) -> list[str]:
    return list(entry.get("options", [])) if isinstance(entry, dict) else []


def evaluate_probe(
    probe: dict[str, Any],
    policy: Policy,
    *,
    quota_mode: str,
    host: HostFacts,
    create_warnings: tuple[str, ...] = (),
) -> list[Check]:
    """Judge what the canary reported (and, under gVisor, what the host's cgroups say) against the policy.

    gVisor's user-space kernel does not show the host's cgroup limits, NoNewPrivs or mount flags inside; there
    the limits are read from the host's cgroup of the container and no-new-privileges from the engine.
    Pure: tested without a container too."""
    limits = policy.sandbox.limits
    gvisor = policy.sandbox.runtime == "runsc"
    checks: list[Check] = []

    def add(name: str, expected: str, actual: object, ok: bool, fix: str) -> None:
        checks.append(Check(name=name, expected=expected, actual=str(actual), ok=ok, fix="" if ok else fix))

    add(
        "capabilities",
        "CapEff/CapPrm/CapBnd all 0",
        f"{probe.get('cap_eff')}/{probe.get('cap_prm')}/{probe.get('cap_bnd')}",
        all(_cap_is_empty(probe.get(k)) for k in ("cap_eff", "cap_prm", "cap_bnd")),
        "the engine did not apply cap_drop=ALL; upgrade Docker or check for a plugin rewriting HostConfig",
    )
    if gvisor:
        add(
            "no-new-privileges",
            "set on the container (NoNewPrivs is not shown inside gVisor)",
            host.security_opt,
            "no-new-privileges" in (host.security_opt or ""),
            "the engine dropped security_opt no-new-privileges; upgrade Docker",
        )
    else:
        add(
            "no-new-privileges",
            "NoNewPrivs 1",
            probe.get("no_new_privs"),
            probe.get("no_new_privs") == "1",
            "the engine ignored security_opt no-new-privileges; upgrade Docker",
        )
    add(
        "seccomp",
        "Seccomp 2 (a filter: Docker's, and the runner's own)",
        probe.get("seccomp"),
        probe.get("seccomp") == "2",
        "rebuild the image (sandbox-runtime image build --force): the runner installs its own filter"
        if gvisor
        else "start dockerd with its default seccomp profile (no --seccomp-profile=unconfined)",
    )
    add(
        "user namespaces",
        "unshare(CLONE_NEWUSER) refused",
        probe.get("user_namespace"),
        probe.get("user_namespace") not in ("allowed", None),
        "the seccomp filter is missing; rebuild the image (sandbox-runtime image build --force)",
    )
    add(
        "non-root uid",
        f"uid/gid {policy.sandbox.uid}/{policy.sandbox.gid}",
        f"{probe.get('uid')}/{probe.get('gid')}",
        probe.get("uid") == policy.sandbox.uid
        and probe.get("gid") == policy.sandbox.gid
        and probe.get("euid") == policy.sandbox.uid
        and probe.get("uid") != 0,
        "set sandbox.uid/gid in the policy to a non-zero id; rootless engines may remap ids",
    )
    inside_or_host = {
        key: probe.get(key) if probe.get(key) is not None else getattr(host, key)
        for key in ("memory_limit_bytes", "memory_swap_limit_bytes", "pids_limit")
    }
    memory = inside_or_host["memory_limit_bytes"]
    add(
        "memory limit",
        f"{limits.memory_bytes} bytes",
        memory,
        memory == str(limits.memory_bytes),
        "the memory cgroup controller is missing: enable cgroup memory accounting (cgroup_enable=memory)",
    )
    swap = inside_or_host["memory_swap_limit_bytes"]
    swap_ok = swap in (str(limits.memory_bytes), "0")
    add(
        "no swap",
        f"memory+swap limit {limits.memory_bytes} bytes",
        swap,
        swap_ok,
        "swap accounting is off: boot with swapaccount=1 (cgroup v1) or use cgroup v2",
    )
    pids = inside_or_host["pids_limit"]
    add(
        "pids limit",
        str(limits.pids_max),
        pids,
        pids == str(limits.pids_max),
        "the pids cgroup controller is missing: enable it in the kernel / cgroup hierarchy",
    )
    root_options = _mount_options(probe.get("root_mount"))
    add(
        "read-only root",
        "/ mounted ro; writes to / and /etc refused",
        f"{','.join(root_options[:1])}; / {probe.get('root_write')}, /etc {probe.get('etc_write')}",
        "ro" in root_options and probe.get("root_write") != "written" and probe.get("etc_write") != "written",
        "the engine did not apply read_only=True; upgrade Docker",
    )
    tmp_options = _mount_options(probe.get("tmp_mount"))
    tmp_flags = ("noexec",) if gvisor else ("noexec", "nosuid", "nodev")  # gVisor's tmpfs lives in its sentry
    tmp_ok = probe.get("tmp_size_bytes") == limits.tmpfs_bytes and all(flag in tmp_options for flag in tmp_flags)
    add(
        "/tmp tmpfs",
        f"{limits.tmpfs_bytes} bytes, {','.join(tmp_flags)}",
        f"{probe.get('tmp_size_bytes')} bytes, {','.join(tmp_options)}",
        tmp_ok,
        "the engine did not apply the tmpfs options; upgrade Docker",
    )
    results_options = _mount_options(probe.get("results_mount"))
    flags_needed = quota_mode == "loop" and not gvisor  # under gVisor the host's loop mount carries them
    results_ok = probe.get("results_write") == "written" and (
        not flags_needed or all(flag in results_options for flag in ("nosuid", "nodev"))
    )
    add(
        "results folder",
        "writable" + (", nosuid,nodev" if flags_needed else ""),
        f"{probe.get('results_write')}, {','.join(results_options) or 'no separate mount'}",
        results_ok,
        "the results folder must be writable by the sandbox uid; check the state directory's owner",
    )
    interfaces = probe.get("interfaces")
    add(
        "network",
        "only lo",
        interfaces,
        interfaces == ["lo"],
        "sandboxes must use network_mode=none; a network plugin or engine setting overrides it",
    )
    add(
        "host loopback",
        "a listener on the host's 127.0.0.1 is unreachable",
        probe.get("loopback_host_listener"),
        probe.get("loopback_host_listener") not in ("connected", None),
        "the container shares the host's network namespace; never use network_mode=host",
    )
    allowed = set(exec_environment(policy)) | {"HOSTNAME"}
    extra_env = sorted(set(probe.get("env_keys") or []) - allowed)
    add(
        "environment",
        "only the allow-list",
        ", ".join(extra_env) or "allow-list only",
        not extra_env,
        "remove ENV lines from a custom image; the runtime passes only its allow-list",
    )
    missing = [m for m in _REQUIRED_IMPORTS if not probe.get(f"import_{m}")]
    present = [m for m in _FORBIDDEN_IMPORTS if probe.get(f"import_{m}")]
    add(
        "executor packages",
        "openpyxl, docx, pptx, defusedxml; no pip, numpy, pandas",
        f"missing {missing or 'none'}, unexpected {present or 'none'}",
        not missing and not present,
        "rebuild the image: sandbox-runtime image build --force",
    )
    add(
        "login shell",
        f"python3 is {PYTHON}3 in `sh -l` (as framework shell tools start it)",
        probe.get("login_shell_python"),
        probe.get("login_shell_python") == f"{PYTHON}3",
        "rebuild the image (sandbox-runtime image build --force): its /etc/profile.d keeps /opt/venv/bin first",
    )
    add(
        "engine warnings",
        "none",
        "; ".join(create_warnings) or "none",
        not create_warnings,
        "the engine could not apply a limit (e.g. swap limit unsupported): fix the host's cgroup setup",
    )
    return checks


@contextlib.contextmanager
def _loopback_listener() -> Iterator[int]:
    """A TCP listener on the host's 127.0.0.1 that the canary must not reach."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        yield int(listener.getsockname()[1])


def probe_sandbox(
    backend: SandboxBackend,
    policy: Policy,
    container_id: str,
    *,
    quota_mode: str,
    create_warnings: tuple[str, ...] = (),
) -> list[Check]:
    """Run the probe in a running sandbox (a canary, or a pod ``podman kube play`` started) and judge what it
    reports against the policy (:func:`evaluate_probe`)."""
    with _loopback_listener() as port:
        program = (PYTHON, "-I", SELFCHECK, policy.sandbox.results_mount_path, str(port))
        request = run_request(policy, _PROBE_DEADLINE_S, program).model_copy(
            update={"stdout_max_bytes": _PROBE_OUTPUT_MAX_BYTES, "stderr_max_bytes": _PROBE_OUTPUT_MAX_BYTES}
        )
        for _attempt in range(_PROBE_ATTEMPTS):
            result, verdict = run_by_exec(backend, container_id, request)
            if verdict is not None or result.stdout or result.stderr:
                break  # else the engine lost its output (Podman's service can: containers/podman#25855)
        host = backend.host_facts(container_id)
    if result.exit_code != 0:
        raise SandboxError(
            f"the self-check probe failed in sandbox {container_id[:12]} (exit code {result.exit_code}): "
            f"{result.stderr.decode(errors='replace')[-2000:]}"
        )
    try:
        probe = json.loads(result.stdout)
    except ValueError as error:
        said = result.stdout.decode(errors="replace")[-200:]
        raise SandboxError(
            f"the self-check probe in sandbox {container_id[:12]} did not report ({error}): {said!r}"
        ) from None
    return evaluate_probe(probe, policy, quota_mode=quota_mode, host=host, create_warnings=create_warnings)


def run_self_check(
    backend: SandboxBackend,
    policy: Policy,
    spec_for: Callable[[dict[str, str]], ContainerSpec],
    *,
    quota_mode: str,
    labels: dict[str, str],
) -> SelfCheckReport:
    """Start a canary from ``spec_for(labels)``, read its probe, remove it, and judge the result; a backend that
    does not confine is not probed (its report names what it leaves out)."""
    engine = backend.engine_info()
    spec = spec_for(labels)
    if not backend.confines:
        logger.warning("the %s confines nothing: %s", type(backend).__name__, "; ".join(backend.not_enforced))
        return SelfCheckReport(
            backend=backend.name,
            runtime=engine.default_runtime,
            image=spec.image,
            quota_mode=quota_mode,
            engine=engine,
            checks=(),
            not_enforced=backend.not_enforced,
        )
    info = backend.create_and_start(spec)
    try:
        checks = probe_sandbox(backend, policy, info.id, quota_mode=quota_mode, create_warnings=info.warnings)
    finally:
        backend.remove(info.id)
    logger.info("self-check: %d checks, %d failed", len(checks), sum(not c.ok for c in checks))
    return SelfCheckReport(
        backend=backend.name,
        runtime=policy.sandbox.runtime,
        image=spec.image,
        quota_mode=quota_mode,
        engine=engine,
        checks=tuple(checks),
    )
