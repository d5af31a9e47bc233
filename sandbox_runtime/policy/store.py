"""The per-conversation folders on the host (``[store]``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sandbox_runtime.policy.base import MiB, PositiveInt, Section

__all__ = ["StorePolicy"]


class StorePolicy(Section):
    """Per-conversation folders on the host."""

    quota_bytes: PositiveInt = Field(1024 * MiB, description="Disk quota of one conversation's results folder.")
    quota_mode: Literal["auto", "loop", "measured"] = Field(
        "auto",
        description="'loop': kernel-enforced ext4 image per conversation (needs root); 'measured': usage "
        "checked after each run (no root needed); 'auto': loop where possible, else measured.",
    )
    read_max_bytes: PositiveInt = Field(64 * MiB, description="Largest file the host reads from results.")
