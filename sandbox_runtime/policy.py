"""Policies: every limit of the runtime, with its unit in its name, loaded from TOML into frozen models.

A policy file names only what it changes; every field has a documented default (see ``policies/``).
Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sandbox_runtime.errors import PolicyError
from sandbox_runtime.telemetry_policy import TelemetryPolicy
from sandbox_runtime.tenant_policy import AdmissionPolicy, McpAuthPolicy

__all__ = [
    "BUILTIN_POLICY_NAMES",
    "AdmissionPolicy",
    "ApprovalPolicy",
    "McpAuthPolicy",
    "McpPolicy",
    "Policy",
    "PoolPolicy",
    "RunPolicy",
    "SandboxLimits",
    "SandboxPolicy",
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

MiB = 1024 * 1024
GiB = 1024 * MiB
CHARS_PER_TOKEN = 4  # the estimate behind every limit given in tokens: English prose and JSON average ~4
BUILTIN_POLICY_NAMES = ("default", "strict", "gvisor", "podman")
_POLICY_DIR = Path(__file__).resolve().parent / "_data" / "policies"

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
UPSTREAM_NAME = re.compile(r"[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*")  # tools are exposed as <name>__<tool>


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SandboxLimits(_Model):
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


class SandboxPolicy(_Model):
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
    limits: SandboxLimits = SandboxLimits()


class PoolPolicy(_Model):
    """The warm pool: sandboxes started ahead of need (hardened, quota volume made, resident executor loaded), each
    handed whole to one new conversation and never to another."""

    ready_count: int = Field(
        2, ge=0, le=64, description="Sandboxes kept ready for new conversations where a pool is kept (0: none)."
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


class KubernetesPolicy(_Model):
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


class RunPolicy(_Model):
    """Limits of one ``run_python`` call."""

    default_timeout_s: float = Field(60.0, gt=0, description="Wall-clock limit when the call names none.")
    max_timeout_s: float = Field(600.0, gt=0, description="Largest timeout_s a call may ask for.")
    kill_grace_s: float = Field(2.0, ge=0, le=30, description="SIGTERM to SIGKILL grace on timeout (seconds).")
    stdout_max_bytes: PositiveInt = Field(1 * MiB, description="Captured stdout cap; past it: output_limit.")
    stderr_max_bytes: PositiveInt = Field(1 * MiB, description="Captured stderr cap; past it: output_limit.")
    inline_code_max_bytes: PositiveInt = Field(1 * MiB, description="Largest inline `code` argument.")
    script_args_max_count: PositiveInt = Field(256, description="Most entries in `args`.")
    error_message_max_chars: PositiveInt = Field(2000, description="Longest short error message for the model.")


class StorePolicy(_Model):
    """Per-conversation folders on the host."""

    quota_bytes: PositiveInt = Field(1024 * MiB, description="Disk quota of one conversation's results folder.")
    quota_mode: Literal["auto", "loop", "measured"] = Field(
        "auto",
        description="'loop': kernel-enforced ext4 image per conversation (needs root); 'measured': usage "
        "checked after each run (no root needed); 'auto': loop where possible, else measured.",
    )
    read_max_bytes: PositiveInt = Field(64 * MiB, description="Largest file the host reads from results.")


class StatePolicy(_Model):
    """Where the runtime's state (conversations, decisions, leases, tasks) lives, and how it is reached."""

    url: str | None = Field(
        None,
        description="A PostgreSQL server several replicas share (postgresql://user@host:port/database); none: the "
        "SQLite file in the state directory. $SANDBOX_RUNTIME_STATE_URL comes first. No password here (a policy "
        "file is often committed): $PGPASSWORD, ~/.pgpass or the environment variable's URL give it.",
    )
    connections_max: PositiveInt = Field(
        16, description="Most connections one runtime opens to a PostgreSQL state store at once."
    )
    connect_timeout_s: PositiveFloat = Field(
        5.0,
        description="The longest a state operation waits for a PostgreSQL connection before it fails with "
        "StateUnavailable (the server down or every connection busy).",
    )
    lease_ttl_s: PositiveFloat = Field(
        30.0,
        description="A runtime renews its lease every third of this; one on another host that did not renew it "
        "for this long counts as gone (its sandboxes may be taken over, its calls run again). A process of this "
        "host is checked by its pid at once.",
    )
    call_wait_s: PositiveFloat = Field(
        660.0,
        description="A call whose id is already running (in another thread or replica) waits this long at most "
        "for that run's decision, then fails; the decision, once stored, is its answer (never a second run).",
    )

    @field_validator("url")
    @classmethod
    def _no_password(cls, url: str | None) -> str | None:
        if url and urlsplit(url).password is not None:
            raise ValueError(
                "a state URL in a policy may not carry a password: give it by $PGPASSWORD or ~/.pgpass, or put "
                "the whole URL in $SANDBOX_RUNTIME_STATE_URL"
            )
        return url


