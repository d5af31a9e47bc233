"""Podman, through its Docker-compatible REST API (``podman system service``): :class:`PodmanBackend`."""

from sandbox_runtime.sandbox.podman.backend import PodmanBackend

__all__ = ["PodmanBackend"]
