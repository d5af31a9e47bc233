"""The Python API a host embeds: a :class:`Runtime` per state directory, a :class:`Conversation` per id.

::

    from sandbox_runtime import Runtime

    with Runtime("/var/lib/sandbox-runtime") as runtime:
        conversation = runtime.conversation("support-4711")
        result = conversation.run_python(code="print(6 * 7)")
        print(result.status, result.stdout)

        # what a model's calls go through: spill, turn budget, stored decisions
        turn = conversation.run_turn([
            ToolCall(tool="run_python", arguments={"code": "print('x' * 5000)"}, call_id="c1"),
            HostResult(tool="search", call_id="c2", result=big_json_from_my_own_tool),
        ])
        for outcome in turn.outcomes:
            send_to_model(outcome.call_id, outcome.text)
        messages = conversation.rebuild_history(my_messages)   # stored texts replayed byte for byte

``Conversation.run_python`` is the low-level call (a :class:`RunPythonResult`, nothing spilled); a model's calls
go through :meth:`Conversation.call` / :meth:`Conversation.run_turn`.

A :class:`Conversation` (:mod:`~sandbox_runtime.api.conversation`) that was deleted raises
:class:`~sandbox_runtime.errors.ConversationDeleted`; ``runtime.conversation(id)`` opens the id again afresh.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from sandbox_runtime.api.conversation import Conversation
from sandbox_runtime.conversations.service import ConversationService
from sandbox_runtime.errors import InvalidConversationId, SandboxRuntimeError, ToolNameTaken
from sandbox_runtime.models import SpillMode
from sandbox_runtime.pipeline.admission import DISK_LOOK_S, Admission, TenantQuota
from sandbox_runtime.pipeline.approval import Approver
from sandbox_runtime.pipeline.dispatch import Dispatcher
from sandbox_runtime.policy import Policy, load_policy
from sandbox_runtime.sandbox.backend import SandboxBackend
from sandbox_runtime.sandbox.engines import make_backend
from sandbox_runtime.sandbox.manager_models import Removal
from sandbox_runtime.sandbox.pool import WarmPool
from sandbox_runtime.sandbox.selfcheck import SelfCheckReport
from sandbox_runtime.spill.retention import RetentionReport, expire_results
from sandbox_runtime.state.database import StateDB
from sandbox_runtime.state.location import open_engine
from sandbox_runtime.state.location import state_url as state_url_of
from sandbox_runtime.store.folders import ConversationStore
from sandbox_runtime.telemetry.metrics import Metric, RuntimeMetrics, counter, gauge, package_version
from sandbox_runtime.tenancy import DEFAULT_TENANT, key_id, tenant_tag, validate_conversation_key
from sandbox_runtime.tools.base import ToolContext, ToolSpec
from sandbox_runtime.tools.builtin import builtin_tools
from sandbox_runtime.tools.host import host_tool
from sandbox_runtime.workers import Workers

__all__ = ["Conversation", "Runtime", "default_state_dir"]

logger = logging.getLogger(__name__)


def default_state_dir(environment: Mapping[str, str] | None = None) -> Path:
    """``$SANDBOX_RUNTIME_STATE_DIR``, else ``$XDG_STATE_HOME/sandbox-runtime``, else ``~/.local/state/...``."""
    env = os.environ if environment is None else environment
    if env.get("SANDBOX_RUNTIME_STATE_DIR"):
        return Path(env["SANDBOX_RUNTIME_STATE_DIR"])
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME", "/root")) / ".local" / "state")
    return Path(base) / "sandbox-runtime"


class Runtime:
    """Sandboxes and folders of one state directory, under one policy.

    ``backend`` defaults to the one the policy's ``sandbox.backend`` names (Docker, ``DOCKER_HOST`` honoured,
    unless it says otherwise). ``extra_labels`` are added to every container
    (tests use one to clean up by label). At start-up orphans are swept; a background thread reaps idle and
    expired sandboxes every ``reap_interval_s`` seconds (None: no thread; call :meth:`gc`), and another removes
    expired spill, error and argument files every ``retention_interval_s`` seconds ("policy": the policy's
    ``spill.retention_interval_s``, 6 hours by default; None: no thread; call :meth:`expire_files`).

    A runtime registers a lease in the state database while it is open; other runtimes on the same state
    directory (whatever their policy) never remove a sandbox it holds nor unmount a volume it uses. ``close``
    drops the lease; a lease of a process that died counts as gone.

    ``state_url``: where the state lives (:mod:`~sandbox_runtime.state.location`): a PostgreSQL URL, shared by
    several runtimes (replicas), or None for ``$SANDBOX_RUNTIME_STATE_URL``, else the policy's ``state.url``, else
    ``STATE_DIR/state.sqlite3``. The conversations' folders are in the state directory whatever the store.

    ``warm_pool``: keep sandboxes started ahead of need, each handed whole to one new conversation, as many as the
    policy's ``[pool]`` says for the demand of new conversations (:meth:`start_warm_pool`); None: as the policy's
    ``pool.keep_in`` says (``all``: yes; ``serve``, the default: only ``sandbox-runtime serve``).

    ``metrics`` is the runtime's Prometheus collector (:mod:`~sandbox_runtime.telemetry.metrics`): register it in
    your registry (``prometheus_client.REGISTRY.register(runtime.metrics)``). Its spans go to the tracer provider
    the host installed (OpenTelemetry's API; none: not recorded).
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        policy: Policy | str | os.PathLike[str] = "default",
        *,
        backend: SandboxBackend | None = None,
        image: str | None = None,
        extra_labels: dict[str, str] | None = None,
        sweep_on_start: bool = True,
        reap_interval_s: float | None = 60.0,
        retention_interval_s: float | Literal["policy"] | None = "policy",
        approver: Approver | None = None,
        warm_pool: bool | None = None,
        state_url: str | None = None,
    ) -> None:
        self.policy = policy if isinstance(policy, Policy) else load_policy(policy)
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.tools: dict[str, ToolSpec] = builtin_tools(self.policy)
        # first: a state database this version cannot open (a newer schema, a server that does not answer) is
        # refused before anything starts
        url = state_url_of(state_url, self.policy.state)
        self.state = StateDB(
            open_engine(self.state_dir, url, self.policy.state), lease_ttl_s=self.policy.state.lease_ttl_s
        )
        try:
            self.backend = make_backend(self.policy.sandbox) if backend is None else backend
            if image is None:
                from sandbox_runtime.sandbox.image import sandbox_image  # noqa: PLC0415  (a host's own backend needs no image code)

                image = sandbox_image(self.policy.sandbox)
            self.metrics = RuntimeMetrics(tools=self.tools, backend=self.backend.name)
            self.store = ConversationStore(self.state_dir, self.policy)
            self.conversations = ConversationService(
                self.backend,
                self.policy,
                self.store,
                self.state,
                image,
                extra_labels=extra_labels,
                metrics=self.metrics,
            )
            self.manager = self.conversations.manager  # the containers
        except BaseException:
            self.state.close()
            raise
        self._builtin_names = frozenset(self.tools)
        self._tools_guard = threading.Lock()
        # every thread of the runtime: the pool of parallel calls, the background jobs, services it owns
        self.workers = Workers(
            self.policy.tools.parallel_calls_max, name=f"sandbox-runtime-{self.manager.lease.id[:8]}"
        )
        self.admission = Admission(
            self.policy.admission,
            disk_used=lambda tenant: self.conversations.tenant_bytes(tenant_tag(tenant)),
            metrics=self.metrics,
        )
        self.dispatcher = Dispatcher(
            self.state,
            self.policy,
            self.tools,
            self._tool_context,
            self.workers,
            approver=approver,
            lease_id=self.manager.lease.id,
            admission=self.admission,
            metrics=self.metrics,
        )
        self._add_gauges()
        self._closed = False
        if sweep_on_start:
            try:
                self.conversations.sweep()
            except BaseException:
                self.workers.close()
                self.manager.end_lease()  # no runtime came of it: nothing of this process holds anything
                self.state.close()
                raise
        if warm_pool or (warm_pool is None and self.policy.pool.keep_in == "all"):
            self.start_warm_pool()
        self.workers.every(self.policy.state.lease_ttl_s / 3, "lease", self._keep_lease)
        self.workers.every(DISK_LOOK_S, "tenant-disk", self.admission.measure_disk)
        if reap_interval_s is not None:
            self.workers.every(reap_interval_s, "reaper", self.conversations.reap)
        if retention_interval_s == "policy":
            retention_interval_s = self.policy.spill.retention_interval_s
        if retention_interval_s is not None:
            self.workers.every(retention_interval_s, "retention", self.expire_files)

    def _keep_lease(self) -> None:
        """Renew this runtime's lease, then make the writes the state owes (claims to give back, tasks to end):
        a claim that outlived its attempt while the state was away holds up other replicas' retries until then."""
        self.manager.renew_lease()
        self.state.owed.settle()

    def _add_gauges(self) -> None:
        """What a scrape reads of this runtime's state: its sandboxes and pool, the admission queue and the
        tenants' disk, the free disk of the state directory, and what it is."""
        series_max = self.policy.telemetry.metrics_tenant_series_max
        self.metrics.add_gauges("sandboxes", self.conversations.gauges)
        self.metrics.add_gauges("admission", lambda: self.admission.gauges(series_max))
        self.metrics.add_gauges("runtime", self._gauges)

    def _gauges(self) -> Iterator[Metric]:
        free = shutil.disk_usage(self.state_dir).free
        yield gauge("state_disk_free_bytes", "Free bytes of the filesystem of the state directory.", free)
        what = (package_version(), self.backend.name, self.state.engine.kind)
        yield gauge("info", "What this runtime is (always 1).", [(what, 1)], ["version", "backend", "state_store"])
        lost = float(self.state.audit.lost_total)
        yield counter(
            "audit_entries_lost", "Audit entries the state store refused (AUDIT ENTRY LOST).", [((), lost)], []
        )

    @property
    def pool(self) -> WarmPool | None:
        """The warm pool this runtime keeps (None: none)."""
        return self.conversations.pool

    def start_warm_pool(self, ready_count: int | None = None, *, refill: bool = True) -> WarmPool | None:
        """Keep sandboxes started, hardened and loaded ahead of need, each handed whole to one new conversation and
        never to another (:mod:`~sandbox_runtime.sandbox.pool`): as many as new conversations asked for one within
        the policy's ``pool.demand_window_s``, at least ``ready_count`` (default: the policy's
        ``pool.ready_count``), at most ``pool.max_ready_count`` (or ``ready_count`` when higher); they start in the
        background at once. ``refill=False``: a pool for one new conversation (``ready_count`` sandboxes, none
        started after its take; ``serve`` over stdio). Nothing happens when the policy's ``pool.keep_in`` is
        ``none``, ``pool.max_ready_count`` is 0, or a pool is kept already. ``close`` removes the sandboxes still
        waiting. Returns the pool (None: none)."""
        policy = self.policy.pool
        if self.pool is not None or policy.keep_in == "none" or policy.max_ready_count == 0:
            return self.pool
        if ready_count is not None:
            ceiling = ready_count if not refill else max(ready_count, policy.max_ready_count)
            policy = policy.model_copy(update={"ready_count": ready_count, "max_ready_count": ceiling})
        pool = self.conversations.start_pool(policy, refill=refill)
        pool.wake = self.workers.every(pool.interval_s, "pool", pool.tend, first_now=True)
        return pool

    def _tool_context(self, conversation_id: str) -> ToolContext:
        folders = self.conversations.folders(conversation_id)
        return ToolContext(
            sandbox=self.conversations.handle(conversation_id, folders),
            conversation_id=conversation_id,
            root=self.store.results_root(folders),
            outputs=folders.outputs,
            policy=self.policy,
            expired=lambda path: self.state.expired_file(conversation_id, path),
            record_attachment=lambda attachment: self.state.record_attachment(conversation_id, attachment),
        )

    def register_tool(
        self,
        name: str,
        handler: Callable[..., object],
        *,
        description: str,
        input_schema: dict[str, Any],
        spill_mode: SpillMode = "normal",
        pass_call: bool = False,
        title: str | None = None,
        annotations: dict[str, Any] | None = None,
        output_schema: dict[str, Any] | None = None,
    ) -> None:
        """Make one of the host's own tools callable through the pipeline (``call``, turns, ``delegate_call``).

        ``handler`` gets the validated arguments and returns the result (text, JSON, an MCP ``CallToolResult``
        or a :class:`~sandbox_runtime.spill.streamed.TableStream`); an exception it raises becomes a tool error
        the model reads. ``input_schema`` is a JSON schema the arguments are validated against (after a
        delegate_call expanded them). A name outside ``^[a-zA-Z0-9_-]{1,64}$`` or a schema that is not a JSON
        schema raises ``ValueError``; a name a built-in tool or a tool registered before has (the gateway's
        upstream tools are registered as ``<upstream>__<tool>``) raises
        :class:`~sandbox_runtime.errors.ToolNameTaken` (a ``ValueError`` too), naming what has it: nothing is
        ever replaced. With ``pass_call=True`` the handler is called as ``handler(arguments, call)``
        with a :class:`~sandbox_runtime.tools.host.HostCall` (conversation, call id, results folder, cancellation
        and progress). ``title``, ``annotations`` (MCP tool annotations) and ``output_schema`` are shown to MCP
        clients as they are.
        """
        spec = host_tool(
            name,
            handler,
            description=description,
            schema=input_schema,
            mode=spill_mode,
            pass_call=pass_call,
            title=title,
            annotations=annotations,
            output_schema=output_schema,
        )
        with self._tools_guard:
            taken = self.tools.get(name)
            if taken is not None:
                raise ToolNameTaken(
                    f"the tool name {name!r} is taken by {self._holder(taken)}; register yours under another name"
                )
            self.tools[name] = spec

    def _holder(self, spec: ToolSpec) -> str:
        """What has a tool's name, in words: the built-in, or the registered tool with its description's start."""
        if spec.name in self._builtin_names:
            return f"the built-in tool {spec.name}"
        said = spec.description.strip().splitlines()[0] if spec.description.strip() else ""
        said = said if len(said) <= 80 else said[:79] + "…"
        return f"a tool registered before ({said!r})" if said else "a tool registered before"

    def conversation(self, conversation_id: str, *, tenant: str = DEFAULT_TENANT) -> Conversation:
        """The conversation with this id (nothing starts until it is used); after a deletion, a new one.

        ``tenant``: whose it is (:mod:`~sandbox_runtime.tenancy`). Ids are scoped to their tenant: the same id of
        another tenant is another conversation, with its own sandbox, folders, records and attachments; nothing
        of one tenant's is reachable by naming an id as another."""
        return Conversation(self, conversation_id, tenant=tenant)

    def quota(self, tenant: str = DEFAULT_TENANT, *, waited_s: float = 0.0) -> TenantQuota:
        """What ``tenant`` uses of its share of this runtime now (runs, live sandboxes, disk as last measured) and
        may use (the policy's ``[admission]``); ``waited_s``: a call's own wait, carried along."""
        sandboxes = self.state.live_sandbox_count(tenant_tag(tenant))
        return self.admission.quota(tenant, waited_s=waited_s, sandboxes=sandboxes)

    def conversation_by_key(self, key: str) -> Conversation:
        """The conversation a key names (a record's ``id``, ``ls``'s first column): its id, of its tenant."""
        validate_conversation_key(key)
        tenant = self.state.tenants.of_key(key)
        if tenant.startswith("?"):
            raise InvalidConversationId(f"{key!r} is a key of a tenant this state never saw")
        return Conversation(self, key_id(key), tenant=tenant)

    def doctor(self) -> SelfCheckReport:
        """Run the canary self-check now and return every check."""
        return self.manager.self_check(force=True)

    def gc(self) -> list[Removal]:
        """Remove orphaned, idle and expired sandboxes now (never one another live runtime holds), and release
        the quota volumes no sandbox and no live runtime uses."""
        return self.conversations.sweep()

    def expire_files(self, now: float | None = None) -> list[RetentionReport]:
        """Remove every conversation's spill, error and argument files older than ``spill.retention_s`` (and the
        per-turn totals of turns that old)."""
        moment = time.time() if now is None else now
        self.state.forget_turns_before(moment - self.policy.spill.retention_s)
        reports = []
        for record in self.state.conversations():
            with self.conversations.lock(record.id):
                if self.state.conversation(record.id) is None:
                    continue  # deleted meanwhile: never make its folders again
                with self.conversations.borrowed(record.id) as folders:  # mounted for the sweep only, when unused
                    report = expire_results(
                        self.state,
                        record.id,
                        folders.results,
                        self.policy.sandbox.results_mount_path,
                        retention_s=self.policy.spill.retention_s,
                        now=moment,
                    )
            self.metrics.retention_removed_files.inc(report.removed_files)
            self.metrics.retention_removed_bytes.inc(report.removed_bytes)
            reports.append(report)
        return reports

    def close(self) -> None:
        """Remove the sandboxes still waiting in the warm pool (with their slots), stop the background jobs and the
        services the runtime owns (a gateway registered in it), cancel the calls still waiting for a worker and
        wait (up to 10 s) for those that run, unmount the conversations' quota volumes this runtime mounted and no
        other live process uses, drop this runtime's lease and release the engine connection. Conversations'
        sandboxes keep running (on their own mount of their folder) for the next start to re-attach, which mounts
        the folder again; nothing of this runtime stays mounted, so the state directory can be removed right
        after. Closing again only releases the state connections a use after the first close opened."""
        if self._closed:
            self.state.close()
            return
        self._closed = True
        if self.pool is not None:
            self.pool.close()  # first: its job starts no more sandboxes, and those waiting go with their slots
        self.workers.close()  # the jobs, the services it owns (a gateway), then the calls in flight (bounded)
        try:
            self.conversations.release_all()
        except SandboxRuntimeError as exc:  # the engine gone, say: close goes on; the next start's sweep sees to it
            logger.warning("could not release everything this runtime mounted: %s", exc)
        self.manager.end_lease()
        self.backend.close()
        self.state.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
