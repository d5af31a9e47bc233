"""The OpenAI Agents SDK's sandbox client contract over sandbox-runtime: a ``SandboxAgent``'s workspace is a
conversation.

Install ``pip install 'sandbox-runtime[openai-agents]'`` and run::

    RunConfig(sandbox=SandboxRunConfig(client=SandboxRuntimeSandboxClient(runtime),
                                       options=SandboxRuntimeClientOptions(conversation_id="support-4711")))

* ``create`` opens the conversation ``options.conversation_id`` names (a fresh one without it); the manifest's root
  is the results folder (the SDK's default ``/workspace`` is taken for it). What the sandbox cannot be is refused
  here, with ``ConfigurationError`` naming it: other users and groups (``users``, ``groups``, an entry's
  ``group``, and so ``SandboxAgent.run_as``), mounts and path grants, git repositories (no network), another root.
  Ports are not an option at all; PTYs are not offered (``supports_pty`` is False, so the model gets no
  ``write_stdin``).
* ``exec``, ``read`` and ``write`` are the conversation's :meth:`~sandbox_runtime.Conversation.exec`,
  ``read_bytes`` and ``write_bytes``, as the sandbox's user; a command's time limit raises ``ExecTimeoutError``;
  ``user=`` for any user but the sandbox's raises ``ConfigurationError``.
* ``persist_workspace`` is a tar of the results folder, its members ``./``-relative (regular files, folders and
  links only); ``hydrate_workspace`` checks every member first (the SDK's own ``validate_tarfile``: no absolute
  path, no ``..``, no hard link or device, no link out) and extracts it in the sandbox, as its user, so the quota
  holds.
* ``delete`` (the Runner's, after every run) ends the sandbox and keeps the conversation's files; ``resume`` by the
  serialised state (its ``conversation_id``) reattaches the conversation, and its files are kept as they are.
  Delete a conversation with ``runtime.conversation(id).delete()``.

The conversation id is :attr:`SandboxRuntimeSession.conversation_id` (and the state's): the same conversation is
reachable over MCP and from Python, its files shared with the model's ``run_python`` and ``export_table``.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Literal

from agents.sandbox import Manifest
from agents.sandbox.entries import GitRepo
from agents.sandbox.errors import (
    ConfigurationError,
    ErrorCode,
    ExecTimeoutError,
    ExecTransportError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.session import BaseSandboxClient, BaseSandboxClientOptions, SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tarfile

from sandbox_runtime.adapters.common import SANDBOX_USER, UNAVAILABLE, conversation_id, in_thread
from sandbox_runtime.api.conversation import Conversation
from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.control import CallControl

__all__ = [
    "BACKEND_ID",
    "SandboxRuntimeClientOptions",
    "SandboxRuntimeSandboxClient",
    "SandboxRuntimeSession",
    "SandboxRuntimeSessionState",
]

BACKEND_ID = "sandbox_runtime"
_SDK_DEFAULT_ROOT = "/workspace"
_CONVERSATION_PREFIX = "openai-agents"
_SPOOL_BYTES = 8 * 1024 * 1024  # a workspace tar is kept in memory up to this, then in a temporary file


class SandboxRuntimeClientOptions(BaseSandboxClientOptions):
    """Which conversation a session is (a fresh one when None)."""

    type: Literal["sandbox_runtime"] = "sandbox_runtime"
    conversation_id: str | None = None


class SandboxRuntimeSessionState(SandboxSessionState):
    """What a paused run keeps of its sandbox: the conversation it is."""

    type: Literal["sandbox_runtime"] = "sandbox_runtime"
    conversation_id: str


def _refused(what: str) -> ConfigurationError:
    return ConfigurationError(
        message=f"the {BACKEND_ID} sandbox cannot have {what}",
        error_code=ErrorCode.SANDBOX_CONFIG_INVALID,
        op="start",
        context={"backend": BACKEND_ID},
    )


def _checked_manifest(manifest: Manifest, results: str) -> Manifest:
    """The manifest with the results folder for its root; what the sandbox cannot be raises ConfigurationError."""
    if manifest.users or manifest.groups:
        raise _refused("other users or groups (manifest users, groups, SandboxAgent.run_as): it has one non-root uid")
    if manifest.extra_path_grants or manifest.mount_targets():
        raise _refused("mounts or path grants: the results folder is its only mount")
    for path, entry in manifest.iter_entries():
        if isinstance(entry, GitRepo):
            raise _refused(f"a git repository ({path}): it has no network")
        if entry.group is not None:
            raise _refused(f"an entry owned by a group ({path}): it has one non-root uid")
    if manifest.root not in (_SDK_DEFAULT_ROOT, results):
        raise _refused(f"the workspace root {manifest.root}: its workspace is the results folder, {results}")
    return manifest.model_copy(update={"root": results})


class SandboxRuntimeSession(BaseSandboxSession):
    """One conversation, as the SDK's sandbox session."""

    def __init__(self, state: SandboxRuntimeSessionState, conversation: Conversation) -> None:
        self.state = state
        self.conversation = conversation
        self._started = False

    @property
    def conversation_id(self) -> str:
        return self.conversation.id

    async def _ensure_backend_started(self) -> None:
        await in_thread(lambda _control: self.conversation.sandbox())
        self._started = True

    async def _shutdown_backend(self) -> None:
        self._started = False

    async def running(self) -> bool:
        return self._started

    def _should_compute_snapshot_fingerprint_on_persist(self) -> bool:
        return False  # it installs a helper in /tmp, which is noexec

    def _check_user(self, user: str | User | None) -> None:
        name = user.name if isinstance(user, User) else user
        if name not in (None, SANDBOX_USER):
            raise _refused(f"commands or files as {name!r}: it runs everything as its one user, {SANDBOX_USER}")

    def _prepare_exec_command(
        self, *command: str | Path, shell: bool | list[str], user: str | User | None
    ) -> list[str]:
        self._check_user(user)
        return super()._prepare_exec_command(*command, shell=shell, user=None)

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        argv = [str(word) for word in command]
        limit = timeout or self.conversation.runtime.policy.run.default_timeout_s
        try:
            done = await in_thread(lambda control: self.conversation.exec(argv, timeout_s=limit, control=control))
        except UNAVAILABLE as exc:
            raise ExecTransportError(command=argv, cause=exc, message=str(exc)) from exc
        if done.status == "timeout":
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        stderr = done.stderr
        if done.status not in ("ok", "error"):  # output_limit, memory_limit, quota_exceeded, cancelled
            stderr += f"\n[sandbox-runtime: the command ended {done.status}]\n".encode()
        return ExecResult(stdout=done.stdout, stderr=stderr, exit_code=1 if done.exit_code is None else done.exit_code)

    async def read(self, path: Path | str, *, user: str | User | None = None) -> io.IOBase:
        self._check_user(user)
        where = self.normalize_path(path)
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115  (handed to the caller)
        try:
            await in_thread(lambda control: self.conversation.read_to(str(where), spool, control=control))
        except FileNotFoundError as exc:
            spool.close()
            raise WorkspaceReadNotFoundError(path=where, cause=exc) from exc
        except (OSError, *UNAVAILABLE) as exc:
            spool.close()
            raise WorkspaceArchiveReadError(path=where, cause=exc) from exc
        spool.seek(0)
        return spool

    async def write(self, path: Path | str, data: io.IOBase, *, user: str | User | None = None) -> None:
        self._check_user(user)
        where = self.normalize_path(path, for_write=True)
        try:
            await in_thread(lambda control: self.conversation.write_bytes(str(where), data, control=control))
        except (OSError, *UNAVAILABLE) as exc:
            raise WorkspaceArchiveWriteError(path=where, cause=exc) from exc

    async def persist_workspace(self) -> io.IOBase:
        """A tar of the results folder, ``./``-relative: its regular files, folders and links (a link is kept as
        a link, never followed)."""
        folder = self.conversation.folders.results
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115  (handed to the caller)

        def pack(_control: CallControl) -> None:
            with tarfile.open(fileobj=spool, mode="w") as archive:
                archive.add(folder, arcname=".", filter=_portable)

        await in_thread(pack)
        spool.seek(0)
        return spool

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Extract a workspace tar into the results folder, in the sandbox as its user, once every member passed
        the SDK's own checks."""
        root = Path(self.state.manifest.root)
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115  (closed below)
        with spool:
            shutil.copyfileobj(data, spool)
            spool.seek(0)
            try:
                with tarfile.open(fileobj=spool, mode="r:*") as archive:
                    validate_tarfile(archive, allow_external_symlink_targets=False)
            except UnsafeTarMemberError as exc:
                context = {"reason": exc.reason, "member": exc.member}
                raise WorkspaceArchiveWriteError(path=root, context=context, cause=exc) from exc
            except tarfile.TarError as exc:
                raise WorkspaceArchiveWriteError(path=root, cause=exc) from exc
            spool.seek(0)
            argv = ["tar", "-x", "--no-same-owner", "--no-same-permissions", "-f", "-", "-C", str(root)]
            done = await in_thread(lambda control: self.conversation.exec(argv, stdin=spool, control=control))
        if not done.ok:
            said = done.stderr.decode(errors="replace")[-500:]
            raise WorkspaceArchiveWriteError(path=root, context={"exit_code": done.exit_code, "stderr": said})


