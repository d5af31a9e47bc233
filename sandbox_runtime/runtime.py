"""The Python API a host embeds: a :class:`Runtime` per state directory, a :class:`Conversation` per id.

::

    from sandbox_runtime import Runtime

    with Runtime("/var/lib/sandbox-runtime") as runtime:
        conversation = runtime.conversation("support-4711")
        result = conversation.run_python(code="print(6 * 7)")
        print(result.status, result.stdout)
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from sandbox_runtime.policy import Policy, load_policy
from sandbox_runtime.sandbox.backend import SandboxBackend
from sandbox_runtime.sandbox.manager import Removal, Sandbox, SandboxManager
from sandbox_runtime.sandbox.selfcheck import SelfCheckReport
from sandbox_runtime.state import StateDB
from sandbox_runtime.store.folders import ConversationFolders, ConversationStore, validate_conversation_id
from sandbox_runtime.store.quota import QuotaUsage
from sandbox_runtime.tools.run_python import RunPythonArgs, RunPythonResult, run_python

__all__ = ["Conversation", "Runtime", "default_state_dir"]

logger = logging.getLogger(__name__)


def default_state_dir(environment: Mapping[str, str] | None = None) -> Path:
    """``$SANDBOX_RUNTIME_STATE_DIR``, else ``$XDG_STATE_HOME/sandbox-runtime``, else ``~/.local/state/...``."""
    env = os.environ if environment is None else environment
    if env.get("SANDBOX_RUNTIME_STATE_DIR"):
        return Path(env["SANDBOX_RUNTIME_STATE_DIR"])
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME", "/root")) / ".local" / "state")
    return Path(base) / "sandbox-runtime"


class Conversation:
    """One conversation: its sandbox (started on first use) and its folders."""

    def __init__(self, runtime: Runtime, conversation_id: str) -> None:
        self.runtime = runtime
        self.id = validate_conversation_id(conversation_id)

    def sandbox(self) -> Sandbox:
        """The running sandbox, started (or re-attached) when needed."""
        return self.runtime.manager.get_or_create(self.id)

    @property
    def folders(self) -> ConversationFolders:
        """Where the conversation's files are on the host (made and mounted when needed)."""
        return self.runtime.manager.folders(self.id)

    def run_python(
        self,
        code: str | None = None,
        *,
        script_path: str | None = None,
        args: list[str] | None = None,
        timeout_s: float | None = None,
    ) -> RunPythonResult:
        """Run inline ``code`` or a ``script_path`` in the results folder; see :mod:`~.tools.run_python`."""
        raw: dict[str, object] = {
            "code": code,
            "script_path": script_path,
            "args": list(args or []),
            "timeout_s": timeout_s,
        }
        return run_python(self.runtime.manager, self.id, raw)

    def call_run_python(self, arguments: RunPythonArgs | dict[str, object]) -> RunPythonResult:
        """Run with arguments exactly as a model sent them (validated against the tool schema)."""
        return run_python(self.runtime.manager, self.id, arguments)

    def usage(self) -> QuotaUsage:
        """Bytes used in the results folder against the conversation's quota."""
        return self.runtime.store.usage(self.folders)

    def close(self) -> bool:
        """End the sandbox (its folders stay); True when one was running."""
        return self.runtime.manager.close(self.id)

    def delete(self) -> None:
        """End the sandbox and delete every file of the conversation (results, outputs, quota volume)."""
        manager = self.runtime.manager
        with manager.lock(self.id):
            manager.close(self.id)
            record = self.runtime.state.conversation(self.id)
            if record is not None:
                mode = record.quota_mode
                self.runtime.store.delete(self.runtime.store.folders(self.id, quota_mode=mode))  # type: ignore[arg-type]
                self.runtime.state.forget_conversation(self.id)


class Runtime:
    """Sandboxes and folders of one state directory, under one policy.

    ``backend`` defaults to Docker (``DOCKER_HOST`` honoured). ``extra_labels`` are added to every container
    (tests use one to clean up by label). At start-up orphans are swept; a background thread reaps idle and
    expired sandboxes every ``reap_interval_s`` seconds (None: no thread; call :meth:`gc`).
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
    ) -> None:
        self.policy = policy if isinstance(policy, Policy) else load_policy(policy)
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if backend is None:
            from sandbox_runtime.sandbox.docker_backend import DockerBackend  # noqa: PLC0415  (lazy: the seam)

            backend = DockerBackend()
        self.backend = backend
        if image is None:
            from sandbox_runtime.sandbox.image import executor_image_tag  # noqa: PLC0415

            image = self.policy.sandbox.image or executor_image_tag()
        self.state = StateDB(self.state_dir / "state.sqlite3")
        self.store = ConversationStore(self.state_dir, self.policy)
        self.manager = SandboxManager(backend, self.policy, self.store, self.state, image, extra_labels=extra_labels)
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        if sweep_on_start:
            self.manager.sweep_orphans()
        if reap_interval_s is not None:
            self._reaper = threading.Thread(
                target=self._reap_loop, args=(reap_interval_s,), name="sandbox-runtime-reaper", daemon=True
            )
            self._reaper.start()

    def _reap_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.manager.reap()
            except Exception:
                logger.exception("reaping idle sandboxes failed; trying again in %s s", interval_s)

    def conversation(self, conversation_id: str) -> Conversation:
        """The conversation with this id (nothing starts until it is used)."""
        return Conversation(self, conversation_id)

    def doctor(self) -> SelfCheckReport:
        """Run the canary self-check now and return every check."""
        return self.manager.self_check(force=True)

    def gc(self) -> list[Removal]:
        """Remove orphaned, idle and expired sandboxes now."""
        return self.manager.sweep_orphans()

    def close(self) -> None:
        """Stop the reaper and release the engine connection; sandboxes keep running for the next start."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=10)
        self.backend.close()
        self.state.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
