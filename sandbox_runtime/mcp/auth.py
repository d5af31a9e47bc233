"""``serve --http`` as an OAuth 2.1 resource server (the MCP authorization spec), on the MCP SDK's own pieces.

The SDK's ``BearerAuthBackend`` and ``RequireAuthMiddleware`` take the ``Authorization`` header and answer 401
(``WWW-Authenticate: Bearer error="invalid_token", resource_metadata="…"``) or 403 (``insufficient_scope``); its
``create_protected_resource_routes`` serves ``/.well-known/oauth-protected-resource/mcp`` (RFC 9728). What is ours
is :class:`JwtVerifier`, the ``TokenVerifier`` they call. A token is accepted only when:

- it is at most ``token_max_bytes`` long and a JWS whose ``alg`` is one the policy lists (asymmetric only: never
  ``none``, never an HMAC keyed with a public key);
- the issuer's key set (:class:`KeySet`: ``jwks_url`` or ``jwks_file``) holds its ``kid`` (or, with no ``kid``,
  exactly one key for its algorithm), of the type its algorithm needs, and the signature verifies with it; a
  ``kid`` not held fetches the set again, at most every ``jwks_refetch_min_s``, and a token of a key held never
  waits for that fetch (a made-up ``kid`` costs anyone nothing to send);
- ``iss`` is the issuer, ``aud`` holds the audience (this server's resource identifier, RFC 8707), ``exp`` is
  present and not passed, ``nbf`` and ``iat`` not ahead (each give or take ``leeway_s``);
- its tenant claim is a string naming a tenant (:func:`~sandbox_runtime.tenancy.validate_tenant`), not the
  reserved default tenant.

The token itself is never kept nor logged: what the request carries on is a :class:`TenantAccessToken` whose
``token`` is a digest of it. Every refusal is written to the audit trail with its reason (``auth_failed``; never
the token), at most ``_REFUSALS_AUDITED_PER_MIN`` a minute (those beyond are counted in the next entry).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import os
import threading
import time
import urllib.request
from typing import Any

import anyio.to_thread
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox_runtime.errors import InvalidTenant, PolicyError
from sandbox_runtime.policy.mcp import McpAuthPolicy
from sandbox_runtime.state.audit import AuditLog
from sandbox_runtime.tenancy import DEFAULT_TENANT, validate_tenant

__all__ = ["AuthRefusalAudit", "JwtVerifier", "KeySet", "TenantAccessToken", "TokenRefused", "tenant_of"]

logger = logging.getLogger(__name__)

_REFUSALS_AUDITED_PER_MIN = 60
_KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
_CURVES = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
# why the request being served was refused, for the audit entry its 401 makes (set by the verifier)
_refusal: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("sandbox_runtime_refusal", default=None)


class TokenRefused(Exception):
    """Why a token was not accepted (its message; never the token)."""


class TenantAccessToken(AccessToken):
    """An accepted access token: its tenant, scopes, client and expiry (``token`` is a digest of it)."""

    tenant: str


def tenant_of(ctx: ServerRequestContext[Any]) -> str:
    """The tenant of an MCP request: its access token's, or the default tenant (stdio, a static token, none)."""
    request = ctx.request
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    if isinstance(user, AuthenticatedUser) and isinstance(user.access_token, TenantAccessToken):
        return user.access_token.tenant
    return DEFAULT_TENANT