class ToolSpillRule(_Model):
    """How one tool's results are spilled, overriding what the tool declares itself."""

    mode: Literal["normal", "self_bounded"] = Field(
        "normal", description="'self_bounded': the tool bounds its own output; never spilled or budgeted."
    )
    threshold_chars: PositiveInt | None = Field(None, description="This tool's own spill threshold.")


class SpillPolicy(_Model):
    """When a tool result goes to a file, and how much of it the model still sees inline."""

    threshold_chars: PositiveInt = Field(1000, description="Results of this many characters or more are spilled.")
    inline_cap_tokens: PositiveInt = Field(
        50_000, description="Above this (estimated as characters / 4) the model sees a preview instead."
    )
    preview_chars: PositiveInt = Field(2000, description="Preview length in characters (whole code points).")
    retention_s: PositiveInt = Field(
        7 * 86400, description="Spill, error and argument files expire after this many seconds."
    )
    retention_interval_s: PositiveInt = Field(6 * 3600, description="How often expired files are removed.")
    turn_budget_chars: PositiveInt = Field(
        200_000, description="Most characters a turn's results show inline; the largest spilled ones give way."
    )
    turn_floor_chars: PositiveInt = Field(
        5_000, description="Results shorter than this are never replaced by the turn budget."
    )
    manifest_max_bytes: PositiveInt = Field(
        64 * MiB, description="Cap of results/manifest.jsonl; past it spills are still made, not listed."
    )
    tools: dict[str, ToolSpillRule] = Field(default_factory=dict, description="Per-tool rules by tool name.")

    @property
    def inline_cap_chars(self) -> int:
        """The inline cap in characters: tokens are estimated as 4 characters each (no tokenizer runs)."""
        return self.inline_cap_tokens * CHARS_PER_TOKEN


