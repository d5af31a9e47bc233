"""The Podman backend: Podman's Docker-compatible REST API, spoken by the Docker backend's own code.

Why the REST API and not the ``podman`` command: a run is one long exec with stdin attached, read with a byte cap
and a deadline (:mod:`~sandbox_runtime.sandbox.exec_stream`); the API's attach stream is the very one the Docker
backend already reads that way, so every bound, the resident executor and the cancel path are shared word for
word, and no process is forked per command. Sandboxes are created with Podman's native call, from the whole
hardened :class:`ContainerSpec` (:mod:`~sandbox_runtime.sandbox.podman.spec`: uid, no capabilities,
no-new-privileges, seccomp, read-only root, ``noexec`` tmpfs, memory = memory + swap, CPU, pids, ulimits, network
``none``, labels, and none of the variables Podman adds on its own); everything else (start, exec, inspect, list,
restart, remove, images) goes through the compatible API. What differs from Docker is here:

* the service's address: ``CONTAINER_HOST`` (Podman's own variable), else the service's usual socket
  (``/run/podman/podman.sock`` as root, ``$XDG_RUNTIME_DIR/podman/podman.sock`` rootless);
* gVisor: Podman 4.3's API ignores a container's runtime (it always starts the service's default;
  containers/podman#28429, fixed after 4.3), so a policy asking for ``runsc`` is refused at the start of a
  sandbox, never run under runc in silence. Use the Docker backend for gVisor, or a Podman service whose default
  runtime is runsc (``engine_info`` then lists it);
* ulimits: Podman fills every ulimit the request leaves out with its own maximum, which a container with no
  capabilities may not take, so the profile always names ``nproc`` and ``nofile``;
* an imported image is named in one parameter (Podman drops the separate tag);
* removal: Podman shows a container as exited while it removes it, and answers "no such container" with a
  server error before its record says so (``stops_before_removal``; the Docker backend takes that answer for
  gone);
* pods: :meth:`PodmanBackend.play_kube` runs a Pod manifest as ``podman kube play`` does (with no network), for
  ``sandbox-runtime kube check``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import requests

from sandbox_runtime.errors import EngineUnavailable, ImageError, SandboxError
from sandbox_runtime.sandbox.backend import ContainerInfo, ContainerSpec, EngineInfo, ProgressCallback
from sandbox_runtime.sandbox.docker.backend import DockerBackend, EngineWords
from sandbox_runtime.sandbox.podman.facts import podman_engine_info
from sandbox_runtime.sandbox.podman.spec import spec_generator

__all__ = ["PodmanBackend", "default_socket"]

_ROOT_SOCKET = "/run/podman/podman.sock"
_LIBPOD_API = "v4.0.0"  # the oldest libpod API this speaks (Debian 12's Podman 4.3 answers it, and every later one)
_OK, _CREATED, _NOT_FOUND = 200, 201, 404


def _message(response: requests.Response) -> str:
    """What an error answer of Podman's API says (its JSON ``message``, else its text)."""
    try:
        return str(response.json().get("message") or response.text)
    except ValueError:
        return response.text[:500]


def default_socket(environment: Mapping[str, str], uid: int) -> str:
    """Where Podman's service listens by default: the system socket for root, the user's own otherwise."""
    if uid == 0:
        return _ROOT_SOCKET
    runtime_dir = environment.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    return str(Path(runtime_dir) / "podman" / "podman.sock")


class PodmanBackend(DockerBackend):
    """Podman's service through docker-py (see the module docstring for what differs from Docker)."""

    name = "podman"
    stops_before_removal = True  # `rm -f` stops the container, shown as exited, and only then removes it
    words: ClassVar[EngineWords] = EngineWords(
        name="the Podman service",
        start_hint="is `podman system service` running? Start it (see README: scripts/setup.sh) or set "
        "CONTAINER_HOST to its socket",
    )

    @classmethod
    def client_options(cls, environment: Mapping[str, str]) -> dict[str, Any]:
        url = environment.get("CONTAINER_HOST") or f"unix://{default_socket(environment, os.getuid())}"
        return {"base_url": url}

    def __init__(self, environment: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> None:
        super().__init__(environment, timeout_s)
        self._default_runtime: str | None = None

    def engine_info(self) -> EngineInfo:
        """The service's facts from one answer of its native ``info`` (its compatible ``/info`` and ``/version``
        took three times as long, looking up package names each time)."""
        info = self._libpod("read engine info", "get", "info", (_OK,), error=EngineUnavailable).json()
        facts = podman_engine_info(info, api_version=str(self._api.api_version))
        self._default_runtime = facts.default_runtime
        return facts

    def create_and_start(self, spec: ContainerSpec) -> ContainerInfo:
        default_runtime = self._default_runtime or self.engine_info().default_runtime
        if spec.runtime != default_runtime:
            raise SandboxError(
                f"the policy asks for the {spec.runtime} runtime, but Podman's API starts every container under "
                f"its service's default runtime ({default_runtime}; containers/podman#28429): use backend "
                f'"docker" for {spec.runtime}, or a Podman service whose default runtime is {spec.runtime}'
            )
        created = self._libpod(
            "create sandbox container", "post", "containers/create", (_CREATED,), json=spec_generator(spec)
        ).json()
        return self._started(str(created["Id"]), tuple(str(w) for w in created.get("Warnings") or ()))

    def _libpod(
        self,
        action: str,
        method: str,
        path: str,
        ok: tuple[int, ...],
        *,
        error: type[Exception] = SandboxError,
        **options: Any,
    ) -> requests.Response:
        """One call of Podman's native API (``/libpod/<path>``), errors mapped (a service out of reach raises
        ``error``): an answer not in ``ok`` raises (an image it does not have: :class:`ImageError`)."""
        with self._engine(action, error):
            response = self._api.request(
                method, f"{self._api.base_url}/{_LIBPOD_API}/libpod/{path}", timeout=self._knock_timeout_s, **options
            )
        if response.status_code not in ok:
            refused = ImageError if response.status_code == _NOT_FOUND else SandboxError
            raise refused(f"{action}: {self.words.name} refused: {_message(response)}")
        return response

    def import_rootfs(self, tar_path: str, reference: str, progress: ProgressCallback) -> None:
        progress(f"importing {Path(tar_path).stat().st_size:,} bytes as {reference}")
        with self._engine(f"import {reference}", ImageError):
            self._api.import_image_from_file(tar_path, repository=reference)

    # pods (``podman kube play``) ----------------------------------------------------------------------------
    def play_kube(self, manifest_yaml: str) -> list[str]:
        """Run a Pod manifest as ``podman kube play`` does, with no network of its own (only ``lo``): the ids of
        its containers (the pod's infrastructure container left out)."""
        played = self._libpod(
            "play a pod manifest",
            "post",
            "play/kube",
            (_OK,),
            params={"network": "none"},
            data=manifest_yaml.encode(),
            headers={"Content-Type": "application/yaml"},
        ).json()
        return [str(container) for pod in played.get("Pods") or () for container in pod.get("Containers") or ()]

    def remove_pod(self, name: str) -> None:
        """Kill and remove a pod and its containers; no error when it is already gone."""
        self._libpod(
            f"remove pod {name}", "delete", f"pods/{name}", (_OK, _NOT_FOUND), params={"force": "true", "timeout": "0"}
        )
