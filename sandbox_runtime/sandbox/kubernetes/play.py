"""The sandbox's Pod spec run for real on this machine: ``podman kube play`` (through the Podman service's API,
with no network of its own), probed from inside by the self-check, then removed.

No Kubernetes API server runs here; this is the closest real run of the very spec
:func:`~sandbox_runtime.sandbox.kubernetes.manifests.pod_manifest` writes. Only the results volume's source
differs (a host folder instead of the conversation's claim). A check the pod fails is either declared (what a pod
cannot say, :func:`~sandbox_runtime.sandbox.kubernetes.manifests.left_to_the_cluster`, or what ``kube play``
leaves out where a cluster would not) or a defect: :class:`PlayReport` keeps the two apart.
"""

from __future__ import annotations

import uuid

import yaml
from pydantic import BaseModel, ConfigDict

from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.kubernetes.manifests import left_to_the_cluster, pod_manifest
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION, LABEL_RUNTIME
from sandbox_runtime.sandbox.podman import PodmanBackend
from sandbox_runtime.sandbox.profile import container_spec
from sandbox_runtime.sandbox.selfcheck import Check, probe_sandbox

__all__ = ["PLAY_LEAVES_OUT", "PlayReport", "play_and_probe"]

# the self-check's checks a played pod fails by design, with why: what a pod cannot say, and what ``podman kube
# play`` leaves out although a cluster would not
PLAY_LEAVES_OUT = {
    "pids limit": "pids",
    "/tmp tmpfs": "tmp_mount_options",  # and kube play makes a memory-backed emptyDir a folder on disk
    "no swap": "kube play sets no swap limit; a cluster gives a Guaranteed pod (requests = limits) no swap",
}


class PlayReport(BaseModel):
    """What the probe saw in the played pod: every check, and which failures are declared (check name: why)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pod: str
    checks: tuple[Check, ...]
    declared: dict[str, str]

    @property
    def undeclared_failures(self) -> list[Check]:
        return [check for check in self.checks if not check.ok and check.name not in self.declared]


def play_and_probe(
    backend: PodmanBackend, policy: Policy, *, image: str, results_folder: str, labels: dict[str, str]
) -> PlayReport:
    """Play the sandbox's Pod (its results volume: ``results_folder`` on this host, writable by the sandbox's uid),
    run the self-check's probe in it, remove it, and say what it saw."""
    names = {LABEL_RUNTIME: "1", LABEL_CONVERSATION: f"kube-play-{uuid.uuid4().hex[:12]}", **labels}
    spec = container_spec(policy, image, results_folder, names)
    pod = pod_manifest(policy, spec, {"hostPath": {"path": results_folder, "type": "Directory"}})
    name = str(pod["metadata"]["name"])
    try:
        (container,) = backend.play_kube(yaml.safe_dump(pod, sort_keys=False))
        checks = probe_sandbox(backend, policy, container, quota_mode="measured")
    finally:
        backend.remove_pod(name)
    left: dict[str, str] = {str(name): said for name, said in left_to_the_cluster(spec).items()}
    declared = {
        check.name: left.get(why, why)
        for check in checks
        if not check.ok and (why := PLAY_LEAVES_OUT.get(check.name)) is not None
    }
    return PlayReport(pod=name, checks=tuple(checks), declared=declared)
