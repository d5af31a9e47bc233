"""An operator moving to a cluster asks for the sandbox's Kubernetes objects (``sandbox-runtime kube manifests``)
and gets ones the API server would take: every object is validated offline, strictly, against the Kubernetes
OpenAPI schema (``kubernetes-validate``) and the agent-sandbox objects against that project's own CRDs (vendored
in ``tests/kube/agent-sandbox``, commit named there). No API server runs here; the same Pod spec is run for real
under ``podman kube play`` in ``tests/test_kube_play.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from sandbox_runtime.policy import Policy, load_policy
from sandbox_runtime.sandbox.kubernetes.manifests import (
    agent_sandbox_manifests,
    label_value,
    left_to_the_cluster,
    pod_manifests,
)
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION, LABEL_RUNTIME, LABEL_STATE_DIR
from sandbox_runtime.sandbox.profile import container_spec
from tests.cli_helpers import run_cli

KUBERNETES_VERSION = "1.37"  # the newest schema kubernetes-validate bundles
CRDS = Path(__file__).parent / "kube" / "agent-sandbox"
CRD_FILES = {
    "SandboxTemplate": "extensions.agents.x-k8s.io_sandboxtemplates.yaml",
    "SandboxWarmPool": "extensions.agents.x-k8s.io_sandboxwarmpools.yaml",
    "SandboxClaim": "extensions.agents.x-k8s.io_sandboxclaims.yaml",
}
AWKWARD_ID = "Case_Ticket-4711_"  # capitals and '_' (no object name may hold them), ending in '_' (no label value)


def _spec(policy: Policy, conversation: str = AWKWARD_ID) -> Any:
    labels = {LABEL_RUNTIME: "1", LABEL_CONVERSATION: conversation, LABEL_STATE_DIR: "/var/lib/sandbox-runtime/x"}
    return container_spec(policy, "registry.example/sandbox-runtime-executor:1", "/unused", labels)


def _strict(schema: Any) -> Any:
    """A CRD's structural schema for plain JSON Schema: its ``x-kubernetes-*`` hints dropped, and an object that
    lists its properties takes no others (the API server's strict field validation)."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        key: ({name: _strict(value) for name, value in body.items()} if key == "properties" else _strict(body))
        for key, body in schema.items()
        if not key.startswith("x-kubernetes-")
    }
    if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def _crd_schema(kind: str) -> Any:
    crd = yaml.safe_load((CRDS / CRD_FILES[kind]).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    assert version["served"]
    assert version["storage"]
    return _strict(version["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize("policy_name", ["default", "gvisor", "strict"])
def test_the_pod_form_is_a_valid_network_policy_claim_and_pod_for_the_api_server(policy_name: str) -> None:
    policy = load_policy(policy_name)
    made = pod_manifests(policy, _spec(policy))

    assert [m["kind"] for m in made] == ["NetworkPolicy", "PersistentVolumeClaim", "Pod"]
    for manifest in made:
        assert kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
    policy_, claim, pod = made
    assert policy_["spec"] == {
        "podSelector": {"matchLabels": {LABEL_RUNTIME: "1"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [],
    }
    assert claim["spec"]["resources"]["requests"]["storage"] == str(policy.store.quota_bytes)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == policy.sandbox.uid
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"] == container["resources"]["limits"]  # Guaranteed: never swaps
    assert container["resources"]["limits"]["memory"] == str(policy.sandbox.limits.memory_bytes)
    tmp = next(v for v in spec["volumes"] if v["name"] == "tmp")
    assert tmp["emptyDir"] == {"medium": "Memory", "sizeLimit": str(policy.sandbox.limits.tmpfs_bytes)}
    assert {e["name"] for e in container["env"]} >= {"HOME", "PATH", "SANDBOX_RESULTS"}
    assert spec.get("runtimeClassName") == ("gvisor" if policy.sandbox.runtime == "runsc" else None)


def test_names_and_labels_carry_any_conversation_id_and_annotations_keep_it_as_it_is() -> None:
    policy = load_policy("default")
    pod = pod_manifests(policy, _spec(policy))[2]
    metadata = pod["metadata"]

    assert metadata["name"].startswith("sbrt-sandbox-")
    assert metadata["name"] == metadata["name"].lower()
    assert metadata["annotations"][LABEL_CONVERSATION] == AWKWARD_ID
    assert metadata["labels"][LABEL_CONVERSATION] == label_value(AWKWARD_ID) != AWKWARD_ID
    assert metadata["labels"][LABEL_STATE_DIR].startswith("sha256-")  # a path is no label value
    assert label_value("plain-id_7") == "plain-id_7"  # a valid value stays as it is
    other = pod_manifests(policy, _spec(policy, "Case_Ticket-4711"))[2]["metadata"]["name"]
    assert other != metadata["name"]  # each conversation its own pod


def test_the_agent_sandbox_form_is_valid_against_the_projects_own_crds_with_a_deny_all_network_policy() -> None:
    policy = load_policy("gvisor")
    made = agent_sandbox_manifests(policy, _spec(policy))

    assert [m["kind"] for m in made] == ["SandboxTemplate", "SandboxWarmPool", "SandboxClaim"]
    for manifest in made:
        assert manifest["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1"
        jsonschema.Draft202012Validator(_crd_schema(manifest["kind"])).validate(manifest)
    template, pool, claim = made
    # an explicit empty rule list in each direction: the controller's own default lets traffic out
    assert template["spec"]["networkPolicy"] == {"ingress": [], "egress": []}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "t"},
        "spec": template["spec"]["podTemplate"]["spec"],
    }
    assert kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    assert pool["spec"]["sandboxTemplateRef"]["name"] == template["metadata"]["name"]
    assert claim["spec"]["warmPoolRef"]["name"] == pool["metadata"]["name"]
    (volume,) = claim["spec"]["volumeClaimTemplates"]
    assert volume["spec"]["resources"]["requests"]["storage"] == str(policy.store.quota_bytes)


def test_a_misspelled_field_would_be_caught_by_the_same_checks() -> None:
    policy = load_policy("default")
    pod = pod_manifests(policy, _spec(policy))[2]
    pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFileSystem"):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    template = agent_sandbox_manifests(policy, _spec(policy))[0]
    template["spec"]["networkPolicy"]["podSelector"] = {}
    with pytest.raises(jsonschema.ValidationError, match="podSelector"):
        jsonschema.Draft202012Validator(_crd_schema("SandboxTemplate")).validate(template)


def test_what_a_pod_cannot_say_is_listed_never_dropped() -> None:
    left = left_to_the_cluster(_spec(load_policy("default")))
    assert set(left) == {"pids", "ulimits", "tmp_mount_options", "network_interface", "keeper_uid", "runtime_class"}
    assert "nofile 1024" in left["ulimits"]
    assert "runtime_class" not in left_to_the_cluster(_spec(load_policy("gvisor")))


@pytest.mark.parametrize("form", ["pod", "agent-sandbox"])
def test_the_cli_prints_the_objects_as_yaml_with_what_is_left_to_the_cluster_first(form: str) -> None:
    image = "registry.example/executor@sha256:" + "a" * 64
    done = run_cli("kube", "manifests", "--form", form, "--conversation", "support-4711", "--image", image)

    assert done.returncode == 0, done.stderr
    header = [line for line in done.stdout.splitlines() if line.startswith("#")]
    assert any(line.startswith("#   pids: ") for line in header)
    documents = [d for d in yaml.safe_load_all(done.stdout) if d is not None]
    kinds = [d["kind"] for d in documents]
    assert kinds == (
        ["NetworkPolicy", "PersistentVolumeClaim", "Pod"]
        if form == "pod"
        else ["SandboxTemplate", "SandboxWarmPool", "SandboxClaim"]
    )
    images = [c["image"] for d in documents if d["kind"] in ("Pod", "SandboxTemplate") for c in _containers(d)]
    assert images == ["registry.example/executor@sha256:" + "a" * 64]


def test_a_bad_conversation_id_is_a_usage_error() -> None:
    done = run_cli("kube", "manifests", "--conversation", "no/slashes")
    assert done.returncode == 2
    assert "conversation id" in done.stderr


def _containers(document: dict[str, Any]) -> list[dict[str, Any]]:
    spec = document["spec"]
    return list(spec["podTemplate"]["spec"]["containers"] if "podTemplate" in spec else spec["containers"])
