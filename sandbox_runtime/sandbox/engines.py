"""The one factory of backends: the policy's ``sandbox.backend`` names the engine, and only that engine's module
(and its client library) is imported."""

from __future__ import annotations

from collections.abc import Mapping

from sandbox_runtime.policy import SandboxPolicy
from sandbox_runtime.sandbox.backend import SandboxBackend

__all__ = ["make_backend"]


def make_backend(policy: SandboxPolicy, environment: Mapping[str, str] | None = None) -> SandboxBackend:
    """The backend the policy names (``environment``: where an engine's client reads its settings, e.g.
    ``DOCKER_HOST`` or ``CONTAINER_HOST``; default: this process's). An unreachable engine raises
    :class:`~sandbox_runtime.errors.EngineUnavailable`."""
    if policy.backend == "fake":
        from sandbox_runtime.sandbox.fake import FakeBackend  # noqa: PLC0415  (lazy: only the chosen engine loads)

        return FakeBackend()
    if policy.backend == "podman":
        from sandbox_runtime.sandbox.podman import PodmanBackend  # noqa: PLC0415  (lazy: only the chosen engine loads)

        return PodmanBackend(environment)
    from sandbox_runtime.sandbox.docker import DockerBackend  # noqa: PLC0415  (lazy: docker-py loads only here)

    return DockerBackend(environment)
