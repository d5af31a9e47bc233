"""``serve --http`` as an OAuth 2.1 resource server with a real issuer on loopback (keys made with ``cryptography``,
its JWKS served over HTTP, tokens signed by PyJWT), driven by the MCP SDKs' own clients: the refusals, each a
test; two tenants on one server, the one trying every method and URI spelling against the other's ids."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.policy import StatePolicy
from sandbox_runtime.sandbox.fake.backend import FakeBackend
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.state.location import open_engine
from sandbox_runtime.tenancy import conversation_key
from tests.client_helpers import require
from tests.conftest import FAKE_POLICY, RuntimeFactory, _delete_everything
from tests.mcp_helpers import call_meta, http_server, links_of, request_meta, run_bounded, text_of
from tests.oauth_issuer import Issuer, new_key, oauth_policy, running_issuer
from tests.test_http_safety import INITIALIZE
from tests.test_mcp_tasks import DRIVER_TIMEOUT_S, SDK, last_report, node_driver

REPO = Path(__file__).resolve().parent.parent
TASKS_DRIVER = REPO / "tests" / "clients" / "tenant_tasks_client.mjs"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
WAIT_S = 60.0
STATELESS = "2026-07-28"


class OAuthServer(NamedTuple):
    url: str
    issuer: Issuer
    state: Path

    def token(self, tenant: str | None, **changes: Any) -> str:
        return self.issuer.token(tenant, self.url, **changes)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthServer]:
    """One OAuth server (fake backend) for the module; every conversation it made is deleted afterwards."""
    folder = tmp_path_factory.mktemp("oauth")
    state = folder / "state"
    with running_issuer() as issuer:
        policy = oauth_policy(folder, issuer, base=FAKE_POLICY)
        try:
            with http_server(state, policy=policy) as url:
                yield OAuthServer(url, issuer, state)
        finally:
            _delete_everything(Runtime(state, str(policy), backend=FakeBackend(), image="fake", reap_interval_s=None))


def _post(url: str, token: str | None) -> httpx2.Response:
    """An ``initialize`` request with ``token`` as its bearer token (a ``Basic`` credential as it is)."""
    headers = dict(ACCEPT)
    if token is not None:
        headers["Authorization"] = token if token.startswith("Basic ") else f"Bearer {token}"
    return httpx2.post(url, content=INITIALIZE, headers=headers, timeout=30)


# ---------------------------------------------------------------------------------------------- refusals
def _refused_tokens() -> dict[str, Any]:
    now = int(time.time())
    return {
        "no token": lambda s: None,
        "a Basic credential": lambda s: "Basic dXNlcjpwYXNz",
        "not a JWT": lambda s: "not-a-jwt",
        "expired": lambda s: s.token("alice", exp=now - 120),
        "not valid yet": lambda s: s.token("alice", nbf=now + 600),
        "issued in the future": lambda s: s.token("alice", iat=now + 600),
        "no expiry": lambda s: s.token("alice", exp=None),
        "another issuer": lambda s: s.token("alice", iss="http://127.0.0.1:9/other-issuer"),
        "another audience": lambda s: s.token("alice", aud="http://127.0.0.1:9/mcp"),
        "alg none": lambda s: s.issuer.unsigned("alice", s.url),
        "HS256 keyed with the public key": lambda s: s.issuer.hmac_with_public_key("alice", s.url),
        "a key the issuer never published": lambda s: s.issuer.token("alice", s.url, signer=new_key("RS256")),
        "another key under a published kid": lambda s: s.issuer.token(
            "alice", s.url, signer=new_key("RS256"), kid=s.issuer.key("RS256").kid
        ),
        "ES256 naming the RSA key": lambda s: s.issuer.token(
            "alice", s.url, signer=new_key("ES256"), kid=s.issuer.key("RS256").kid
        ),
        "no tenant claim": lambda s: s.token(None),
        "the reserved default tenant": lambda s: s.token("default"),
        "a tenant with a control character": lambda s: s.token("al\u0000ice"),
        "longer than the cap": lambda s: s.token("alice", padding="x" * 20_000),
    }


@pytest.mark.parametrize("case", list(_refused_tokens()))
def test_a_request_without_a_valid_token_gets_401_naming_the_resource_metadata(server: OAuthServer, case: str) -> None:
    answer = _post(server.url, _refused_tokens()[case](server))
    assert answer.status_code == 401, answer.text
    challenge = answer.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert 'error="invalid_token"' in challenge
    origin = server.url.removesuffix("/mcp")
    assert f'resource_metadata="{origin}/.well-known/oauth-protected-resource/mcp"' in challenge


def test_a_token_without_the_required_scope_gets_403_insufficient_scope(server: OAuthServer) -> None:
    answer = _post(server.url, server.token("alice", scope="profile email"))
    assert answer.status_code == 403
    assert 'error="insufficient_scope"' in answer.headers["www-authenticate"]


def test_the_protected_resource_metadata_names_the_issuer_and_this_resource(server: OAuthServer) -> None:
    origin = server.url.removesuffix("/mcp")
    metadata = httpx2.get(f"{origin}/.well-known/oauth-protected-resource/mcp", timeout=30).json()
    assert metadata["resource"] == server.url
    assert metadata["authorization_servers"] == [server.issuer.url]
    assert metadata["scopes_supported"] == ["mcp:tools"]
    assert metadata["bearer_methods_supported"] == ["header"]


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_a_valid_token_of_each_algorithm_is_accepted(server: OAuthServer, alg: str) -> None:
    answer = _post(server.url, server.token("alice", alg=alg))
    assert answer.status_code == 200, answer.text


def test_a_key_the_issuer_adds_later_is_fetched_when_a_token_names_it(server: OAuthServer) -> None:
    rotated = new_key("ES256", kid=f"rotated-{time.monotonic_ns()}")
    server.issuer.published.append(rotated)
    fetched_before = server.issuer.fetches
    answer = _post(server.url, server.issuer.token("alice", server.url, signer=rotated))
    assert answer.status_code == 200, answer.text
    assert server.issuer.fetches == fetched_before + 1  # fetched again once, for the kid it did not hold


@pytest.mark.process
def test_a_token_of_a_key_held_is_answered_while_a_fetch_for_a_made_up_kid_hangs(tmp_path: Path) -> None:
    # the fetch may take up to 60 s; each request below gives up after 30 s: a 200 while the endpoint is held can
    # only come from a check that did not wait for that fetch (neither answered nor timed out by then)
    with running_issuer() as issuer:
        policy = oauth_policy(tmp_path, issuer, base=FAKE_POLICY, extra="jwks_timeout_s = 60.0\n")
        try:
            with http_server(tmp_path / "state", policy=policy) as url, ThreadPoolExecutor(max_workers=2) as pool:
                held = issuer.token("alice", url)
                assert _post(url, held).status_code == 200  # alice's key is now held
                made_up = issuer.token("mallory", url, signer=new_key("RS256"), kid="made-up-kid")
                with issuer.holding_jwks() as fetch_waiting:
                    refused = pool.submit(_post, url, made_up)
                    assert fetch_waiting.wait(WAIT_S), "the made-up kid did not make the server fetch the key set"
                    answer = pool.submit(_post, url, held).result(timeout=WAIT_S)
                    assert answer.status_code == 200, answer.text
                    assert not refused.done()  # its fetch is still waiting on the endpoint
                assert refused.result(timeout=WAIT_S).status_code == 401  # released: the kid is still unknown
        finally:
            _delete_everything(
                Runtime(tmp_path / "state", str(policy), backend=FakeBackend(), image="fake", reap_interval_s=None)
            )


def test_every_refusal_is_audited_with_its_reason_and_no_token_is_kept_anywhere(
    server: OAuthServer, tmp_path: Path
) -> None:
    expired = server.token("alice", exp=int(time.time()) - 120)
    forged = server.issuer.hmac_with_public_key("alice", server.url)
    assert _post(server.url, expired).status_code == 401
    assert _post(server.url, forged).status_code == 401
    accepted = server.token("alice")
    assert _post(server.url, accepted).status_code == 200
    state = StateDB(open_engine(server.state, None, StatePolicy()))
    try:
        refusals = [e for e in state.audit.entries() if e.kind == "auth_failed"]
        assert state.audit.verify().ok
    finally:
        state.close()
    reasons = [json.loads(entry.detail)["reason"] for entry in refusals]
    assert "the token has expired" in reasons
    assert "the algorithm 'HS256' is not accepted" in reasons
    assert all(json.loads(entry.detail)["client"] == "127.0.0.1" for entry in refusals)
    parts = [part.encode() for token in (expired, forged, accepted) for part in token.split(".") if part]
    for path in server.state.rglob("*"):  # no piece of any token in any file the server writes
        if path.is_file() and path.suffix != ".ext4":  # (not the sandboxes' own disk images)
            held = path.read_bytes()
            assert not [part for part in parts if part in held], path


# ---------------------------------------------------------------------------------------------- two tenants
@asynccontextmanager
async def _client(server: OAuthServer, token: str, mode: str = "legacy") -> AsyncIterator[Client]:
    """The SDK's own client over streamable HTTP, sending ``token`` (``mode``: the handshake era, or the stateless
    2026-07-28 protocol)."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http,
        Client(streamable_http_client(server.url, http_client=http), mode=mode) as client,
    ):
        yield client


