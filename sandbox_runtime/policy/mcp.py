"""The MCP server and its gateway (``[mcp]``, ``[mcp.upstreams.*]``) and who may call it over HTTP
(``[mcp.auth]``, OAuth 2.1 access tokens)."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from sandbox_runtime.policy.base import KiB, MiB, PositiveFloat, PositiveInt, Section

__all__ = ["ASYMMETRIC_ALGORITHMS", "UPSTREAM_NAME", "McpAuthPolicy", "McpPolicy", "UpstreamServer"]

UPSTREAM_NAME = re.compile(r"[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*")  # tools are exposed as <name>__<tool>
ASYMMETRIC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class McpAuthPolicy(Section):
    """``serve --http`` as an OAuth 2.1 resource server (the MCP authorization spec): every request carries an
    access token, a JWT the issuer signed; its tenant claim says whose conversations it reaches. Off while
    ``issuer`` is unset (a static bearer token, or none on loopback, then serves the one default tenant)."""

    issuer: str | None = Field(
        None, description="The authorization server: a token's `iss` must be exactly this. Unset: OAuth is off."
    )
    audience: str | None = Field(
        None,
        description="This server's resource identifier (RFC 8707): a token's `aud` must hold it; also the "
        "`resource` of /.well-known/oauth-protected-resource. Unset: the URL the server is reached at "
        "(http://HOST:PORT/mcp); set it when a proxy fronts the server.",
    )
    jwks_url: str | None = Field(
        None,
        description="The issuer's JSON Web Key Set (https://, or http:// on a loopback address); fetched again "
        "when a token names a key it does not hold.",
    )
    jwks_file: str | None = Field(None, description="Or a JWKS file (read again when it changes).")
    required_scopes: list[str] = Field(
        default_factory=list, description="Scopes every token must hold (else 403 insufficient_scope)."
    )
    tenant_claim: str = Field("sub", min_length=1, description="The claim naming the token's tenant.")
    algorithms: list[str] = Field(
        default_factory=lambda: sorted(ASYMMETRIC_ALGORITHMS),
        description="Signature algorithms accepted (asymmetric ones only: never `none`, never an HMAC).",
    )
    leeway_s: float = Field(30.0, ge=0, le=300, description="Clock skew allowed on `exp`, `nbf` and `iat`.")
    jwks_cache_s: float = Field(
        300.0, gt=0, description="How long a fetched key set is used before it is fetched again."
    )
    jwks_refetch_min_s: float = Field(
        10.0, ge=0, description="A token naming an unknown key fetches the set again at most this often."
    )
    jwks_timeout_s: float = Field(5.0, gt=0, le=60, description="The longest a key-set fetch may take.")
    jwks_max_bytes: PositiveInt = Field(1 * MiB, description="A key set larger than this is refused.")
    token_max_bytes: PositiveInt = Field(16 * KiB, description="A longer token is refused without being decoded.")

    @property
    def enabled(self) -> bool:
        return self.issuer is not None

    @field_validator("algorithms")
    @classmethod
    def _asymmetric_only(cls, algorithms: list[str]) -> list[str]:
        refused = sorted(set(algorithms) - ASYMMETRIC_ALGORITHMS)
        if refused:
            raise ValueError(
                f"{', '.join(refused)} may not verify access tokens (a key set holds public keys: only "
                f"{', '.join(sorted(ASYMMETRIC_ALGORITHMS))})"
            )
        if not algorithms:
            raise ValueError("at least one algorithm is needed")
        return algorithms

    @field_validator("jwks_url")
    @classmethod
    def _fetched_safely(cls, url: str | None) -> str | None:
        if url is None:
            return url
        parts = urlsplit(url)
        if parts.scheme == "https" or (parts.scheme == "http" and _loopback(parts.hostname)):
            return url
        raise ValueError("the key set is fetched over https:// (http:// only from a loopback address)")

    @model_validator(mode="after")
    def _one_key_source(self) -> McpAuthPolicy:
        if self.issuer is not None and (self.jwks_url is None) == (self.jwks_file is None):
            raise ValueError("with an issuer, give exactly one of jwks_url and jwks_file")
        return self


class UpstreamServer(Section):
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


class McpPolicy(Section):
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
