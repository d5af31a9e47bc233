"""``sandbox-runtime kube manifests``: the Kubernetes objects of one conversation's sandbox, as YAML, from the
policy (:mod:`~sandbox_runtime.sandbox.kubernetes.manifests`); what a pod cannot say is printed first, as
comments. ``sandbox-runtime kube check``: that Pod run on this machine's Podman service and probed from inside
(:mod:`~sandbox_runtime.sandbox.kubernetes.play`)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from sandbox_runtime.policy import load_policy
from sandbox_runtime.sandbox.image import sandbox_image
from sandbox_runtime.sandbox.kubernetes.manifests import (
    agent_sandbox_manifests,
    left_to_the_cluster,
    pod_manifests,
)
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION, LABEL_POLICY, LABEL_RUNTIME
from sandbox_runtime.sandbox.profile import container_spec, sandbox_identity
from sandbox_runtime.tenancy import validate_conversation_id

__all__ = ["add_kube_parser"]


def add_kube_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kube = sub.add_parser("kube", help="Kubernetes: the objects a sandbox is made of")
    kube_sub = kube.add_subparsers(dest="kube_command", required=True)
    manifests = kube_sub.add_parser(
        "manifests",
        help="print the Kubernetes objects of one conversation's sandbox (YAML): a Pod, its results claim and a "
        "deny-all NetworkPolicy, or kubernetes-sigs/agent-sandbox objects",
    )
    manifests.add_argument(
        "--form",
        choices=("pod", "agent-sandbox"),
        default="pod",
        help="pod (default): NetworkPolicy, PersistentVolumeClaim, Pod; agent-sandbox: SandboxTemplate, "
        "SandboxWarmPool, SandboxClaim (v1beta1)",
    )
    manifests.add_argument("--conversation", default="example", help="the conversation id (default: example)")
    manifests.add_argument(
        "--image", help="the executor image as the cluster's nodes pull it (default: the policy's, else the local tag)"
    )
    manifests.set_defaults(func=cmd_kube_manifests)
    check = kube_sub.add_parser(
        "check",
        help="run the sandbox's Pod on this machine's Podman service (podman kube play, no network) and the "
        "self-check's probes in it: every protection, and which a pod leaves to the cluster",
    )
    check.add_argument(
        "--image", help="the executor image in Podman's store (default: the policy's, else the local tag)"
    )
    check.set_defaults(func=cmd_kube_check)


def cmd_kube_check(args: argparse.Namespace) -> int:
    from sandbox_runtime.sandbox.kubernetes.play import play_and_probe  # noqa: PLC0415  (Podman's client: here only)
    from sandbox_runtime.sandbox.podman import PodmanBackend  # noqa: PLC0415  (Podman's client: here only)

    policy = load_policy(args.policy)
    backend = PodmanBackend()
    try:
        with tempfile.TemporaryDirectory(prefix="sandbox-runtime-kube-check-") as folder:
            results = Path(folder) / "results"
            results.mkdir()
            if os.getuid() == 0:
                os.chown(results, policy.sandbox.uid, policy.sandbox.gid)
            else:
                results.chmod(0o777)  # the sandbox's uid writes its probe file there
            image = args.image or sandbox_image(policy.sandbox)
            report = play_and_probe(backend, policy, image=image, results_folder=str(results), labels=dict(args.label))
    finally:
        backend.close()
    print(f"pod      {report.pod}, played by Podman and removed; policy {policy.name}, image {image}\n")
    rows = [
        ["ok" if c.ok else ("DECLARED" if c.name in report.declared else "FAIL"), c.name, c.expected, c.actual]
        for c in report.checks
    ]
    width = max(len(row[1]) for row in rows)
    for state, name, expected, actual in rows:
        print(f"{state:<8}  {name:<{width}}  {expected}  |  {actual[:100]}")
    for name, why in report.declared.items():
        print(f"\n{name}: {why}", end="")
    print()
    if report.undeclared_failures:
        print(f"\n{len(report.undeclared_failures)} protections failed in the pod", file=sys.stderr)
        return 1
    return 0


def cmd_kube_manifests(args: argparse.Namespace) -> int:
    import yaml  # noqa: PLC0415  (only this command writes YAML)

    policy = load_policy(args.policy)
    conversation = validate_conversation_id(args.conversation)
    image = args.image or sandbox_image(policy.sandbox)
    labels = {
        **dict(args.label),
        LABEL_RUNTIME: "1",
        LABEL_POLICY: sandbox_identity(policy, image),
        LABEL_CONVERSATION: conversation,
    }
    spec = container_spec(policy, image, policy.sandbox.results_mount_path, labels)
    made = pod_manifests(policy, spec) if args.form == "pod" else agent_sandbox_manifests(policy, spec)
    print(f"# sandbox-runtime kube manifests --form {args.form} --conversation {conversation} (policy {policy.name})")
    print("# what the Docker profile sets and a pod cannot (kept by the cluster, or left out):")
    for name, said in left_to_the_cluster(spec).items():
        print(f"#   {name}: {said}")
    print(yaml.safe_dump_all(made, sort_keys=False, width=120), end="")
    return 0
