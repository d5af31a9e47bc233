"""Where sandboxes run and what confines them (``[sandbox]``, ``[sandbox.limits]``), the warm pool (``[pool]``)
and the Kubernetes objects a sandbox is made of (``[kubernetes]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sandbox_runtime.policy.base import GiB, MiB, PositiveFloat, PositiveInt, Section

__all__ = ["KubernetesPolicy", "PoolPolicy", "SandboxLimits", "SandboxPolicy"]


class SandboxLimits(Section):
    """Resource limits applied to every sandbox container."""

    memory_bytes: PositiveInt = Field(512 * MiB, description="Memory limit; swap is set equal (no swap).")
    cpus: float = Field(1.0, gt=0, le=64, description="CPU quota in cores (Docker nano_cpus).")
    pids_max: PositiveInt = Field(256, description="Most processes and threads at once (>= 256 under gVisor).")
    tmpfs_bytes: PositiveInt = Field(64 * MiB, description="Size of the /tmp tmpfs.")
    open_files_max: PositiveInt = Field(1024, description="RLIMIT_NOFILE: open file descriptors per process.")
    file_size_max_bytes: PositiveInt = Field(512 * MiB, description="RLIMIT_FSIZE: largest single file.")
    cpu_time_max_s: PositiveInt = Field(3600, description="RLIMIT_CPU backstop per process, in CPU seconds.")
    processes_per_uid_max: PositiveInt = Field(
        16384,
        description="RLIMIT_NPROC of the sandbox's processes. The kernel counts every process of the sandbox's uid "
        "on the host, all runc sandboxes together (under gVisor, this sandbox's only): a backstop, where pids_max "
        "is the bound of one sandbox. At most the engine's own limit (Podman refuses a higher one).",
    )


class SandboxPolicy(Section):
    """How sandbox containers are made and how long they live."""

    backend: Literal["docker", "podman", "fake"] = Field(
        "docker",
        description="The engine sandboxes run on: 'docker' (a Docker engine, or any engine speaking its API; "
        "DOCKER_HOST is honoured), 'podman' (Podman's service, through its REST API; CONTAINER_HOST is honoured) "
        "or 'fake' (no engine: code runs as host processes and nothing is confined; for testing an integration).",
    )
    runtime: Literal["runc", "runsc"] = Field("runc", description="OCI runtime; 'runsc' is gVisor.")
    image: str | None = Field(None, description="Executor image; None means the locally built content tag.")

    @field_validator("backend", mode="before")
    @classmethod
    def _no_cluster_backend(cls, value: object) -> object:
        if value == "kubernetes":
            raise ValueError(
                "there is no 'kubernetes' backend in this release (it could not be built and tested against a "
                "cluster): `sandbox-runtime kube manifests` prints the hardened Pod, its results claim and the "
                "deny-all NetworkPolicy, `kube check` runs that Pod under podman kube play, and "
                "docs/scale-out.md says what a cluster backend needs; use 'docker' or 'podman'"
            )
        return value

    uid: int = Field(10001, gt=0, description="Non-root uid the code runs as (never 0).")
    gid: int = Field(10001, gt=0, description="Non-root gid the code runs as (never 0).")
    results_mount_path: str = Field("/mnt/results", description="Where the results folder appears inside.")
    idle_timeout_s: PositiveInt = Field(1800, description="Remove a sandbox unused this long (seconds).")
    max_lifetime_s: PositiveInt = Field(86400, description="Remove any sandbox this old (seconds).")
    executor_idle_s: PositiveInt = Field(
        600, description="End a sandbox's resident executor unused this long (seconds); the next run starts one."
    )
    executor_start_timeout_s: float = Field(
        30.0,
        gt=0,
        le=600,
        description="How long a new resident executor may take to say it is ready (an interpreter start: longer "
        "under gVisor or a loaded engine) (seconds). One that said nothing at all by then is ended and another "
        "started, once; then the run fails with SandboxError.",
    )
    limits: SandboxLimits = SandboxLimits()


class PoolPolicy(Section):
    """The warm pool: sandboxes started ahead of need (hardened, quota volume made, resident executor loaded), each
    handed whole to one new conversation and never to another. It keeps as many ready as new conversations asked
    for one within ``demand_window_s``, never fewer than ``ready_count`` nor more than ``max_ready_count``."""

    ready_count: int = Field(
        1,
        ge=0,
        le=64,
        description="Sandboxes kept ready for new conversations however quiet it is, where a pool is kept (the "
        "pool's floor; 0: none until new conversations come).",
    )
    max_ready_count: int = Field(
        16,
        ge=0,
        le=64,
        description="The most sandboxes the pool keeps ready when many new conversations come (its ceiling; at "
        "least ready_count; 0: no pool).",
    )
    demand_window_s: PositiveInt = Field(
        60,
        description="The pool keeps ready as many sandboxes as new conversations asked for one within this many "
        "seconds (between its floor and its ceiling); as those asks age out of the window it shrinks back.",
    )
    host_memory_available_min_bytes: int = Field(
        1 * GiB,
        ge=0,
        description="The pool grows past ready_count only while this host has at least this much memory available "
        "(MemAvailable; 0: no bound); below it, what waits past the floor is removed.",
    )
    starts_at_once_max: int = Field(
        4, ge=1, le=64, description="Sandboxes the pool starts side by side when it fills up."
    )
    keep_in: Literal["serve", "all", "none"] = Field(
        "serve",
        description="Which runtimes keep a pool: 'serve' (sandbox-runtime serve; the Python API when it asks with "
        "Runtime(warm_pool=True)), 'all' (every runtime unless it says warm_pool=False), 'none'.",
    )
    max_wait_s: PositiveInt = Field(
        600,
        description="A pooled sandbox no conversation took within this many seconds is replaced by a fresh one "
        "(so none is handed out older than this, nor with an executor that idled out).",
    )
    retry_after_s: PositiveFloat = Field(
        30.0, description="After a pooled sandbox failed to start, the pool waits this long before it tries again."
    )

    @model_validator(mode="after")
    def _ceiling_above_floor(self) -> PoolPolicy:
        if self.max_ready_count < self.ready_count:
            raise ValueError(
                f"max_ready_count ({self.max_ready_count}) is below ready_count ({self.ready_count}): the pool's "
                "ceiling cannot be under its floor"
            )
        return self


class KubernetesPolicy(Section):
    """The Kubernetes objects a sandbox is made of (``sandbox-runtime kube manifests``)."""

    namespace: str = Field(
        "sandbox-runtime",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="The namespace of the sandbox pods, their claims and the deny-all NetworkPolicy: one nobody "
        "else writes NetworkPolicies in (policies add up).",
    )
    gvisor_runtime_class: str = Field(
        "gvisor", min_length=1, description="The RuntimeClass of gVisor on the cluster, for runtime = 'runsc'."
    )
    storage_class: str | None = Field(
        None,
        description="The StorageClass of the results volumes (block storage: ENOSPC at the quota); None: "
        "the cluster's default.",
    )
