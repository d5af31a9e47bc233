"""Resident executors, one per sandbox: opened on a sandbox's first run, reused for every run after it, ended when
idle too long, when their sandbox is restarted or removed, and after any run they did not see through.

How a run over an executor ends, and what the host does then:

* ``D`` (done): the executor's verdict is the runner's; ``end`` in it (a run tampered with the channel, or a
  process outlived the sweep) ends the executor.
* The stream ended before ``S``: the executor had ended before it took the run (an earlier run killed it, or a
  sweep did); nothing ran, so the run goes to a fresh executor, once.
* Anything else after ``S`` (the executor was killed or stopped by the run, the host's deadline or cap, a broken
  channel, a cancel it did not answer): every process of the code's uid is ended, the executor with them, and the
  result has no verdict, as when the per-exec runner is ended by a signal: the exec's exit code is the only
  word, and the sandbox is asked whether it still serves.

The engine's side (opening the exec, ending every process, the exec's exit code) comes in as :class:`Engine`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol, cast

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import SandboxError, SandboxGone
from sandbox_runtime.sandbox.backend import (
    CommandStreams,
    ExecResult,
    RunnerOutput,
    RunnerVerdict,
    RunRequest,
    ScriptCalls,
)
from sandbox_runtime.sandbox.exec_stream import Caller, Watch
from sandbox_runtime.sandbox.executor_channel import Channel, Exchange
from sandbox_runtime.sandbox.run_protocol import executor_command
from sandbox_runtime.sandbox.runs import VerdictName

__all__ = ["Engine", "ResidentExecutors"]

logger = logging.getLogger(__name__)


class Engine(Protocol):
    """What the executors need of the engine."""

    @property
    def muxed(self) -> bool:
        """Whether an exec's attach stream interleaves stdout and stderr in Docker's framing (else it carries the
        executor's stdout alone)."""

    def open_exec(self, container_id: str, command: tuple[str, ...], request: RunRequest) -> tuple[Any, str]:
        """Start ``command`` with stdin attached; its attach socket and exec id (SandboxGone: no sandbox)."""

    def watch(self, container_id: str) -> Watch:
        """A watch on the container (its first process, memory and pids) for the time of one run."""

    def end_all(self, container_id: str, user: str) -> None:
        """End every process of ``user``'s uid in the container (bounded; logs when it cannot)."""

    def exec_exit_code(self, exec_id: str) -> int | None:
        """The exit code of an exec that ended (None: unknown)."""

    def still_serves(self, container_id: str, user: str, watch: Watch) -> bool:
        """Whether the sandbox still takes commands after one ended abruptly."""


class ResidentExecutors:
    """The executors of the sandboxes of one backend."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._channels: dict[str, Channel] = {}
        # per container: the office libraries its runs have used, which its next executor loads at once
        self._libraries: dict[str, tuple[str, ...]] = {}
        self._guard = threading.Lock()
        self.restarts = 0  # executors a run ended or got around: the container's next run starts a fresh one

    def run(
        self,
        container_id: str,
        request: RunRequest,
        control: CallControl | None,
        calls: ScriptCalls | None = None,
        streams: CommandStreams | None = None,
    ) -> RunnerOutput:
        started = time.monotonic()
        if control is not None and control.is_cancelled:
            return RunnerOutput(ExecResult.cancelled_before_start(), None)
        deadline = started + request.deadline_s
        for attempt in (1, 2):
            watch = self._engine.watch(container_id)
            channel = self._take(container_id, request, watch)
            caller = None
            if control is not None:
                caller = Caller(control, started, request.deadline_s, lambda: None)
            try:
                exchange = channel.run(request, deadline, watch, caller, calls, streams)
            finally:
                self._give_back(container_id, channel)
            failed = exchange.input_error or exchange.output_error
            if failed is not None:  # the run was cancelled for it (or ended first)
                self._settle(container_id, request, channel, exchange, watch, started)
                said = "input could not be read" if failed is exchange.input_error else "output could not be taken"
                raise SandboxError(f"the command's {said}: {failed}") from failed
            if exchange.stop == "eof" and not exchange.started and attempt == 1:
                self._lose(container_id)
                logger.info("the executor of %s had ended; starting a fresh one", container_id[:12])
                continue
            return self._settle(container_id, request, channel, exchange, watch, started)
        raise AssertionError("unreachable: the second attempt returns")

    def _settle(
        self,
        container_id: str,
        request: RunRequest,
        channel: Channel,
        exchange: Exchange,
        watch: Watch,
        started: float,
    ) -> RunnerOutput:
        """How a run that began came out: the executor's verdict when it saw the run through; else what is left of
        it is ended, and there is no verdict."""
        if exchange.stop == "done" and exchange.done is not None:
            with self._guard:
                self._libraries[container_id] = exchange.done.libraries
            if not exchange.done.keep:
                self._lose(container_id)
            return _finished(exchange, watch, started)
        self._lose(container_id)
        exit_code = self._engine.exec_exit_code(channel.exec_id) if exchange.stop == "eof" else None
        abrupt = exchange.stop in ("died", "eof")
        died = abrupt and not self._engine.still_serves(container_id, request.user, watch)
        if not died:
            self._engine.end_all(container_id, request.user)  # the run's processes, and the executor if it lives
        said = channel.diagnostics.decode(errors="replace").strip()
        logger.warning(
            "the executor of %s did not see a run through (%s%s)%s",
            container_id[:12],
            exchange.stop,
            "" if exit_code is None else f", exit code {exit_code}",
            f": {said[-300:]}" if said else "",
        )
        result = _exec_result(exchange, watch, started, exit_code)
        return RunnerOutput(result.model_copy(update={"container_died": died}), None)

    def preload(self, container_id: str, request: RunRequest) -> None:
        """Open the container's executor for requests like this one (and wait until it is ready), when it has
        none yet; the next such run goes to it at once."""
        channel = self._take(container_id, request, self._engine.watch(container_id))
        self._give_back(container_id, channel)

    def _take(self, container_id: str, request: RunRequest, watch: Watch) -> Channel:
        """The container's executor for requests like this one, opened (and waited for) when there is none."""
        key = (request.user, tuple(sorted(request.environment.items())), request.nproc_max)
        with self._guard:
            channel = self._channels.get(container_id)
            if channel is not None and channel.key == key and not channel.busy:
                channel.busy = True
                return channel
        if channel is not None and not channel.busy:
            self.forget(container_id)  # made for other requests (another policy): replaced
        channel = self._open(container_id, request, key, watch)
        channel.busy = True
        with self._guard:
            self._channels[container_id] = channel
        return channel

    def _open(self, container_id: str, request: RunRequest, key: tuple[object, ...], watch: Watch) -> Channel:
        """A fresh executor for the container, ready. One that said nothing at all before its start timeout is
        ended and opened again, once. (Podman's service can lose what an exec writes before its attach stream is
        connected, containers/podman#25855; the executor says ready only once it has read the host's greeting,
        which comes through that stream, so this is the fallback, not the way a lost ready frame is found.)"""
        with self._guard:
            libraries = self._libraries.get(container_id, ())
        for attempt in (1, 2):
            sock, exec_id = self._engine.open_exec(container_id, executor_command(request, libraries), request)
            channel = Channel(sock, exec_id, key, muxed=self._engine.muxed)
            if channel.ready(time.monotonic() + request.executor_start_timeout_s, watch):
                return channel
            channel.close()
            if not self._engine.still_serves(container_id, request.user, watch):
                raise SandboxGone(f"sandbox {container_id[:12]} has stopped")
            if channel.silent and attempt == 1:
                logger.warning(
                    "the executor of %s said nothing within %s s; ending it and starting another",
                    container_id[:12],
                    request.executor_start_timeout_s,
                )
                self._engine.end_all(container_id, request.user)
                continue
            said = channel.diagnostics.decode(errors="replace").strip()[-500:]
            raise SandboxError(f"the resident executor of sandbox {container_id[:12]} did not start: {said}")
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _give_back(self, container_id: str, channel: Channel) -> None:
        with self._guard:
            channel.busy = False
            if self._channels.get(container_id) is not channel:
                channel.close()

    def _lose(self, container_id: str) -> None:
        """The container's executor cannot serve another run: ended, and counted."""
        with self._guard:
            self.restarts += 1
        self.forget(container_id)

    def forget(self, container_id: str) -> None:
        """End the container's executor, if it has one (its sandbox is restarted or removed, or it is done)."""
        with self._guard:
            channel = self._channels.pop(container_id, None)
        if channel is not None and not channel.busy:
            channel.close()

    def discard(self, container_id: str) -> None:
        """The container is removed: end its executor and forget what its runs used."""
        with self._guard:
            self._libraries.pop(container_id, None)
        self.forget(container_id)

    def drop_idle(self, idle_s: float) -> int:
        """End the executors unused for ``idle_s`` seconds; how many."""
        now = time.monotonic()
        with self._guard:
            idle = [cid for cid, c in self._channels.items() if not c.busy and now - c.last_used >= idle_s]
        for container_id in idle:
            self.forget(container_id)
        return len(idle)

    def close(self) -> None:
        with self._guard:
            containers = list(self._channels)
        for container_id in containers:
            self.forget(container_id)


def _finished(exchange: Exchange, watch: Watch, started: float) -> RunnerOutput:
    """The result of a run the executor saw through (``D``)."""
    done = exchange.done
    if done is None:
        raise SandboxError("a finished run without the executor's done frame")
    if done.verdict == "cancelled":
        result = _exec_result(exchange, watch, started, None)
        return RunnerOutput(result.model_copy(update={"cancelled": True}), None)
    verdict = RunnerVerdict(cast(VerdictName, done.verdict), done.signal, done.stream)
    return RunnerOutput(_exec_result(exchange, watch, started, done.exit_code), verdict)


def _exec_result(exchange: Exchange, watch: Watch, started: float, exit_code: int | None) -> ExecResult:
    return ExecResult(
        exit_code=exit_code,
        stdout=exchange.stdout,
        stderr=exchange.stderr,
        stdout_bytes_total=exchange.totals[0],
        stderr_bytes_total=exchange.totals[1],
        over_cap=exchange.over_cap,
        deadline_hit=exchange.stop == "deadline",
        memory_bytes_seen=watch.memory_bytes_seen,
        pids_seen=watch.pids_seen,
        cancelled=exchange.cancelled,
        duration_s=time.monotonic() - started,
    )