class KeySet:
    """The issuer's public keys, from ``jwks_url`` (cached ``jwks_cache_s``) or ``jwks_file`` (read again when its
    modification time changes); a key it does not hold makes it look again, at most every ``jwks_refetch_min_s``.

    A read of the set can take up to ``jwks_timeout_s`` and anyone can ask for one (a token naming a made-up
    ``kid``), so the keys held are looked up without waiting for any read: no lock a lookup takes is held across
    I/O, and a set past ``jwks_cache_s`` is read again in the background while its keys go on being used."""

    def __init__(self, policy: McpAuthPolicy) -> None:
        self._policy = policy
        self._keys: list[dict[str, Any]] = []
        self._read_at = float("-inf")  # monotonic, when the last read started
        self._version: object = None  # the file's (mtime, size) when read from a file
        self._refreshing = False  # a background read is under way
        self._guard = threading.Lock()  # the fields above; only ever held for a moment, never across I/O
        self._reading = threading.Lock()  # one read of the set at a time; held across I/O, so lookups never take it

    def keys_for(self, kid: str | None, alg: str, asked_at: float | None = None) -> list[dict[str, Any]]:
        """The keys a token with this header may be verified with (fetched again once when none is held)."""
        return self.held(kid, alg) or self.fetched(kid, alg, asked_at)

    def held(self, kid: str | None, alg: str) -> list[dict[str, Any]]:
        """The keys held for this header, at once: whatever read of the set is under way (slow, failing) is not
        waited for. A set past ``jwks_cache_s`` is read again meanwhile, in a thread of its own."""
        with self._guard:
            found = _matching(self._keys, kid, alg)
            refresh = bool(found) and self._stale(time.monotonic()) and not self._refreshing
            if refresh:
                self._refreshing = True
        if refresh:
            threading.Thread(target=self._refresh, name="jwks-refresh", daemon=True).start()
        return found

    def fetched(self, kid: str | None, alg: str, asked_at: float | None = None) -> list[dict[str, Any]]:
        """The keys for this header once the set has been read again (no key held matched), if the last read is at
        least ``jwks_refetch_min_s`` old. One read at a time: a read that started after this was asked for
        (``asked_at``, monotonic) is shared rather than repeated."""
        asked_at = time.monotonic() if asked_at is None else asked_at
        with self._reading:
            with self._guard:
                keys, read_at = self._keys, self._read_at
            now = time.monotonic()
            due = now - read_at >= min(self._policy.jwks_cache_s, self._policy.jwks_refetch_min_s)
            if read_at < asked_at and due:
                keys = self._load(now)
        return _matching(keys, kid, alg)

    def _stale(self, now: float) -> bool:
        return now - self._read_at >= self._policy.jwks_cache_s

    def _refresh(self) -> None:
        """Read a set past ``jwks_cache_s`` again for :meth:`held`, which went on with the keys it held."""
        try:
            with self._reading:
                now = time.monotonic()
                with self._guard:
                    stale = self._stale(now)  # (unless a fetch read it meanwhile)
                if stale:
                    self._load(now)
        except TokenRefused as exc:
            logger.warning("the key set was not refreshed: %s", exc)
        finally:
            with self._guard:
                self._refreshing = False

    def _load(self, now: float) -> list[dict[str, Any]]:
        """Read the set (the caller holds ``_reading``); its keys."""
        policy = self._policy
        try:
            if policy.jwks_file is not None:
                stat = os.stat(policy.jwks_file)
                if (stat.st_mtime_ns, stat.st_size) == self._version:
                    with self._guard:
                        self._read_at = now
                        return self._keys
                with open(policy.jwks_file, "rb") as file:
                    body = file.read(policy.jwks_max_bytes + 1)
                version: object = (stat.st_mtime_ns, stat.st_size)
            else:
                assert policy.jwks_url is not None  # noqa: S101  (the policy has one of the two)
                request = urllib.request.Request(policy.jwks_url, headers={"Accept": "application/json"})  # noqa: S310  (https, or http on loopback: the policy checked)
                with urllib.request.urlopen(request, timeout=policy.jwks_timeout_s) as answer:  # noqa: S310  (as above)
                    body = answer.read(policy.jwks_max_bytes + 1)
                version = None
            if len(body) > policy.jwks_max_bytes:
                raise TokenRefused(f"the key set is larger than {policy.jwks_max_bytes} bytes")
            keys = json.loads(body)["keys"]
            if not isinstance(keys, list) or not all(isinstance(key, dict) for key in keys):
                raise TokenRefused("the key set's `keys` is not a list of keys")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            where = policy.jwks_file or policy.jwks_url
            logger.warning("could not read the key set %s: %s", where, exc)
            with self._guard:
                self._read_at = now  # not again before jwks_refetch_min_s: a key set that is down is not hammered
            raise TokenRefused(f"the issuer's key set could not be read ({type(exc).__name__})") from exc
        with self._guard:
            self._keys, self._version, self._read_at = keys, version, now
        return keys


