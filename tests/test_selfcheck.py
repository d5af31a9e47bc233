"""The self-check judges what a canary saw: every missing protection is named with its fix."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_runtime.policy import load_policy
from sandbox_runtime.sandbox.backend import HostFacts
from sandbox_runtime.sandbox.profile import exec_environment
from sandbox_runtime.sandbox.selfcheck import evaluate_probe

POLICY = load_policy("default")
LIMITS = POLICY.sandbox.limits


def healthy_probe() -> dict[str, Any]:
    return {
        "uid": 10001,
        "gid": 10001,
        "euid": 10001,
        "cap_eff": "0" * 16,
        "cap_prm": "0" * 16,
        "cap_bnd": "0" * 16,
        "no_new_privs": "1",
        "seccomp": "2",
        "memory_limit_bytes": str(LIMITS.memory_bytes),
        "memory_swap_limit_bytes": str(LIMITS.memory_bytes),
        "pids_limit": str(LIMITS.pids_max),
        "root_mount": {"type": "overlay", "options": ["ro"]},
        "root_write": "EROFS",
        "etc_write": "EROFS",
        "tmp_mount": {"type": "tmpfs", "options": ["rw", "nosuid", "nodev", "noexec"]},
        "tmp_size_bytes": LIMITS.tmpfs_bytes,
        "results_mount": {"type": "ext4", "options": ["rw", "nosuid", "nodev", "noexec"]},
        "results_write": "written",
        "interfaces": ["lo"],
        "loopback_host_listener": "ECONNREFUSED",
        "env_keys": sorted(exec_environment(POLICY)),
        "user_namespace": "EPERM",
        "login_shell_python": "/opt/venv/bin/python3",
        **{f"import_{m}": True for m in ("openpyxl", "docx", "pptx", "defusedxml")},
        **{f"import_{m}": False for m in ("pip", "numpy", "pandas")},
    }


def failed(probe: dict[str, Any], warnings: tuple[str, ...] = ()) -> dict[str, str]:
    checks = evaluate_probe(probe, POLICY, quota_mode="loop", host=HostFacts(), create_warnings=warnings)
    return {c.name: c.fix for c in checks if not c.ok}


def test_a_healthy_canary_passes_every_check() -> None:
    assert failed(healthy_probe()) == {}


@pytest.mark.parametrize(
    ("change", "check"),
    [
        ({"cap_eff": "00000000a80425fb"}, "capabilities"),
        ({"no_new_privs": "0"}, "no-new-privileges"),
        ({"seccomp": "0"}, "seccomp"),
        ({"uid": 0, "euid": 0}, "non-root uid"),
        ({"memory_limit_bytes": "9223372036854771712"}, "memory limit"),
        ({"memory_swap_limit_bytes": "9223372036854771712"}, "no swap"),
        ({"pids_limit": "max"}, "pids limit"),
        ({"root_write": "written"}, "read-only root"),
        ({"tmp_size_bytes": 12 * 1024**3}, "/tmp tmpfs"),
        ({"results_mount": {"type": "ext4", "options": ["rw"]}}, "results folder"),
        ({"interfaces": ["eth0", "lo"]}, "network"),
        ({"loopback_host_listener": "connected"}, "host loopback"),
        ({"env_keys": ["AWS_SECRET_ACCESS_KEY", "HOME"]}, "environment"),
        ({"import_pip": True}, "executor packages"),
        ({"login_shell_python": "/usr/bin/python3"}, "login shell"),
        ({"user_namespace": "allowed"}, "user namespaces"),
    ],
)
def test_each_missing_protection_fails_its_check_with_a_fix(change: dict[str, Any], check: str) -> None:
    fixes = failed(healthy_probe() | change)
    assert list(fixes) == [check]
    assert fixes[check]


def test_a_docker_warning_on_create_fails_closed() -> None:
    fixes = failed(healthy_probe(), warnings=("Your kernel does not support swap limit capabilities",))
    assert list(fixes) == ["engine warnings"]
