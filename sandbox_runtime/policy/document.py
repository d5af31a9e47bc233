"""A whole policy: one field per section of a policy file, checked across sections; and a policy with changes laid
on top of it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import Field, ValidationError

from sandbox_runtime.errors import PolicyError
from sandbox_runtime.policy.admission import AdmissionPolicy
from sandbox_runtime.policy.approval import ApprovalPolicy
from sandbox_runtime.policy.base import Section
from sandbox_runtime.policy.mcp import McpPolicy
from sandbox_runtime.policy.run import RunPolicy, ScriptToolsPolicy
from sandbox_runtime.policy.sandbox import KubernetesPolicy, PoolPolicy, SandboxPolicy
from sandbox_runtime.policy.spill import SpillPolicy
from sandbox_runtime.policy.state import StatePolicy
from sandbox_runtime.policy.store import StorePolicy
from sandbox_runtime.policy.telemetry import TelemetryPolicy
from sandbox_runtime.policy.tools import SqlPolicy, ToolsPolicy

__all__ = ["Policy", "policy_from_mapping"]


class Policy(Section):
    """A whole policy: sandbox, run, store and spill settings."""

    name: str = Field("custom", description="A label shown by doctor and ls.")
    sandbox: SandboxPolicy = SandboxPolicy()
    pool: PoolPolicy = PoolPolicy()
    kubernetes: KubernetesPolicy = KubernetesPolicy()
    run: RunPolicy = RunPolicy()
    store: StorePolicy = StorePolicy()
    state: StatePolicy = StatePolicy()
    spill: SpillPolicy = SpillPolicy()
    tools: ToolsPolicy = ToolsPolicy()
    script_tools: ScriptToolsPolicy = ScriptToolsPolicy()
    approval: ApprovalPolicy = ApprovalPolicy()
    sql: SqlPolicy = SqlPolicy()
    mcp: McpPolicy = McpPolicy()
    admission: AdmissionPolicy = AdmissionPolicy()
    telemetry: TelemetryPolicy = TelemetryPolicy()

    def changed(self, changes: dict[str, Any], source: str) -> Policy:
        """This policy with ``changes`` (a nested mapping, like a policy file) laid on top, validated again;
        ``source`` names them in errors."""
        return policy_from_mapping(_merged(self.model_dump(mode="json"), changes), source)

    def digest(self) -> str:
        """A short, stable hash of every value (``doctor`` shows it). Sandboxes carry another, of what shapes them
        alone: :func:`sandbox_runtime.sandbox.profile.sandbox_identity`."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def _describe(exc: ValidationError, source: str) -> str:
    lines = [f"invalid policy {source}:"]
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"]) or "(top level)"
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def policy_from_mapping(data: dict[str, object], source: str = "(mapping)") -> Policy:
    """Validate a parsed policy mapping; raise :class:`PolicyError` naming each bad field path."""
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(_describe(exc, source)) from exc
    if policy.sandbox.runtime == "runsc" and policy.sandbox.limits.pids_max < 256:
        raise PolicyError(f"invalid policy {source}:\n  sandbox.limits.pids_max: must be >= 256 under runsc")
    if policy.run.default_timeout_s > policy.run.max_timeout_s:
        raise PolicyError(f"invalid policy {source}:\n  run.default_timeout_s: larger than run.max_timeout_s")
    if policy.spill.turn_floor_chars > policy.spill.turn_budget_chars:
        raise PolicyError(f"invalid policy {source}:\n  spill.turn_floor_chars: larger than spill.turn_budget_chars")
    return policy
