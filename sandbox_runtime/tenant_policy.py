"""The policy of a server many tenants share: who may call it (``[mcp.auth]``, OAuth 2.1 access tokens) and how
its capacity is shared between them (``[admission]``). Part of :class:`~sandbox_runtime.policy.Policy`; every
field has a documented default in ``policies/``.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["ASYMMETRIC_ALGORITHMS", "AdmissionPolicy", "McpAuthPolicy"]

ASYMMETRIC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class McpAuthPolicy(_Model):
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
    jwks_max_bytes: Annotated[int, Field(gt=0)] = Field(1 * MiB, description="A key set larger than this is refused.")
    token_max_bytes: Annotated[int, Field(gt=0)] = Field(
        16 * KiB, description="A longer token is refused without being decoded."
    )

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


class AdmissionPolicy(_Model):
    """How a server's capacity is shared by its tenants: a call over its tenant's limit waits in a fair queue
    (first come within a tenant, round-robin across tenants), then fails with a retry-after."""

    tenant_runs_max: Annotated[int, Field(gt=0)] = Field(
        32,
        description="Calls of one tenant running at once (in this runtime); more wait their turn. The default "
        "binds no one tenant below the host-wide cap (a single-tenant host runs as before); a server many tenants "
        "share sets it lower (e.g. 4).",
    )
    runs_max: Annotated[int, Field(gt=0)] = Field(
        32, description="Calls of all tenants running at once (in this runtime): the host-wide cap."
    )
    tenant_sandboxes_max: Annotated[int, Field(gt=0)] = Field(
        1024,
        description="Live sandboxes one tenant may have (every replica's): a call needing one more waits. A server "
        "many tenants share sets it to its share (e.g. 16).",
    )
    tenant_disk_max_bytes: Annotated[int, Field(gt=0)] = Field(
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
