"""Policies: three shipped files, every limit with a unit, bad files fail with the field path."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from sandbox_runtime.errors import PolicyError
from sandbox_runtime.policy import BUILTIN_POLICY_NAMES, Policy, load_policy, policy_from_mapping

UNIT_SUFFIXES = (
    "_bytes",
    "_tokens",
    "_s",
    "_max",
    "_count",
    "_chars",
    "cpus",
    "uid",
    "gid",
    "runtime",
    "backend",
    "image",
    "path",
    "name",
    "mode",
    "rule",
    "rules",
    "approver",
    "host",  # an address, not a limit
    "port",
    "variable",  # the name of an environment variable
    "command",
    "env",
    "url",
    "keep_in",  # which runtimes keep a warm pool: a choice, not a limit
    "allowed",  # the tools scripts may call: names, not a limit
    "namespace",  # Kubernetes: names of the cluster's own objects, not limits
    "gvisor_runtime_class",
    "storage_class",
    "issuer",  # OAuth: who signs tokens, for whom, with what (names and URLs, not limits)
    "audience",
    "jwks_file",
    "required_scopes",
    "tenant_claim",
    "algorithms",
)


@pytest.mark.parametrize("name", BUILTIN_POLICY_NAMES)
def test_each_shipped_policy_loads(name: str) -> None:
    policy = load_policy(name)
    assert policy.name == name


def test_the_default_file_spells_out_every_built_in_default() -> None:
    assert load_policy("default") == Policy(name="default")


def test_every_limit_names_its_unit() -> None:
    def fields(model: type[BaseModel]) -> list[str]:
        names: list[str] = []
        for field_name, field in model.model_fields.items():
            annotation = field.annotation
            if typing.get_origin(annotation) is dict:  # per-name sections, e.g. spill.tools.<tool>
                annotation = typing.get_args(annotation)[1]
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                names += fields(annotation)
            else:
                names.append(field_name)
        return names

    unnamed = [name for name in fields(Policy) if not name.endswith(UNIT_SUFFIXES)]
    assert not unnamed, unnamed


def test_a_policy_file_names_only_what_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "small.toml"
    path.write_text("[sandbox.limits]\nmemory_bytes = 134217728\n")
    policy = load_policy(path)
    assert policy.sandbox.limits.memory_bytes == 134217728
    assert policy.sandbox.limits.pids_max == Policy().sandbox.limits.pids_max


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[sandbox.limits]\nmemory_mb = 5\n", "sandbox.limits.memory_mb: Extra inputs are not permitted"),
        (
            "[sandbox.limits]\nmemory_bytes = -1\n",
            "sandbox.limits.memory_bytes: Input should be greater than 0",
        ),
        ('[sandbox]\nruntime = "kata"\n', "sandbox.runtime"),
        ("[sandbox]\nuid = 0\n", "sandbox.uid"),
        (
            '[sandbox]\nruntime = "runsc"\n[sandbox.limits]\npids_max = 64\n',
            "pids_max: must be >= 256 under runsc",
        ),
        ("[run]\ndefault_timeout_s = 900\n", "run.default_timeout_s"),
        ('[store]\nquota_mode = "xfs"\n', "store.quota_mode"),
        ("this is = = not toml", "not TOML"),
    ],
)
def test_a_bad_policy_file_fails_with_the_field_path_and_the_reason(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=None) as raised:
        load_policy(path)
    assert fragment in str(raised.value)
    assert str(path) in str(raised.value)


def test_a_missing_policy_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_policy(tmp_path / "nope.toml")


def test_the_policy_digest_changes_with_any_value() -> None:
    assert Policy().digest() == Policy().digest()
    assert Policy().digest() != load_policy("strict").digest()


def test_a_policy_changed_in_code_keeps_the_rest_and_is_validated_again() -> None:
    base = load_policy("strict")
    changed = base.changed(
        {"sql": {"timeout_s": 5.0}, "mcp": {"upstreams": {"t": {"url": "http://127.0.0.1:9/mcp"}}}}, "x"
    )
    assert changed.sql.timeout_s == 5.0
    assert changed.sandbox == base.sandbox  # untouched sections stay as they were
    assert changed.mcp.upstreams["t"].url == "http://127.0.0.1:9/mcp"
    with pytest.raises(PolicyError, match="the flags"):
        base.changed({"mcp": {"upstreams": {"t": {}}}}, "the flags")  # neither command nor url


def test_a_policy_naming_a_cluster_backend_is_refused_and_told_what_exists_instead() -> None:
    with pytest.raises(PolicyError) as refused:
        policy_from_mapping({"sandbox": {"backend": "kubernetes"}})
    said = str(refused.value)
    assert "sandbox.backend" in said
    assert "kube manifests" in said
    assert "'docker' or 'podman'" in said
