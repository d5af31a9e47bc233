"""Fair admission: the run slots of a runtime shared by its tenants — round-robin across tenants, first come within
one, progress while waiting, a bounded wait with a retry-after (and the wait it measured, in the Python API and in
an MCP result's quota), a cancel that leaves the queue, the disk share — and a flood of one tenant's calls through
the MCP SDK's client that another tenant's single call overtakes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import AdmissionRefused
from sandbox_runtime.mcp.server import McpService
from sandbox_runtime.pipeline.admission import Admission
from sandbox_runtime.policy import load_policy
from sandbox_runtime.policy.admission import AdmissionPolicy
from sandbox_runtime.sandbox.backend import ContainerInfo, ContainerSpec
from sandbox_runtime.sandbox.fake.backend import FakeBackend
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION
from tests.conftest import FAKE_POLICY, RuntimeFactory
from tests.mcp_helpers import call_meta, http_server, run_bounded, text_of
from tests.oauth_issuer import oauth_policy, running_issuer

WAIT_S = 30.0
TOLERANCE_S = 0.05  # a refused call waited at least max_wait_s, give or take the clock's rounding


class Holder:
    """A call that takes a slot in its own thread and holds it until released; the order grants came in is kept."""

    def __init__(self, admission: Admission, tenant: str, granted: list[str], control: CallControl | None = None):
        self.tenant = tenant
        self.release = threading.Event()
        self.running = threading.Event()
        self.failure: BaseException | None = None
        self.cancelled = False
        self._admission, self._granted, self._control = admission, granted, control
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()

    def _hold(self) -> None:
        try:
            with self._admission.slot(self.tenant, self._control) as admitted:
                if admitted.cancelled:
                    self.cancelled = True
                    return
                self._granted.append(self.tenant)
                self.running.set()
                assert self.release.wait(WAIT_S)
        except BaseException as exc:  # reported to the test
            self.failure = exc


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def _waiting(admission: Admission, tenant: str) -> int:
    return admission.quota(tenant).waiting


def test_another_tenants_single_call_gets_the_next_free_slot_ahead_of_a_burst() -> None:
    admission = Admission(AdmissionPolicy(runs_max=2, tenant_runs_max=2, max_wait_s=WAIT_S))
    granted: list[str] = []
    burst = [Holder(admission, "flooder", granted) for _ in range(2)]
    _until(lambda: len(granted) == 2, "the first two of the burst run")
    burst += [Holder(admission, "flooder", granted) for _ in range(18)]
    _until(lambda: _waiting(admission, "flooder") == 18, "eighteen wait")
    single = Holder(admission, "quiet", granted)
    _until(lambda: _waiting(admission, "quiet") == 1, "the quiet tenant's call waits")
    burst[0].release.set()
    _until(lambda: len(granted) == 3, "the freed slot is given")
    assert granted[2] == "quiet"  # ahead of the eighteen that were waiting before it
    for holder in [*burst, single]:
        holder.release.set()
    for holder in [*burst, single]:
        holder.thread.join(WAIT_S)
        assert holder.failure is None
    assert granted.count("flooder") == 20
    assert admission.quota("flooder").runs == admission.quota("quiet").runs == 0


def test_tenants_take_turns_and_each_tenant_keeps_its_own_order() -> None:
    admission = Admission(AdmissionPolicy(runs_max=1, tenant_runs_max=1, max_wait_s=WAIT_S))
    order: list[str] = []
    holders = [Holder(admission, "a", order)]
    _until(lambda: order == ["a"], "a runs")
    for tenant in ("a", "a", "a", "b", "c"):  # in this order of arrival
        holders.append(Holder(admission, tenant, order))
        _until(lambda tenant=tenant: admission.quota(tenant).waiting >= 1, f"a call of {tenant} waits")
    _until(lambda: admission.quota("a").waiting == 3, "a's three wait")
    for _ in range(5):  # one slot: each release gives it to the next in turn
        count = len(order)
        running = next(h for h in holders if h.running.is_set() and not h.release.is_set())
        running.release.set()
        _until(lambda count=count: len(order) > count, "the next is served")
    for holder in holders:
        holder.release.set()
        holder.thread.join(WAIT_S)
        assert holder.failure is None
    assert order == ["a", "b", "c", "a", "a", "a"]  # the tenant served longest ago first; a's calls in their order


def test_a_call_waits_with_its_place_reported_then_is_refused_with_a_retry_after() -> None:
    admission = Admission(AdmissionPolicy(runs_max=4, tenant_runs_max=1, max_wait_s=2.5, retry_after_s=7))
    granted: list[str] = []
    holder = Holder(admission, "busy", granted)
    _until(lambda: granted == ["busy"], "the first runs")
    said: list[str | None] = []
    control = CallControl(progress=lambda progress, total, message: said.append(message))
    with pytest.raises(AdmissionRefused) as refused, admission.slot("busy", control):
        pytest.fail("the second call of a tenant with one slot ran")
    assert refused.value.retry_after_s == 7
    assert 2.5 - TOLERANCE_S <= refused.value.waited_s < WAIT_S  # the wait it measured, as an admitted call's
    assert "admission.tenant_runs_max" in str(refused.value)
    assert "nothing ran" in str(refused.value)
    assert said
    assert "place 1 in line for tenant 'busy' (1 of 1 running)" in (said[0] or "")
    assert admission.quota("busy").waiting == 0  # it left the queue
    holder.release.set()
    holder.thread.join(WAIT_S)


def test_a_call_cancelled_while_it_waits_leaves_the_queue_and_never_runs() -> None:
    admission = Admission(AdmissionPolicy(runs_max=1, tenant_runs_max=1, max_wait_s=WAIT_S))
    granted: list[str] = []
    first = Holder(admission, "t", granted)
    _until(lambda: granted == ["t"], "the first runs")
    control = CallControl()
    waiting = Holder(admission, "t", granted, control)
    _until(lambda: admission.quota("t").waiting == 1, "the second waits")
    control.cancel()
    waiting.thread.join(WAIT_S)
    assert waiting.cancelled
    assert admission.quota("t").waiting == 0
    first.release.set()
    first.thread.join(WAIT_S)
    assert granted == ["t"]


def test_a_tenant_over_its_disk_share_is_refused_at_once_and_others_are_not() -> None:
    used = {"full": 2_000, "light": 10}
    admission = Admission(AdmissionPolicy(tenant_disk_max_bytes=1_000), disk_used=used.__getitem__)
    for tenant in used:  # not measured yet: never measured on a call's way, they go on
        with admission.slot(tenant):
            pass
    admission.measure_disk()  # the background look: the tenants that made calls since the last one
    with pytest.raises(AdmissionRefused) as refused, admission.slot("full"):
        pytest.fail("a tenant over its disk share ran")
    assert "admission.tenant_disk_max_bytes" in str(refused.value)
    assert refused.value.waited_s == 0  # refused at once
    with admission.slot("light") as admitted:
        assert admitted.waited_s == 0
    assert admission.quota("full").disk_bytes == 2_000
    used["full"] = 500  # it freed space: the next look (over-share tenants are always looked at) lets it in again
    admission.measure_disk()
    with admission.slot("full"):
        pass


def test_a_tenants_sandboxes_are_capped_and_a_closed_one_makes_room(fake_runtime_factory: RuntimeFactory) -> None:
    limits = {"tenant_sandboxes_max": 2, "max_wait_s": 1.0, "retry_after_s": 3.0}
    runtime = fake_runtime_factory(load_policy("default").changed({"admission": limits}, "the test"))
    first, second, third = (runtime.conversation(f"c{i}", tenant="capped") for i in range(3))
    other = runtime.conversation("c0", tenant="roomy")
    assert first.call("run_python", {"code": "print(1)"}).is_error is False
    assert second.call("run_python", {"code": "print(2)"}).is_error is False
    with pytest.raises(AdmissionRefused) as refused:
        third.call("run_python", {"code": "print(3)"})
    assert refused.value.retry_after_s == 3.0
    assert 1.0 - TOLERANCE_S <= refused.value.waited_s < WAIT_S  # it waited for a sandbox to end
    assert "tenant_sandboxes_max" in str(refused.value)
    assert third.call("write_file", {"path": "a.txt", "content": "no sandbox needed"}).is_error is False
    assert other.call("run_python", {"code": "print('another tenant')"}).is_error is False
    assert runtime.quota("capped").sandboxes == 2
    first.close()
    assert third.call("run_python", {"code": "print(3)"}).is_error is False


def test_a_burst_of_new_conversations_on_two_replicas_starts_side_by_side_and_never_past_the_tenants_share(
    fake_runtime_factory: RuntimeFactory, fake_backend: FakeBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    share = 3
    limits = {"tenant_sandboxes_max": share, "max_wait_s": 1.0}
    policy = load_policy("default").changed({"admission": limits}, "the test")
    replicas = [fake_runtime_factory(policy, state_dir=tmp_path / "state") for _ in range(2)]
    # every start the engine is asked for waits for the share's other starts: the engine starts them side by side
    # (the tenant's lock is not held while it works); fewer of them at once would break the barrier
    together = threading.Barrier(share, timeout=WAIT_S)
    starting, most_at_once, counted = 0, 0, threading.Lock()
    engine_start = fake_backend.create_and_start

    def start_beside_the_others(spec: ContainerSpec) -> ContainerInfo:
        nonlocal starting, most_at_once
        with counted:
            starting += 1
            most_at_once = max(most_at_once, starting + len(fake_backend.list_containers({})))
        together.wait()
        try:
            return engine_start(spec)
        finally:
            with counted:
                starting -= 1

    monkeypatch.setattr(fake_backend, "create_and_start", start_beside_the_others)
    outcomes: list[str] = []

    def first_run(number: int) -> None:
        conversation = replicas[number % 2].conversation(f"burst-{number}", tenant="bursting")
        try:
            result = conversation.run_python(f"print({number})")
            outcomes.append("ok" if result.stdout == f"{number}\n" else f"wrong: {result}")
        except AdmissionRefused:
            outcomes.append("refused")

    threads = [threading.Thread(target=first_run, args=(number,)) for number in range(2 * share)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT_S)
    assert sorted(outcomes) == ["ok"] * share + ["refused"] * share  # the share, and not one more
    assert most_at_once <= share
    assert replicas[0].quota("bursting").sandboxes == share
    first = fake_backend.list_containers({})[0]
    replicas[0].conversation_by_key(first.labels[LABEL_CONVERSATION]).close()
    assert replicas[1].quota("bursting").sandboxes == share - 1  # a start, once its sandbox is recorded, counts no more


def test_a_call_refused_its_turn_tells_the_python_api_how_long_it_waited(fake_runtime_factory: RuntimeFactory) -> None:
    limits = {"tenant_runs_max": 1, "max_wait_s": 1.0, "retry_after_s": 4.0}
    runtime = fake_runtime_factory(load_policy("default").changed({"admission": limits}, "the test"))
    conversation = runtime.conversation("c", tenant="busy")
    with runtime.admission.slot("busy"), pytest.raises(AdmissionRefused) as refused:  # its one slot is taken
        conversation.call("write_file", {"path": "a.txt", "content": "never written"})
    assert 1.0 - TOLERANCE_S <= refused.value.waited_s < WAIT_S
    assert refused.value.retry_after_s == 4.0
    assert "waited 1 s (admission.max_wait_s)" in str(refused.value)
    assert conversation.call("write_file", {"path": "a.txt", "content": "now"}).queued_s == 0  # straight in


# ---------------------------------------------------------------------------------------------- over MCP
async def _call_in_process(service: McpService, tool: str, arguments: dict[str, Any]) -> Any:
    async with Client(service.server, mode="legacy") as client:
        return await client.call_tool(tool, arguments)


def test_a_refused_calls_mcp_result_says_in_its_quota_how_long_it_waited(fake_runtime_factory: RuntimeFactory) -> None:
    limits = {"tenant_runs_max": 1, "max_wait_s": 1.0, "retry_after_s": 4.0}
    runtime = fake_runtime_factory(load_policy("default").changed({"admission": limits}, "the test"))
    service = McpService(runtime, transport="stdio", conversation="queued")
    with runtime.admission.slot(runtime.state.tenants.of_key(service.conversation_of({}))):  # its one slot is taken
        result = run_bounded(_call_in_process, service, "write_file", {"path": "a.txt", "content": "never written"})
    assert result.is_error
    assert "AdmissionRefused" in text_of(result)
    assert "waited 1 s (admission.max_wait_s)" in text_of(result)
    quota = call_meta(result)["quota"]
    assert 1.0 - TOLERANCE_S <= quota["waited_s"] < WAIT_S  # what it waited, as its text says
    assert quota["retry_after_s"] == 4.0
    assert quota["runs"] == quota["runs_max"] == 1
    admitted = run_bounded(_call_in_process, service, "write_file", {"path": "a.txt", "content": "now"})
    assert not admitted.is_error
    assert call_meta(admitted)["quota"]["waited_s"] == 0


RUN_S = 0.5


@pytest.fixture
def crowded_server(fake_served_state: Path, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    admission = "[admission]\nruns_max = 2\ntenant_runs_max = 2\nmax_wait_s = 60.0\n"
    with running_issuer() as issuer:
        policy = oauth_policy(tmp_path, issuer, base=FAKE_POLICY + admission)
        with http_server(fake_served_state, policy=policy) as url:
            yield url, issuer


async def _flood_then_single(url: str, issuer: Any) -> dict[str, Any]:
    flooder = issuer.token("flooder", url)
    quiet = issuer.token("quiet", url, alg="ES256")
    finished: list[str] = []
    seen: dict[str, Any] = {"progress": []}

    async def call(token: str, who: str, index: int, started: anyio.Event | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=120) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            if started is not None:
                started.set()

            async def heard(progress: float, total: float | None, message: str | None) -> None:
                seen["progress"].append((who, message))

            code = f"import time\ntime.sleep({RUN_S})\nprint('{who} {index}')"
            result = await client.call_tool("run_python", {"code": code}, progress_callback=heard)
            finished.append(who)
            if who == "quiet":
                seen["quiet"] = call_meta(result)
                seen["quiet_text"] = text_of(result)
                seen["flooders_done_before_quiet"] = finished.count("flooder")

    async with anyio.create_task_group() as group:
        for index in range(20):
            group.start_soon(call, flooder, "flooder", index)
        await anyio.sleep(RUN_S / 2)  # the flood is in: two run, the rest wait (a head start, not a synchronisation)
        group.start_soon(call, quiet, "quiet", 0)
    return seen


@pytest.mark.process
def test_one_tenants_flood_of_twenty_runs_does_not_hold_up_another_tenants_single_call(
    crowded_server: tuple[str, Any],
) -> None:
    url, issuer = crowded_server
    seen = run_bounded(_flood_then_single, url, issuer)
    assert "quiet 0" in seen["quiet_text"]
    assert seen["flooders_done_before_quiet"] <= 4, seen  # not behind the eighteen that waited before it
    quota = seen["quiet"]["quota"]
    assert quota["tenant"] == "quiet"
    assert quota["runs_max"] == 2
    assert quota["runs_all_max"] == 2
    assert quota["waited_s"] < 3 * RUN_S
    heard = [message for who, message in seen["progress"] if who == "flooder" and message]
    assert any("in line for tenant 'flooder'" in message for message in heard), heard[:5]