def _in(conversation: str) -> types.RequestParamsMeta:
    return request_meta({"sandbox-runtime/conversation": conversation})


async def _alice_makes_her_files(server: OAuthServer) -> dict[str, Any]:
    async with _client(server, server.token("alice", alg="RS256")) as alice:
        wrote = await alice.call_tool(
            "write_file", {"path": "/mnt/results/secret.txt", "content": "alice's secret"}, meta=_in("shared")
        )
        assert not wrote.is_error, text_of(wrote)
        big = await alice.call_tool("run_python", {"code": "print('alice,' * 400)"}, meta=_in("shared"))
        attached = await alice.call_tool("attach_file", {"path": "/mnt/results/secret.txt"}, meta=_in("shared"))
        assert not attached.is_error, text_of(attached)
        listed = await alice.list_resources(meta=_in("shared"))
        return {
            "spilled_uri": str(links_of(big)[0].uri),
            "attachment_uri": next(str(link.uri) for link in links_of(attached) if "/attachments/" in str(link.uri)),
            "listed": [str(resource.uri) for resource in listed.resources],
            "meta": call_meta(wrote),
        }


async def _bob_tries_everything(server: OAuthServer, alice: dict[str, Any]) -> dict[str, Any]:
    key = conversation_key("alice", "shared")
    file_uri = alice["spilled_uri"]
    relative = file_uri.split("/results/", 1)[1]
    attachment_id = alice["attachment_uri"].rsplit("/", 1)[1]
    spellings = [
        file_uri,
        alice["attachment_uri"],
        f"sandbox-runtime://conversations/{key}/results/{relative}",
        f"sandbox-runtime://conversations/{urllib.parse.quote(key, safe='')}/results/{relative}",
        f"sandbox-runtime://conversations/{key}/attachments/{attachment_id}",
        f"sandbox-runtime://conversations/shared/results/..%2F..%2F{key}%2Fresults%2F{relative}",
        f"sandbox-runtime://conversations/shared/results/../../{key}/results/{relative}",
        f"sandbox-runtime://conversations/%73hared/results/{relative}",
        f"SANDBOX-RUNTIME://conversations/shared/results/{relative}",
        f"sandbox-runtime://conversations//shared/results/{relative}",
        f"sandbox-runtime://conversations/shared/results//mnt/results/{relative}",
        f"sandbox-runtime://conversations/shared/results/{relative}?tenant=alice",
    ]
    seen: dict[str, Any] = {"reads": {}}
    async with _client(server, server.token("bob", alg="ES256")) as bob:
        for uri in spellings:
            try:
                contents = (await bob.read_resource(uri)).contents
                seen["reads"][uri] = [getattr(c, "text", getattr(c, "blob", "")) for c in contents]
            except MCPError as exc:
                seen["reads"][uri] = f"refused: {exc}"
        read = await bob.call_tool("read_file", {"path": "/mnt/results/secret.txt"}, meta=_in("shared"))
        seen["read_file"] = (read.is_error, text_of(read))
        by_key = await bob.call_tool("read_file", {"path": "/mnt/results/secret.txt"}, meta=_in(key))
        seen["read_file_by_key"] = (by_key.is_error, text_of(by_key))
        script = "print(open('/mnt/results/secret.txt').read())"
        ran = await bob.call_tool("run_python", {"code": script}, meta=_in("shared"))
        seen["run_python"] = (ran.is_error, text_of(ran))
        seen["listed_shared"] = [str(r.uri) for r in (await bob.list_resources(meta=_in("shared"))).resources]
        seen["listed_default"] = [str(r.uri) for r in (await bob.list_resources()).resources]
        wrote = await bob.call_tool(
            "write_file", {"path": "/mnt/results/secret.txt", "content": "bob's own"}, meta=_in("shared")
        )
        seen["bob_meta"] = call_meta(wrote)
    return seen