def _portable(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """A member a workspace tar keeps: regular files, folders and symbolic links, with no owner of this host (not
    the quota volume's ``lost+found``, which is the file system's)."""
    if not (member.isfile() or member.isdir() or member.issym()) or member.name == "./lost+found":
        return None
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


class SandboxRuntimeSandboxClient(BaseSandboxClient[SandboxRuntimeClientOptions]):
    """Sandbox sessions that are conversations of ``runtime``."""

    backend_id = BACKEND_ID
    supports_default_options = True

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: SandboxRuntimeClientOptions | None = None,
    ) -> SandboxSession:
        results = self.runtime.policy.sandbox.results_mount_path
        checked = _checked_manifest(manifest or Manifest(), results)
        self._validate_manifest_for_create(checked)
        name = (options.conversation_id if options else None) or conversation_id(_CONVERSATION_PREFIX)
        session_id = uuid.uuid4()
        state = SandboxRuntimeSessionState(
            session_id=session_id,
            manifest=checked,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            conversation_id=name,
        )
        return self._wrap_session(SandboxRuntimeSession(state, self.runtime.conversation(name)))

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, SandboxRuntimeSession):
            raise TypeError(f"not a {BACKEND_ID} session: {type(inner).__name__}")
        await in_thread(lambda _control: inner.conversation.close())
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, SandboxRuntimeSessionState):
            raise TypeError(f"not a {BACKEND_ID} session state: {type(state).__name__}")
        state.assert_path_grants_rebound()
        name = state.conversation_id
        kept = await in_thread(lambda _control: self.runtime.state.conversation(name) is not None)
        session = SandboxRuntimeSession(state, self.runtime.conversation(name))
        session._set_start_state_preserved(kept)
        return self._wrap_session(session)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, SandboxRuntimeSessionState)
