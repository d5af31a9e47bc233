"""The Docker engine (docker-py; also any engine that speaks its API): :class:`DockerBackend`, the only module of
the package that imports ``docker``, and the engine's records."""

from sandbox_runtime.sandbox.docker.backend import DockerBackend

__all__ = ["DockerBackend"]
