"""One hardened pod spec, as Kubernetes objects: the sandbox's Pod, the results volume's claim, a deny-all
NetworkPolicy, and the same pod as kubernetes-sigs/agent-sandbox objects (v1beta1). Plain data, no client: what
``sandbox-runtime kube manifests`` prints, what the tests validate against the Kubernetes OpenAPI schema and the
agent-sandbox CRDs, and what they run for real with ``podman kube play``.

Everything comes from the one :class:`~sandbox_runtime.sandbox.backend.ContainerSpec` that
:func:`~sandbox_runtime.sandbox.profile.container_spec` makes, so the pod carries the same protections as a
Docker sandbox where a pod can say them. What a pod cannot say is listed in :func:`left_to_the_cluster`, never
dropped in silence:

* every exec runs as the pod's user, so the code's uid runs the keeper too; the keeper is pid 1 of the pod's
  pid namespace (``kill(-1)`` never reaches it) and a reaping init of the image's (``keeper.py``), since a pod
  has no ``init``;
* no pids limit (the kubelet's ``podPidsLimit`` of the sandbox node pool), no ulimits, no mount options for
  ``/tmp`` (a memory-backed ``emptyDir``: a tmpfs without ``noexec``);
* the network: a pod always has an interface; the NetworkPolicy filters it, and gVisor with ``--network=none``
  (``runtimeClassName``) takes it away from the code.

The results folder is a PersistentVolumeClaim per conversation, its size the quota: a block volume fills up
with ENOSPC as the loop image does. The trade-off against warm pools: a pod's volumes are fixed when it is made,
so a pre-started pod cannot carry a conversation's own volume; an agent-sandbox claim that brings its volume
starts cold, which is why the warm pool here keeps no pods ready (``replicas: 0``). A shared ReadWriteMany
volume with a sub-path per conversation would let warm pods serve (a claim cannot set its sub-path either) and
weakens the host-side file defences (``docs/scale-out.md``, 3.1).

Label values hold at most 63 characters and no ``/``: a value that is not a valid label value (a state
directory's path, a conversation id starting with ``_``) is carried as its hash (:func:`label_value`), and every
value as it is in an annotation.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import ContainerSpec
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION, LABEL_RUNTIME
from sandbox_runtime.sandbox.run_protocol import KEEPER, PYTHON

__all__ = [
    "AGENT_SANDBOX_VERSION",
    "Manifest",
    "agent_sandbox_manifests",
    "label_value",
    "left_to_the_cluster",
    "network_policy",
    "object_name",
    "pod_manifest",
    "pod_manifests",
    "results_claim",
]

Manifest = dict[str, Any]
AGENT_SANDBOX_VERSION = "v1beta1"
_AGENT_SANDBOX_GROUP = "extensions.agents.x-k8s.io"
_CONTAINER = "sandbox"
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_NAME_HASH_CHARS = 16


def label_value(value: str) -> str:
    """``value`` as a Kubernetes label value: itself when it is one, else ``sha256-`` and 40 hex digits of its
    hash (the same every time, so a selector finds it)."""
    if _LABEL_VALUE.fullmatch(value):
        return value
    return "sha256-" + hashlib.sha256(value.encode()).hexdigest()[:40]


def object_name(kind: str, key: str) -> str:
    """A DNS-1123 name for an object of a conversation (``kind``: ``sandbox``, ``results``): a conversation id
    may hold ``_`` and capitals, a name may not."""
    return f"sbrt-{kind}-{hashlib.sha256(key.encode()).hexdigest()[:_NAME_HASH_CHARS]}"


def _metadata(name: str, namespace: str, labels: dict[str, str]) -> Manifest:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {key: label_value(value) for key, value in sorted(labels.items())},
        "annotations": dict(sorted(labels.items())),
    }


def _quantity(value: float) -> str:
    """A resource quantity: whole numbers as they are, CPU fractions in millicores."""
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def _tmpfs_bytes(spec: ContainerSpec) -> int:
    options = dict(part.partition("=")[::2] for part in spec.tmpfs.get("/tmp", "").split(","))
    return int(options.get("size") or 0)


def _pod_spec(policy: Policy, spec: ContainerSpec, results: Manifest) -> Manifest:
    """The hardened PodSpec (see the module docstring for what a pod cannot say)."""
    sandbox = policy.sandbox
    cpu, memory = _quantity(spec.nano_cpus / 1_000_000_000), str(spec.memory_bytes)
    pod: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": ["127.0.0.1"]},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": sandbox.uid,
            "runAsGroup": sandbox.gid,
            "fsGroup": sandbox.gid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": _CONTAINER,
                "image": spec.image,
                "command": [PYTHON, "-I", "-S", KEEPER],
                "workingDir": spec.working_dir,
                "env": [{"name": key, "value": value} for key, value in sorted(spec.environment.items())],
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "readOnlyRootFilesystem": spec.read_only_root,
                    "capabilities": {"drop": list(spec.cap_drop)},
                },
                "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}},
                "volumeMounts": [
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "results", "mountPath": sandbox.results_mount_path},
                ],
            }
        ],
        "volumes": [
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": str(_tmpfs_bytes(spec))}},
            {"name": "results", **results},
        ],
    }
    if spec.runtime == "runsc":
        pod["runtimeClassName"] = policy.kubernetes.gvisor_runtime_class
    return pod


def pod_manifest(policy: Policy, spec: ContainerSpec, results: Manifest | None = None) -> Manifest:
    """The sandbox's Pod. ``results``: the results volume's source (default: the conversation's claim,
    :func:`results_claim`; a local ``hostPath`` for ``podman kube play``)."""
    key = spec.labels.get(LABEL_CONVERSATION, "")
    source = results or {"persistentVolumeClaim": {"claimName": object_name("results", key)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(object_name("sandbox", key), policy.kubernetes.namespace, spec.labels),
        "spec": _pod_spec(policy, spec, source),
    }


def results_claim(policy: Policy, spec: ContainerSpec) -> Manifest:
    """The conversation's results volume: ReadWriteOnce, its size the conversation's quota."""
    key = spec.labels.get(LABEL_CONVERSATION, "")
    claim: Manifest = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(object_name("results", key), policy.kubernetes.namespace, spec.labels),
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": str(policy.store.quota_bytes)}},
        },
    }
    if policy.kubernetes.storage_class is not None:
        claim["spec"]["storageClassName"] = policy.kubernetes.storage_class
    return claim


def network_policy(policy: Policy) -> Manifest:
    """Deny every connection in and out of the sandbox pods (this runtime's label), in both directions."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "sbrt-sandboxes-deny-all", "namespace": policy.kubernetes.namespace},
        "spec": {
            "podSelector": {"matchLabels": {LABEL_RUNTIME: "1"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


def pod_manifests(policy: Policy, spec: ContainerSpec) -> list[Manifest]:
    """The plain form: the NetworkPolicy, the conversation's claim and its Pod."""
    return [network_policy(policy), results_claim(policy, spec), pod_manifest(policy, spec)]


def agent_sandbox_manifests(policy: Policy, spec: ContainerSpec) -> list[Manifest]:
    """The agent-sandbox form: a SandboxTemplate of the same pod (an explicit deny-all network policy), the
    SandboxWarmPool every claim must name (none kept ready: see the module docstring), and the conversation's
    SandboxClaim, which brings its results volume."""
    namespace = policy.kubernetes.namespace
    template_name = f"sbrt-{policy.name}-{policy.digest()[:8]}".lower().replace("_", "-")
    pod = pod_manifest(policy, spec, {"persistentVolumeClaim": {"claimName": "results"}})
    base_labels = {LABEL_RUNTIME: "1"}
    api = f"{_AGENT_SANDBOX_GROUP}/{AGENT_SANDBOX_VERSION}"
    claim = results_claim(policy, spec)
    key = spec.labels.get(LABEL_CONVERSATION, "")
    return [
        {
            "apiVersion": api,
            "kind": "SandboxTemplate",
            "metadata": {"name": template_name, "namespace": namespace, "labels": base_labels},
            "spec": {
                "networkPolicyManagement": "Managed",
                "networkPolicy": {"ingress": [], "egress": []},
                "volumeClaimTemplatesPolicy": "Allowed",
                "envVarsInjectionPolicy": "Disallowed",
                "podTemplate": {"metadata": {"labels": base_labels}, "spec": pod["spec"]},
            },
        },
        {
            "apiVersion": api,
            "kind": "SandboxWarmPool",
            "metadata": {"name": template_name, "namespace": namespace, "labels": base_labels},
            "spec": {"sandboxTemplateRef": {"name": template_name}, "replicas": 0},
        },
        {
            "apiVersion": api,
            "kind": "SandboxClaim",
            "metadata": _metadata(object_name("sandbox", key), namespace, spec.labels),
            "spec": {
                "warmPoolRef": {"name": template_name},
                "additionalPodMetadata": {
                    "labels": pod["metadata"]["labels"],
                    "annotations": pod["metadata"]["annotations"],
                },
                "volumeClaimTemplates": [{"metadata": {"name": "results"}, "spec": claim["spec"]}],
                "lifecycle": {"shutdownPolicy": "Delete"},
            },
        },
    ]


Protection = Literal["pids", "ulimits", "tmp_mount_options", "network_interface", "keeper_uid", "runtime_class"]


def left_to_the_cluster(spec: ContainerSpec) -> dict[Protection, str]:
    """What the Docker profile says that a pod cannot: each with where it is kept instead, if anywhere."""
    left: dict[Protection, str] = {
        "pids": f"pids_max ({spec.pids_limit}) is the node's kubelet podPidsLimit: a node pool for sandboxes",
        "ulimits": "ulimits ("
        + ", ".join(f"{name} {value}" for name, value in sorted(spec.ulimits.items()))
        + ") have no pod field",
        "tmp_mount_options": "/tmp is a memory-backed emptyDir: sized, but without noexec, nosuid, nodev",
        "network_interface": "a pod always has an interface: the NetworkPolicy denies all traffic, and only gVisor "
        "with --network=none (runtimeClassName) leaves the code nothing but lo",
        "keeper_uid": "every exec runs as the pod's user: the keeper shares the code's uid, safe as pid 1",
    }
    if spec.runtime != "runsc":
        left["runtime_class"] = "runc: no runtimeClassName, so the pod's interface is the code's too"
    return left
