"""How a server's capacity is shared by the tenants it serves (``[admission]``)."""

from __future__ import annotations

from pydantic import Field

from sandbox_runtime.policy.base import GiB, PositiveInt, Section

__all__ = ["AdmissionPolicy"]


class AdmissionPolicy(Section):
    """How a server's capacity is shared by its tenants: a call over its tenant's limit waits in a fair queue
    (first come within a tenant, round-robin across tenants), then fails with a retry-after."""

    tenant_runs_max: PositiveInt = Field(
        32,
        description="Calls of one tenant running at once (in this runtime); more wait their turn. The default "
        "binds no one tenant below the host-wide cap (a single-tenant host runs as before); a server many tenants "
        "share sets it lower (e.g. 4).",
    )
    runs_max: PositiveInt = Field(
        32, description="Calls of all tenants running at once (in this runtime): the host-wide cap."
    )
    tenant_sandboxes_max: PositiveInt = Field(
        1024,
        description="Live sandboxes one tenant may have (every replica's, those being started included): a call "
        "needing one more waits. A server many tenants share sets it to its share (e.g. 16).",
    )
    tenant_disk_max_bytes: PositiveInt = Field(
        1024 * GiB,
        description="Bytes one tenant's conversations' results folders may hold together (a server many tenants "
        "share sets its share, e.g. 10 GiB).",
    )
    max_wait_s: float = Field(
        120.0, ge=0, le=3600, description="The longest a call waits for its turn before it fails (retry later)."
    )
    retry_after_s: float = Field(
        10.0, gt=0, description="What a call refused after its wait tells its caller to wait before trying again."
    )
