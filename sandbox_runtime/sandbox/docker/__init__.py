"""The Docker engine (docker-py; also any engine that speaks its API): :class:`DockerBackend` (``backend``, the only
module of the package that imports ``docker``), the commands run in its sandboxes (``execs``), and the engine's
records (``records``)."""

from sandbox_runtime.sandbox.docker.backend import DockerBackend

__all__ = ["DockerBackend"]