def _matching(keys: list[dict[str, Any]], kid: str | None, alg: str) -> list[dict[str, Any]]:
    """Keys usable for ``alg`` (right type and curve, no other ``alg``, not an encryption key), by ``kid``."""
    usable = [
        key
        for key in keys
        if key.get("kty") == _KEY_TYPES.get(alg[:2])
        and key.get("alg", alg) == alg
        and key.get("use", "sig") == "sig"
        and (alg not in _CURVES or key.get("crv") == _CURVES[alg])
    ]
    if kid is not None:
        return [key for key in usable if key.get("kid") == kid]
    return usable if len(usable) == 1 else []  # no kid: only an unambiguous key


class _KeyNotHeld(Exception):
    """No key held matches the token's header: checking it needs a read of the key set."""


class JwtVerifier:
    """The SDK's ``TokenVerifier`` for JWT access tokens (see the module text); refusals go to ``audit``."""

    def __init__(self, policy: McpAuthPolicy, audience: str) -> None:
        if policy.issuer is None:
            raise PolicyError("mcp.auth.issuer is not set: OAuth is off")
        self._policy = policy
        self._issuer = policy.issuer
        self._audience = audience
        self.keys = KeySet(policy)
        # the worker threads that wait for a key-set read: a limiter of their own, so that requests naming unknown
        # kids, however many, never take the shared worker threads the checks of keys held run on
        self._reads = anyio.CapacityLimiter(1)

    async def verify_token(self, token: str) -> AccessToken | None:
        asked_at = time.monotonic()
        try:
            try:
                return await anyio.to_thread.run_sync(self._check_held, token)
            except _KeyNotHeld:
                return await anyio.to_thread.run_sync(self.check, token, asked_at, limiter=self._reads)
        except TokenRefused as exc:
            logger.info("access token refused: %s", exc)
            said = _refusal.get()
            if said is not None:
                said.append(str(exc))
            return None

    def check(self, token: str, asked_at: float | None = None) -> TenantAccessToken:
        """The accepted token; :class:`TokenRefused` naming why not (the key set is read again, a read started
        after ``asked_at`` shared, when it holds no key for it)."""
        alg, kid = self._header(token)
        return self._verified(token, alg, kid, self.keys.keys_for(kid, alg, asked_at))

    def _check_held(self, token: str) -> TenantAccessToken:
        """:meth:`check` with the keys held only, never waiting for a read of the set: :class:`_KeyNotHeld` when
        none matches."""
        alg, kid = self._header(token)
        candidates = self.keys.held(kid, alg)
        if not candidates:
            raise _KeyNotHeld
        return self._verified(token, alg, kid, candidates)

    def _header(self, token: str) -> tuple[str, str | None]:
        """The token's ``alg`` (one the policy accepts) and ``kid``, read before any key is looked for."""
        policy = self._policy
        if len(token.encode("utf-8", "surrogatepass")) > policy.token_max_bytes:
            raise TokenRefused(f"the token is longer than {policy.token_max_bytes} bytes")
        import jwt  # noqa: PLC0415  (PyJWT with cryptography: ~0.2 s at start, needed only with [mcp.auth])

        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise TokenRefused("not a JWT") from exc
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in policy.algorithms:
            raise TokenRefused(f"the algorithm {str(alg)[:16]!r} is not accepted")
        if kid is not None and not isinstance(kid, str):
            raise TokenRefused("the key id is not a string")
        return alg, kid

    def _verified(self, token: str, alg: str, kid: str | None, candidates: list[dict[str, Any]]) -> TenantAccessToken:
        """The token checked with the first of the ``candidates`` keys for its header."""
        import jwt  # noqa: PLC0415  (as in _header: loaded by the first token)

        policy = self._policy
        if not candidates:
            named = f" (kid {kid[:64]!r})" if kid else ""
            raise TokenRefused(f"the issuer's key set holds no key for this token{named}")
        try:
            key = jwt.PyJWK(candidates[0], algorithm=alg)
            claims = jwt.decode(
                token,
                key=key.key,
                algorithms=[alg],
                audience=self._audience,
                issuer=self._issuer,
                leeway=policy.leeway_s,
                options={"require": ["exp", "iss", "aud"], "verify_iat": True},
            )
        except jwt.ExpiredSignatureError as exc:
            raise TokenRefused("the token has expired") from exc
        except jwt.ImmatureSignatureError as exc:
            raise TokenRefused("the token is not valid yet (nbf or iat ahead)") from exc
        except jwt.InvalidAudienceError as exc:
            raise TokenRefused("the token is for another audience") from exc
        except jwt.InvalidIssuerError as exc:
            raise TokenRefused("the token is from another issuer") from exc
        except jwt.MissingRequiredClaimError as exc:
            raise TokenRefused(f"the token has no {exc.claim!r} claim") from exc
        except jwt.InvalidSignatureError as exc:
            raise TokenRefused("the signature does not verify") from exc
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            raise TokenRefused(f"the token is not valid ({type(exc).__name__})") from exc
        return self._accepted(token, claims)

    def _accepted(self, token: str, claims: dict[str, Any]) -> TenantAccessToken:
        tenant = claims.get(self._policy.tenant_claim)
        try:
            validate_tenant(tenant)
        except InvalidTenant as exc:
            raise TokenRefused(f"the tenant claim {self._policy.tenant_claim!r}: {exc}") from exc
        assert isinstance(tenant, str)  # noqa: S101  (validated)
        if tenant == DEFAULT_TENANT:
            raise TokenRefused(f"the tenant claim names the reserved tenant {DEFAULT_TENANT!r}")
        scopes = claims.get("scope", claims.get("scp", ""))
        scope_list = scopes.split() if isinstance(scopes, str) else [str(s) for s in scopes or []]
        client = claims.get("client_id") or claims.get("azp") or claims.get("sub") or tenant
        return TenantAccessToken(
            token="sha256:" + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:32],
            client_id=str(client),
            scopes=scope_list,
            expires_at=int(claims["exp"]),
            resource=self._audience,
            subject=None if claims.get("sub") is None else str(claims["sub"]),
            claims={"iss": claims["iss"]},
            tenant=tenant,
        )


