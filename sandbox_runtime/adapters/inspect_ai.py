"""inspect_ai's sandbox contract over sandbox-runtime: ``Task(sandbox="sandbox_runtime")``.

Install ``pip install 'sandbox-runtime[inspect]'``; inspect finds the sandbox through the ``inspect_ai`` entry
point (or ``import sandbox_runtime.adapters.inspect_ai``). Each sample gets a conversation of its own (a hardened
sandbox, its results folder the working directory), deleted after the sample unless ``keep`` is set; its id is
the environment's :attr:`SandboxRuntimeEnvironment.conversation_id`, so the same conversation is reachable over
MCP and from Python while the sample runs. Configure it with :class:`SandboxRuntimeConfig`::

    Task(..., sandbox=("sandbox_runtime", SandboxRuntimeConfig(policy="podman", keep=True)))

What maps how:

* ``exec`` is :meth:`~sandbox_runtime.Conversation.exec`: input streamed, ``env`` laid over the sandbox's, a
  relative ``cwd`` in the results folder; a timeout raises ``TimeoutError`` (with the output so far), output past
  inspect's ``MAX_EXEC_OUTPUT_SIZE`` (or the policy's cap) raises ``OutputLimitExceededError``, a program that
  cannot be executed raises ``PermissionError``; a process ended by signal N returns 128 + N. ``timeout=None`` is
  the policy's ``[run] max_timeout_s``.
* ``read_file`` / ``write_file`` are ``read_bytes`` / ``write_bytes``, as the sandbox's user: Python's own errors,
  parents made on write; a file over inspect's ``MAX_READ_FILE_SIZE`` (or ``[store] read_max_bytes``) raises
  ``OutputLimitExceededError``.
* ``user``: the sandbox has one non-root user (``sandbox``, its uid); any other, ``root`` included, raises
  ``SandboxUserUnsupportedError`` before anything runs (inspect's tools then run as the default user).

Declared, never faked (the documentation's inspect page lists the conformance results): one non-root uid (no
``adduser``, no ``user=``); no network; a read-only root and a ``noexec`` ``/tmp``, so ``Sample.setup`` scripts
(run from ``/tmp``) and the tools that install a helper binary (``bash_session``, ``text_editor``,
``exec_remote``) cannot run; every process of a call ends with it; the calls of one sample are serialised.
"""

from __future__ import annotations

from typing import Any, Literal, overload

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.adapters.common import (
    SANDBOX_USER,
    UNAVAILABLE,
    RuntimePerConfig,
    conversation_id,
    in_thread,
    labels_of,
)
from sandbox_runtime.api.conversation import Conversation
from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import (
    FileTooLarge,
)
from sandbox_runtime.tools.command import CommandResult

__all__ = ["SANDBOX_NAME", "SandboxRuntimeConfig", "SandboxRuntimeEnvironment"]

SANDBOX_NAME = "sandbox_runtime"
_CONVERSATION_PREFIX = "inspect"