class ToolsPolicy(_Model):
    """Limits of the built-in tools other than run_python."""

    read_max_chars: PositiveInt = Field(
        500_000, description="read_file returns at most this many characters, then a marker with the next offset."
    )
    text_file_max_bytes: PositiveInt = Field(
        4 * MiB, description="Largest file write_file creates or edit_file reads and writes."
    )
    args_file_max_bytes: PositiveInt = Field(
        1 * MiB, description="Largest arguments file delegate_call reads (checked before it is read whole)."
    )
    render_rows_max: PositiveInt = Field(2000, description="Most rows render_table draws as Markdown.")
    parallel_calls_max: int = Field(
        32,
        ge=1,
        le=1024,
        description="Calls a runtime runs at once in its one pool of workers, across all its conversations: the "
        "built-in calls of multi-call turns and MCP tasks; more wait for a free worker. A turn of one call runs in "
        "the caller's own thread.",
    )
    sort_memory_rows_max: PositiveInt = Field(
        100_000,
        description="Rows (of up to 10 columns; wider rows count proportionally) export_table sorts in memory "
        "at once; more are sorted in runs on disk.",
    )
    attachment_max_bytes: PositiveInt = Field(
        256 * MiB, description="Largest file attach_file copies into the conversation's outputs."
    )
    record_args_max_bytes: PositiveInt = Field(
        1 * MiB, description="Arguments kept in the execution record per call; longer ones are cut and marked."
    )
    table_line_max_bytes: PositiveInt = Field(
        16 * MiB,
        description="Longest line (one JSON Lines record, one CSV row) a host-side reader of a table file accepts; "
        "a longer one is a tool error naming the line.",
    )
    table_cell_max_chars: PositiveInt = Field(
        1_048_576, description="Longest cell a host-side reader of a table file accepts; longer: a tool error."
    )
    json_nesting_max: int = Field(
        64,
        ge=1,
        le=500,  # Python's serialisers and validators recurse: far below the interpreter's recursion limit
        description="Deepest nesting of arrays and objects accepted in a table file or in tool arguments (the "
        "arguments object or the row is level 1).",
    )
    render_cell_max_chars: PositiveInt = Field(
        500, description="render_table shows at most this many characters of a cell, then a marker."
    )
    render_max_chars: PositiveInt = Field(
        100_000, description="Most characters render_table returns in all; past it rows are cut with a marker."
    )
    outputs_max_bytes: PositiveInt = Field(
        1 * GiB,
        description="Bytes of distinct content all attachments of one conversation (outputs/) may take; the same "
        "content attached again is stored once and adds nothing.",
    )
    outputs_files_max: PositiveInt = Field(
        1000,
        description="Most attachments one conversation keeps: each successful attach_file counts, also when its "
        "content is already stored.",
    )


class ScriptToolsPolicy(_Model):
    """Tools a ``run_python`` script may call through ``sandbox_tools``, and how much per run. Every such call goes
    through the pipeline as a model's call does (validation, approval, the record, spill)."""

    allowed: list[str] = Field(
        default_factory=lambda: ["sql_query", "read_file", "export_table", "render_table"],
        description="Names (shell patterns: 'tracker__*') of the tools scripts may call. The default lets scripts "
        "read and reshape data inside the conversation only; host and upstream tools must be named. run_python "
        "can never be called from a run.",
    )
    calls_max_count: int = Field(100, ge=0, le=100_000, description="Most tool calls one run may make (0: none).")
    call_args_max_bytes: PositiveInt = Field(
        1 * MiB, description="Largest arguments of one call from a script, as JSON in UTF-8 (like argument files)."
    )
    calls_max_s: PositiveFloat = Field(
        300.0,
        description="Seconds one run may spend in tool calls, all together (an approval's wait included); a call "
        "is refused once they are spent. The run's own time limit stands still while a call is answered.",
    )
    reply_max_chars: PositiveInt = Field(
        100_000,
        description="Longest result text a script gets back inline; a longer one (a self-bounded tool's) is cut "
        "with a marker. Spilled results come as their path.",
    )


Rule = Literal["allow", "deny", "ask"]


class ApprovalPolicy(_Model):
    """Which calls run: judged on the real, expanded arguments (after delegate_call read its file)."""

    default_rule: Rule = Field("allow", description="The rule for tools not named in `tool_rules`.")
    tool_rules: dict[str, Rule] = Field(default_factory=dict, description="Per-tool rules by tool name.")
    rule_without_approver: Literal["allow", "deny"] = Field(
        "deny", description="What 'ask' means when the host gave no approver (and, later, no MCP elicitation)."
    )
    shown_max_chars: PositiveInt = Field(
        20_000, description="Longest arguments text an approval request shows; longer: a summary and the path."
    )


class SqlPolicy(_Model):
    """The read-only ``sql_query`` tool: offered only when a database is configured."""

    database_path: str | None = Field(
        None, description="The SQLite file sql_query reads, opened read-only; unset: no sql_query tool."
    )
    timeout_s: PositiveFloat = Field(30.0, description="A query running longer is interrupted (a tool error).")
    rows_max: PositiveInt = Field(
        1_000_000, description="Most rows one query returns; more are cut with a marker (narrow the query)."
    )
    query_max_chars: PositiveInt = Field(100_000, description="Longest SQL text accepted.")