class AuthRefusalAudit:
    """ASGI middleware around the whole app: a 401 or 403 answer is written to the audit trail as
    ``auth_failed`` with its status, the verifier's reason (or "no bearer token"), the path and the client's
    address; never the token."""

    def __init__(self, app: ASGIApp, audit: AuditLog) -> None:
        self.app = app
        self._audit = audit
        self._window = (0.0, 0, 0)  # (minute started, entries written in it, refusals not written)
        self._guard = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        reasons: list[str] = []
        marker = _refusal.set(reasons)

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] in (401, 403):
                await anyio.to_thread.run_sync(self._write, scope, message["status"], reasons)
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            _refusal.reset(marker)

    def _write(self, scope: Scope, status: int, reasons: list[str]) -> None:
        has_header = any(name == b"authorization" for name, _ in scope.get("headers", []))
        reason = reasons[-1] if reasons else ("insufficient scope" if status == 403 else "no bearer token")
        if status == 401 and not reasons and has_header:
            reason = "not a bearer token"
        with self._guard:
            minute, written, unwritten = self._window
            now = time.monotonic()
            if now - minute >= 60:
                minute, written = now, 0
            if written >= _REFUSALS_AUDITED_PER_MIN:
                self._window = (minute, written, unwritten + 1)
                return
            self._window = (minute, written + 1, 0)
        client = scope.get("client")
        detail: dict[str, Any] = {
            "status": status,
            "reason": reason,
            "path": scope.get("path", ""),
            "client": None if client is None else str(client[0]),
        }
        if unwritten:
            detail["refusals_not_written_before"] = unwritten
        self._audit.append("auth_failed", tenant=None, **detail)
