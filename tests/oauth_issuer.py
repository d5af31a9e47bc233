"""A real token issuer for the tests, on loopback: RSA and EC keys made with ``cryptography``, its JSON Web Key Set
served over HTTP on 127.0.0.1, access tokens signed with PyJWT (RS256, ES256), and the forgeries a hostile client
would try (``alg: none``, HS256 keyed with the public key)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

TOKEN_LIFETIME_S = 600
HOLD_S = 120.0  # the longest a held JWKS keeps a fetch waiting (a test that forgets to release it still ends)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@dataclass
class SigningKey:
    kid: str
    alg: str
    private: Any

    def public_jwk(self) -> dict[str, Any]:
        maker = RSAAlgorithm if self.alg.startswith(("RS", "PS")) else ECAlgorithm
        jwk: dict[str, Any] = maker.to_jwk(self.private.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "alg": self.alg, "use": "sig"}

    def public_pem(self) -> bytes:
        return bytes(
            self.private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )


def new_key(alg: str, kid: str | None = None) -> SigningKey:
    private: Any = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if alg.startswith(("RS", "PS"))
        else ec.generate_private_key(ec.SECP256R1())
    )
    return SigningKey(kid or f"{alg.lower()}-{uuid.uuid4().hex[:8]}", alg, private)


@dataclass
class Issuer:
    """An authorization server's signing side: its keys (those published in the JWKS), and tokens."""

    url: str
    jwks_url: str
    published: list[SigningKey] = field(default_factory=list)
    fetches: int = 0
    hold: tuple[threading.Event, threading.Event] | None = None  # (a fetch is waiting, released): see holding_jwks

    @contextmanager
    def holding_jwks(self) -> Iterator[threading.Event]:
        """The JWKS endpoint held, as one slow to answer: a fetch waits until the block is left (at most
        ``HOLD_S``), then is answered. Yields an event set once a fetch is waiting."""
        waiting, released = threading.Event(), threading.Event()
        self.hold = (waiting, released)
        try:
            yield waiting
        finally:
            self.hold = None
            released.set()

    def key(self, alg: str) -> SigningKey:
        return next(key for key in self.published if key.alg == alg)

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.public_jwk() for key in self.published]}

    def claims(self, tenant: str | None, audience: str, **changes: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.url,
            "aud": audience,
            "iat": now,
            "nbf": now,
            "exp": now + TOKEN_LIFETIME_S,
            "scope": "mcp:tools",
            "client_id": "test-client",
            "jti": uuid.uuid4().hex,
        }
        if tenant is not None:
            claims["sub"] = tenant
        claims.update(changes)
        return {name: value for name, value in claims.items() if value is not None}

    def token(
        self,
        tenant: str | None,
        audience: str,
        *,
        alg: str = "RS256",
        signer: SigningKey | None = None,
        kid: str | None = None,
        **changes: Any,
    ) -> str:
        """A token signed by the published key of ``alg`` (or ``signer``), naming ``kid`` (default: the key's);
        ``changes`` set claims (None removes one)."""
        key = signer or self.key(alg)
        headers = {"kid": kid or key.kid, "typ": "at+jwt"}
        return jwt.encode(self.claims(tenant, audience, **changes), key.private, algorithm=key.alg, headers=headers)

    def unsigned(self, tenant: str, audience: str) -> str:
        """``alg: none``: a token with no signature."""
        header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
        return f"{header}.{_b64(json.dumps(self.claims(tenant, audience)).encode())}."

    def hmac_with_public_key(self, tenant: str, audience: str) -> str:
        """HS256 keyed with the published RSA key's PEM: the classic algorithm-confusion forgery."""
        key = self.key("RS256")
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": key.kid}).encode())
        body = _b64(json.dumps(self.claims(tenant, audience)).encode())
        signature = hmac.new(key.public_pem(), f"{header}.{body}".encode(), hashlib.sha256).digest()
        return f"{header}.{body}.{_b64(signature)}"


@contextmanager
def running_issuer() -> Iterator[Issuer]:
    """An issuer with an RS256 and an ES256 key, its JWKS served at ``http://127.0.0.1:PORT/jwks.json`` (a thread,
    stopped at the end); ``issuer.fetches`` counts the key set's fetches."""
    issuer = Issuer(url="", jwks_url="", published=[new_key("RS256"), new_key("ES256")])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/jwks.json":
                self.send_error(404)
                return
            issuer.fetches += 1
            if issuer.hold is not None:
                waiting, released = issuer.hold
                waiting.set()
                released.wait(HOLD_S)
            body = json.dumps(issuer.jwks()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    issuer.url = f"http://127.0.0.1:{port}"
    issuer.jwks_url = f"{issuer.url}/jwks.json"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield issuer
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def oauth_policy(folder: Path, issuer: Issuer, *, base: str = "", extra: str = "") -> Path:
    """A policy file (``base`` first, e.g. the fake backend's) with ``[mcp.auth]`` trusting ``issuer``."""
    path = folder / "oauth.toml"
    path.write_text(
        f'{base}\n[mcp.auth]\nissuer = "{issuer.url}"\njwks_url = "{issuer.jwks_url}"\n'
        f'required_scopes = ["mcp:tools"]\njwks_refetch_min_s = 0.0\n{extra}'
    )
    return path
