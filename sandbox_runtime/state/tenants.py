"""The tenants a state has seen, by their tags (the ``tenants`` table), so that a conversation key names its tenant.

A key holds its tenant's tag, not the tenant (:mod:`~sandbox_runtime.tenancy`); the first use of a tenant writes
its tag and name once, and a runtime keeps what it read. Two tenants with one tag (80 bits of SHA-256 apart:
never in practice) are refused rather than let share conversations.
"""

from __future__ import annotations

import threading
import time

from sandbox_runtime.errors import InvalidTenant
from sandbox_runtime.state.engine import StateEngine
from sandbox_runtime.tenancy import DEFAULT_TENANT, key_tag, tenant_tag

__all__ = ["TenantNames"]


class TenantNames:
    """Tag to tenant, for one state database (cached: a tag never changes its tenant)."""

    def __init__(self, engine: StateEngine) -> None:
        self._engine = engine
        self._known: dict[str, str] = {"": DEFAULT_TENANT}
        self._guard = threading.Lock()

    def register(self, tenant: str) -> str:
        """Remember a tenant (once per state); its tag. :class:`InvalidTenant` for a tenant whose tag another
        tenant has."""
        tag = tenant_tag(tenant)
        with self._guard:
            if self._known.get(tag) == tenant:
                return tag
        with self._engine.statements() as db:
            db.run(
                "INSERT INTO tenants(tag, tenant, first_seen_at) VALUES (?, ?, ?) ON CONFLICT(tag) DO NOTHING",
                (tag, tenant, time.time()),
            )
            row = db.row("SELECT tenant FROM tenants WHERE tag = ?", (tag,))
        kept = tenant if row is None else str(row["tenant"])
        if kept != tenant:
            raise InvalidTenant(f"the tenant {tenant!r} has the tag of another tenant; it cannot be served")
        with self._guard:
            self._known[tag] = tenant
        return tag

    def of_key(self, key: str) -> str:
        """The tenant of a conversation key ("?<tag>" for a tag this state never registered)."""
        tag = key_tag(key)
        with self._guard:
            known = self._known.get(tag)
        if known is not None:
            return known
        with self._engine.statements() as db:
            row = db.row("SELECT tenant FROM tenants WHERE tag = ?", (tag,))
        if row is None:
            return f"?{tag}"
        with self._guard:
            self._known[tag] = str(row["tenant"])
        return str(row["tenant"])

    def all(self) -> dict[str, str]:
        """Every tenant the state has seen, by tag (the default tenant's tag is empty)."""
        with self._engine.statements() as db:
            rows = db.rows("SELECT tag, tenant FROM tenants")
        return {"": DEFAULT_TENANT} | {str(row["tag"]): str(row["tenant"]) for row in rows}
