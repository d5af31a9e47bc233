"""Policies: every limit of the runtime, with its unit in its name, loaded from TOML into frozen models.

A policy file names only what it changes; every field has a documented default (see ``policies/``).
Unknown keys are errors, so a typo never silently falls back to a default.

One module a section of the file (or a close group of sections): ``sandbox`` (``[sandbox]``, ``[pool]``,
``[kubernetes]``), ``run`` (``[run]``, ``[script_tools]``), ``store``, ``state``, ``spill``, ``tools``
(``[tools]``, ``[sql]``), ``approval``, ``mcp`` (``[mcp]`` with its upstreams and ``[mcp.auth]``), ``admission``,
``telemetry``; ``document`` holds the whole :class:`Policy` and ``loading`` reads it from TOML.
"""

from __future__ import annotations

from sandbox_runtime.policy.admission import AdmissionPolicy
from sandbox_runtime.policy.approval import ApprovalPolicy, Rule
from sandbox_runtime.policy.base import GiB, MiB
from sandbox_runtime.policy.document import Policy, policy_from_mapping
from sandbox_runtime.policy.loading import BUILTIN_POLICY_NAMES, load_policy
from sandbox_runtime.policy.mcp import McpAuthPolicy, McpPolicy, UpstreamServer
from sandbox_runtime.policy.run import RunPolicy, ScriptToolsPolicy
from sandbox_runtime.policy.sandbox import KubernetesPolicy, PoolPolicy, SandboxLimits, SandboxPolicy
from sandbox_runtime.policy.spill import SpillPolicy, ToolSpillRule
from sandbox_runtime.policy.state import StatePolicy
from sandbox_runtime.policy.store import StorePolicy
from sandbox_runtime.policy.telemetry import TelemetryPolicy
from sandbox_runtime.policy.tools import SqlPolicy, ToolsPolicy

__all__ = [
    "BUILTIN_POLICY_NAMES",
    "AdmissionPolicy",
    "ApprovalPolicy",
    "GiB",
    "KubernetesPolicy",
    "McpAuthPolicy",
    "McpPolicy",
    "MiB",
    "Policy",
    "PoolPolicy",
    "Rule",
    "RunPolicy",
    "SandboxLimits",
    "SandboxPolicy",
    "ScriptToolsPolicy",
    "SpillPolicy",
    "SqlPolicy",
    "StatePolicy",
    "StorePolicy",
    "TelemetryPolicy",
    "ToolSpillRule",
    "ToolsPolicy",
    "UpstreamServer",
    "load_policy",
    "policy_from_mapping",
]