def test_a_tenant_reaches_nothing_of_another_tenants_conversation_whatever_it_names(server: OAuthServer) -> None:
    alice = run_bounded(_alice_makes_her_files, server)
    bob = run_bounded(_bob_tries_everything, server, alice)
    assert alice["meta"]["conversation"] == "shared"  # each tenant sees its own ids, never a key
    assert bob["bob_meta"]["conversation"] == "shared"
    assert alice["listed"], "alice's files are listed to alice"
    for uri, answer in bob["reads"].items():
        assert isinstance(answer, str), (uri, answer)
        assert answer.startswith("refused:"), (uri, answer)
        assert "alice" not in answer.removeprefix("refused:").lower().replace("alice's", ""), (uri, answer)
    is_error, said = bob["read_file"]
    assert is_error
    assert "PathNotFound" in said
    is_error, said = bob["read_file_by_key"]
    assert is_error
    assert said.startswith("InvalidConversationId:")
    assert "alice's secret" not in bob["run_python"][1]
    assert not set(bob["listed_shared"]) & set(alice["listed"])
    assert not set(bob["listed_default"]) & set(alice["listed"])
    folders = sorted(path.name for path in (server.state / "conversations").iterdir())
    assert conversation_key("alice", "shared") in folders
    assert conversation_key("bob", "shared") in folders
    alice_file = server.state / "conversations" / conversation_key("alice", "shared") / "results" / "secret.txt"
    assert alice_file.read_text() == "alice's secret"  # bob's write went to his own folder


