"""Podman's create body is the hardened spec, field for field (no engine needed): what Podman is told is what
Docker is told, and a field with no mapping is an error, never dropped."""

from __future__ import annotations

import pytest

from sandbox_runtime.policy import load_policy
from sandbox_runtime.sandbox.backend import ContainerSpec
from sandbox_runtime.sandbox.labels import LABEL_RUNTIME
from sandbox_runtime.sandbox.podman.spec import CPU_PERIOD_US, spec_generator
from sandbox_runtime.sandbox.profile import container_spec


def _spec(policy_name: str = "default") -> ContainerSpec:
    return container_spec(load_policy(policy_name), "executor:1", "/srv/results", {LABEL_RUNTIME: "1"})


def test_every_protection_of_the_spec_is_in_podmans_create_body() -> None:
    spec = _spec()
    body = spec_generator(spec)

    assert body["user"] == spec.user
    assert body["netns"] == {"nsmode": "none"}
    assert body["read_only_filesystem"] is True
    assert body["cap_drop"] == ["ALL"]
    assert body["no_new_privileges"] is True
    assert body["privileged"] is False
    assert body["init"] is True
    assert body["unsetenvall"] is True  # none of Podman's own variables (container, TERM)
    assert body["env"] == spec.environment
    assert body["labels"] == spec.labels
    limits = body["resource_limits"]
    assert limits["memory"] == {"limit": spec.memory_bytes, "swap": spec.memory_swap_bytes}
    assert limits["pids"] == {"limit": spec.pids_limit}
    assert limits["cpu"]["quota"] * 1_000_000_000 // CPU_PERIOD_US == spec.nano_cpus
    assert {r["type"]: r["hard"] for r in body["r_limits"]} == spec.ulimits
    assert "nproc" in spec.ulimits  # Podman would fill a missing one with a maximum no capability may take
    tmp, results = body["mounts"]
    assert tmp["destination"] == "/tmp"
    assert {"noexec", "nosuid", "nodev"} <= set(tmp["options"])
    assert results["source"] == "/srv/results"
    assert {"nosuid", "nodev", "rw"} <= set(results["options"])
    assert body["log_configuration"] == {"driver": "none"}


def test_a_security_option_with_no_mapping_is_refused_not_dropped() -> None:
    spec = _spec().model_copy(update={"security_opt": ("no-new-privileges", "apparmor=custom")})
    with pytest.raises(ValueError, match="apparmor=custom"):
        spec_generator(spec)