class UpstreamServer(_Model):
    """One upstream MCP server behind the gateway: a stdio command, or a streamable HTTP URL."""

    command: list[str] | None = Field(None, description="Program and arguments started over stdio.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the command.")
    url: str | None = Field(None, description="Streamable HTTP endpoint, e.g. http://127.0.0.1:9000/mcp.")
    token_variable: str | None = Field(
        None,
        description="Environment variable whose value is sent as a bearer token to `url`; while it is unset or "
        "empty the upstream is not started (reported down, naming the variable).",
    )

    @model_validator(mode="after")
    def _one_transport(self) -> UpstreamServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (stdio) or `url` (streamable HTTP)")
        if self.command is not None and not self.command:
            raise ValueError("`command` must name a program")
        if self.token_variable is not None:
            if self.url is None:
                raise ValueError("`token_variable` is for a `url` upstream (a command gets its variables from `env`)")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.token_variable):
                raise ValueError(f"`token_variable` must name an environment variable, not {self.token_variable!r}")
        return self


class McpPolicy(_Model):
    """The MCP server (``sandbox-runtime serve``) and its gateway to upstream MCP servers."""

    http_host: str = Field("127.0.0.1", description="Address the HTTP transport binds to.")
    http_port: int = Field(8765, ge=0, le=65535, description="Port of the HTTP transport (0: any free port).")
    token_variable: str = Field(
        "SANDBOX_RUNTIME_MCP_TOKEN",
        description="Environment variable holding the bearer token HTTP clients must send; required when "
        "`http_host` is not a loopback address.",
    )
    upstream_start_timeout_s: PositiveFloat = Field(
        30.0, description="An upstream server that has not listed its tools by then is reported as down."
    )
    upstream_call_timeout_s: PositiveFloat = Field(
        300.0, description="An upstream call without an answer by then is a tool error; the upstream restarts."
    )
    upstreams: dict[str, UpstreamServer] = Field(
        default_factory=dict, description="Upstream servers by name; their tools appear as <name>__<tool>."
    )
    task_after_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="Tasks extension (2026-07-28): a long call that ends within this many seconds is answered "
        "with its result; one still running then becomes a task (0: always a task).",
    )
    task_ttl_default_s: PositiveInt = Field(
        3600, description="How long an ended task is kept, counted from its creation, when the client asks none."
    )
    task_ttl_max_s: PositiveInt = Field(86400, description="The longest a task is kept, whatever the client asks.")
    tasks_kept_max: PositiveInt = Field(
        256, description="Most tasks kept at once; the oldest ended go first, a new one is refused while all run."
    )
    shutdown_grace_s: float = Field(
        20.0,
        ge=0,
        le=3600,
        description="On SIGTERM or SIGINT, `serve` takes no new call and lets the calls in flight finish for this "
        "long; those still running then are cancelled (a second signal cancels them at once).",
    )
    shutdown_retry_after_s: PositiveInt = Field(
        5, description="While `serve --http` stops, a new call gets 503 with this many seconds in Retry-After."
    )
    auth: McpAuthPolicy = McpAuthPolicy()

    @model_validator(mode="after")
    def _upstream_names(self) -> McpPolicy:
        for name in self.upstreams:
            if not UPSTREAM_NAME.fullmatch(name):
                raise ValueError(f"upstream name {name!r} must match {UPSTREAM_NAME.pattern} (no '__')")
        return self


class Policy(_Model):
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


def load_policy(name_or_path: str | os.PathLike[str] = "default") -> Policy:
    """Load a built-in policy by name (``default``, ``strict``, ``gvisor``) or a TOML file by path."""
    text: str
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_POLICY_NAMES:
        source = f"'{name_or_path}'"
        text = (_POLICY_DIR / f"{name_or_path}.toml").read_text(encoding="utf-8")
    else:
        path = Path(name_or_path)
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(f"cannot read policy {source}: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"invalid policy {source}: not TOML: {exc}") from exc
    return policy_from_mapping(data, source)
