"""The Pod spec ``kube manifests`` writes, run for real: ``podman kube play`` starts it with no network, the
self-check's probe runs inside, and every protection holds but those a pod cannot say or ``kube play`` leaves out,
each declared with its reason, never hidden. A cluster needs ``SANDBOX_RUNTIME_KUBECONFIG`` and is not here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandbox_runtime.policy import load_policy
from sandbox_runtime.sandbox.kubernetes.play import PLAY_LEAVES_OUT, play_and_probe
from sandbox_runtime.sandbox.podman import PodmanBackend
from tests.conftest import SESSION, TEST_LABEL


def _results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    os.chown(results, 10001, 10001)
    return results


def test_the_pod_runs_under_podman_kube_play_and_only_declared_protections_are_missing(
    podman_backend: PodmanBackend, podman_image: str, tmp_path: Path
) -> None:
    report = play_and_probe(
        podman_backend,
        load_policy("default"),
        image=podman_image,
        results_folder=str(_results(tmp_path)),
        labels={TEST_LABEL: SESSION},
    )

    assert report.undeclared_failures == [], report.undeclared_failures
    assert set(report.declared) == set(PLAY_LEAVES_OUT)  # each one seen missing, and said why
    passed = {check.name for check in report.checks if check.ok}
    assert {"capabilities", "non-root uid", "read-only root", "network", "host loopback", "environment"} <= passed
    assert podman_backend.list_containers({TEST_LABEL: SESSION, "io.sandbox-runtime.managed": "1"}) == []


def test_kube_check_prints_every_protection_and_exits_0_when_only_declared_ones_are_missing(
    podman_backend: PodmanBackend, podman_image: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_runtime", "--label", f"{TEST_LABEL}={SESSION}", "kube", "check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PATH": os.environ.get("PATH", "")},
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert podman_image in done.stdout
    lines = done.stdout.splitlines()
    assert any(line.startswith("DECLARED  pids limit") for line in lines), done.stdout
    assert any(line.startswith("ok        network") for line in lines), done.stdout
    assert not any(line.startswith("FAIL") for line in lines), done.stdout