async def _stateless_tenants(server: OAuthServer) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    async with _client(server, server.token("erin"), STATELESS) as erin:
        wrote = await erin.call_tool("write_file", {"path": "/mnt/results/note.txt", "content": "erin's"})
        seen["erin"] = call_meta(wrote)
    async with _client(server, server.token("frank", alg="ES256"), STATELESS) as frank:
        read = await frank.call_tool("read_file", {"path": "/mnt/results/note.txt"})
        seen["frank"] = (read.is_error, text_of(read), call_meta(read))
    return seen


def test_stateless_requests_each_carry_their_tenant(server: OAuthServer) -> None:
    seen = run_bounded(_stateless_tenants, server)
    assert seen["erin"]["conversation"] == "mcp-http"  # each tenant's default conversation is its own
    assert seen["erin"]["quota"]["tenant"] == "erin"
    is_error, said, meta = seen["frank"]
    assert is_error
    assert "PathNotFound" in said
    assert meta["quota"]["tenant"] == "frank"
    erin_file = server.state / "conversations" / conversation_key("erin", "mcp-http") / "results" / "note.txt"
    assert erin_file.read_text() == "erin's"


SLEEPER = "import time\nopen('started.txt', 'w').write('x')\ntime.sleep(90)\nprint('never cancelled')"


@pytest.mark.process
def test_a_tenant_cannot_get_list_read_or_cancel_another_tenants_task(server: OAuthServer) -> None:
    require(SDK, "the TypeScript MCP SDK (@modelcontextprotocol/sdk)")
    request = {
        "url": server.url,
        "a_token": server.token("carol"),
        "b_token": server.token("dave", alg="ES256"),
        "code": SLEEPER,
        "timeout_ms": 120_000,
    }
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    started = server.state / "conversations" / conversation_key("carol", "mcp-http") / "results" / "started.txt"
    with node_driver(TASKS_DRIVER, request) as (driver, lines):
        created = json.loads(lines.get(timeout=WAIT_S))["created"]
        while not started.exists():  # carol's run is under way
            assert time.monotonic() < deadline, "the task's run never started"
            time.sleep(0.05)
        assert driver.stdin is not None
        driver.stdin.write("go\n")
        driver.stdin.flush()
        report = last_report(lines, deadline)
    assert "failure" not in report, report.get("failure")
    for method in ("b_get", "b_result", "b_cancel"):
        assert "error" in report[method], (method, report[method])
        assert "not found" in report[method]["error"].lower(), (method, report[method])
    assert created not in report["b_listed"]["ok"]
    assert report["a_get"]["ok"]["status"] == "working"  # dave's cancel changed nothing
    assert created in report["a_listed"]["ok"]
    assert report["a_cancel"]["ok"]["status"] == "cancelled"


def test_the_python_api_scopes_ids_to_their_tenant(fake_runtime_factory: RuntimeFactory) -> None:
    runtime = fake_runtime_factory()
    alice = runtime.conversation("shared", tenant="alice@example.com")
    bob = runtime.conversation("shared", tenant="bob@example.com")
    default = runtime.conversation("shared")
    alice.call("write_file", {"path": "/mnt/results/a.txt", "content": "alice"}, call_id="c1")
    assert alice.call("attach_file", {"path": "/mnt/results/a.txt"}).is_error is False
    said = bob.call("read_file", {"path": "/mnt/results/a.txt"}, call_id="c1")  # the same call id: not a replay
    assert said.is_error
    assert not said.replayed
    assert "PathNotFound" in said.text
    assert default.call("read_file", {"path": "/mnt/results/a.txt"}).is_error
    assert bob.attachments() == []
    assert default.attachments() == []
    assert [(c.call_id, c.tool) for c in bob.calls()] == [("c1", "read_file")]
    assert alice.key != bob.key
    assert default.key == "shared"
    assert alice.id == bob.id == "shared"
    assert runtime.state.tenants.of_key(alice.key) == "alice@example.com"