class SandboxRuntimeConfig(BaseModel):
    """How a task's samples get their sandboxes (frozen: inspect keeps it in sets and in its logs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: str | None = Field(
        None, description="The runtime's state directory ($SANDBOX_RUNTIME_STATE_DIR, else the user's state folder)."
    )
    policy: str = Field("default", description="A shipped policy's name (default, podman, gvisor, strict) or a path.")
    keep: bool = Field(False, description="Keep each sample's conversation (its files) after the sample.")
    labels: tuple[str, ...] = Field((), description="KEY=VALUE labels added to every container (for clean-up).")


def _make_runtime(config: SandboxRuntimeConfig) -> Runtime:
    return Runtime(
        config.state_dir,
        config.policy,
        extra_labels=labels_of(config.labels),
        reap_interval_s=60.0,
        retention_interval_s=None,
    )


_RUNTIMES: RuntimePerConfig[SandboxRuntimeConfig] = RuntimePerConfig(_make_runtime)


def _config(config: SandboxEnvironmentConfigType | None) -> SandboxRuntimeConfig:
    if config is None:
        return SandboxRuntimeConfig()
    if isinstance(config, SandboxRuntimeConfig):
        return config
    raise ValueError(f"the {SANDBOX_NAME} sandbox takes a SandboxRuntimeConfig, not {type(config).__name__} {config!r}")


@sandboxenv(name=SANDBOX_NAME)
class SandboxRuntimeEnvironment(SandboxEnvironment):
    """One sample's sandbox: a conversation of a sandbox-runtime :class:`~sandbox_runtime.Runtime`."""

    def __init__(self, conversation: Conversation, config: SandboxRuntimeConfig) -> None:
        super().__init__()
        self.conversation = conversation
        self.config = config

    def end(self, _control: object = None) -> None:
        """The sample is over: its conversation is deleted (closed, its files kept, with ``keep``)."""
        if self.config.keep:
            self.conversation.close()
        else:
            self.conversation.delete()

    @property
    def conversation_id(self) -> str:
        """The conversation's id: the same conversation over MCP (``sandbox-runtime serve``) or from Python."""
        return self.conversation.id

    # ------------------------------------------------------------------------------------------ lifecycle
    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        await in_thread(lambda _control: _RUNTIMES.get(_config(config)))

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        settings = _config(config)

        def start(_control: object) -> Conversation:
            name = conversation_id(_CONVERSATION_PREFIX, task_name, metadata.get("__sample_id__"))
            conversation = _RUNTIMES.get(settings).conversation(name)
            conversation.sandbox()  # started now: a sandbox that cannot start fails the sample here
            return conversation

        conversation = await in_thread(start)
        return {"default": cls(conversation, settings)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            await in_thread(environment.as_type(SandboxRuntimeEnvironment).end)

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        await in_thread(lambda _control: _RUNTIMES.close(_config(config)))

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup sandbox_runtime [ID]``: delete that conversation, or every conversation this
        adapter made (``inspect-*``) in the default state directory."""

        def clean(_control: object) -> None:
            with Runtime(reap_interval_s=None, retention_interval_s=None) as runtime:
                for record in runtime.state.conversations():
                    if record.id == id or (id is None and record.id.startswith(f"{_CONVERSATION_PREFIX}-")):
                        runtime.conversation(record.id).delete()

        await in_thread(clean)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return SandboxRuntimeConfig(**config)

    # ------------------------------------------------------------------------------------------ commands
    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        self._check_user(user)
        policy = self.conversation.runtime.policy
        cap = min(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE, policy.run.command_output_max_bytes)
        data = input.encode() if isinstance(input, str) else input

        def run(control: Any) -> CommandResult:
            return self.conversation.exec(
                cmd,
                stdin=data,
                cwd=cwd,
                env=env,
                timeout_s=policy.run.max_timeout_s if timeout is None else timeout,
                stdout_max_bytes=cap,
                stderr_max_bytes=cap,
                control=control,
            )

        try:
            result = await in_thread(run)
        except UNAVAILABLE as exc:
            raise SandboxUnavailableError(f"sandbox {self.conversation_id}: {exc}") from exc
        return _exec_result(cmd, result, cap)

    def _check_user(self, user: str | None) -> None:
        sandbox = self.conversation.runtime.policy.sandbox
        if user not in (None, SANDBOX_USER, str(sandbox.uid), f"{sandbox.uid}:{sandbox.gid}"):
            raise SandboxUserUnsupportedError(
                f"the sandbox runs everything as its one non-root user ({SANDBOX_USER}, uid {sandbox.uid}); "
                f"it cannot run as {user!r}"
            )

    # ------------------------------------------------------------------------------------------ files
    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode() if isinstance(contents, str) else contents
        try:
            await in_thread(lambda control: self.conversation.write_bytes(file, data, control=control))
        except UNAVAILABLE as exc:
            raise SandboxUnavailableError(f"sandbox {self.conversation_id}: {exc}") from exc

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE  # read now: inspect may lower it for this call
        ours = self.conversation.runtime.policy.store.read_max_bytes
        try:
            data = await in_thread(
                lambda control: self.conversation.read_bytes(file, max_bytes=min(limit, ours), control=control)
            )
        except FileTooLarge as exc:
            said = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR if limit <= ours else f"{ours} bytes"
            raise OutputLimitExceededError(said, None) from exc
        except UNAVAILABLE as exc:
            raise SandboxUnavailableError(f"sandbox {self.conversation_id}: {exc}") from exc
        return data.decode("utf-8") if text else data

    # ------------------------------------------------------------------------------------------ for people
    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """How a person gets a shell in the sandbox (as its user, in the results folder)."""
        self._check_user(user)
        sandbox = await in_thread(lambda _control: self.conversation.sandbox())
        policy = self.conversation.runtime.policy
        engine = "podman" if policy.sandbox.backend == "podman" else "docker"
        command = (
            f"{engine} exec -it -u {policy.sandbox.uid}:{policy.sandbox.gid} -w {policy.sandbox.results_mount_path} "
            f"{sandbox.container_id} bash"
        )
        return SandboxConnection(type=SANDBOX_NAME, command=command, container=sandbox.container_id)


class _TimedOut(TimeoutError):
    """A command's time limit ended it; inspect shows ``truncated_output`` (what it wrote until then)."""

    def __init__(self, message: str, truncated_output: str) -> None:
        super().__init__(message)
        self.truncated_output = truncated_output


def _exec_result(cmd: list[str], result: CommandResult, cap: int) -> ExecResult[str]:
    """What inspect is told of a command: its result, or the error inspect expects for how it ended."""
    stdout = result.stdout.decode("utf-8", "replace")
    stderr = result.stderr.decode("utf-8", "replace")
    if result.status == "timeout":
        raise _TimedOut(f"the command timed out: {cmd[:1]}", stdout)
    if result.status == "output_limit":
        raise OutputLimitExceededError(f"{cap} bytes", stdout)
    if result.exit_code == 126 and result.stderr == f"{cmd[0]}: Permission denied\n".encode():
        raise PermissionError(13, "Permission denied", cmd[0])  # the sandbox could not execute the program itself
    if result.status not in ("ok", "error"):  # memory_limit, quota_exceeded, cancelled: said after its stderr
        stderr += f"\n[sandbox-runtime: the command ended {result.status}]\n"
    code = result.exit_code if result.exit_code is not None else 1
    return ExecResult(success=code == 0, returncode=code, stdout=stdout, stderr=stderr)
