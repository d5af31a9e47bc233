"""How code is run in a sandbox: where the image keeps its interpreter and its helpers, the request that runs a
program under the in-sandbox runner with the policy's caps, the exec commands of the runner and of the resident
executor, and the verdict line the runner ends its stderr with."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal, cast

from sandbox_runtime.control import CallControl
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import (
    ExecRequest,
    ExecResult,
    RunnerOutput,
    RunnerVerdict,
    RunRequest,
    SandboxBackend,
)
from sandbox_runtime.sandbox.profile import code_user, exec_environment
from sandbox_runtime.sandbox.runs import VerdictName

__all__ = [
    "EXECUTOR",
    "FILES",
    "IMAGE_FILES",
    "KEEPER",
    "PYTHON",
    "RUNNER",
    "SELFCHECK",
    "end_all_command",
    "executor_command",
    "read_runner_verdict",
    "run_by_exec",
    "run_request",
    "runner_command",
]

PYTHON = "/opt/venv/bin/python"
IMAGE_FILES = "/opt/sandbox"  # the image's own programs (images/executor/*.py)
RUNNER = f"{IMAGE_FILES}/run.py"
EXECUTOR = f"{IMAGE_FILES}/executor.py"
SELFCHECK = f"{IMAGE_FILES}/selfcheck.py"
FILES = f"{IMAGE_FILES}/files.py"  # reads and writes a file as the code's uid (Conversation.read_bytes/write_bytes)
KEEPER = f"{IMAGE_FILES}/keeper.py"  # the first process where the engine gives no init (a pod): it reaps orphans

_GVISOR_PIDS_RESERVE = 64  # threads of gVisor's own kernel that count against the container's pids limit


def end_all_command() -> tuple[str, ...]:
    """The exec command, run as the code's uid, that ends every process of that uid in the sandbox: the runner's
    own sweep (SIGKILL to all it may signal until none is left, about a second at most); exit status 1 when a
    process is still left. The keeper and init run under other uids and survive it."""
    program = f"import sys; sys.path.insert(0, {RUNNER.rsplit('/', 1)[0]!r}); import run; run.sweep(0.0); "
    program += "sys.exit(1 if run._others_exist() else 0)"
    return (PYTHON, "-I", "-S", "-c", program)


def run_request(policy: Policy, timeout_s: float, program: Sequence[str], *, command: bool = False) -> RunRequest:
    """The request that runs ``program`` (the interpreter, a script, its arguments; with ``command``, a program and
    its arguments) under the in-sandbox runner with the policy's caps, grace, identity and environment."""
    nproc_max = policy.sandbox.limits.pids_max - _GVISOR_PIDS_RESERVE if policy.sandbox.runtime == "runsc" else 0
    return RunRequest(
        program=tuple(program),
        command=command,
        user=code_user(policy),
        environment=exec_environment(policy),
        working_dir=policy.sandbox.results_mount_path,
        timeout_s=timeout_s,
        grace_s=policy.run.kill_grace_s,
        deadline_margin_s=policy.run.host_deadline_margin_s,
        executor_start_timeout_s=policy.sandbox.executor_start_timeout_s,
        stdout_max_bytes=policy.run.stdout_max_bytes,
        stderr_max_bytes=policy.run.stderr_max_bytes,
        nproc_max=nproc_max,
    )


def runner_command(request: RunRequest) -> tuple[str, ...]:
    """The exec command that runs the request's program under the per-exec runner (``run.py``).

    Its exit code is the program's own; how the run ended is the runner's verdict line at the end of stderr,
    which :func:`read_runner_verdict` takes off (the runner's docstring says why the program cannot forge it).
    """
    return (
        PYTHON,
        "-I",
        "-S",
        RUNNER,
        f"{request.timeout_s:g}",
        f"{request.grace_s:g}",
        str(request.stdout_max_bytes),
        str(request.stderr_max_bytes),
        str(request.nproc_max),
        *request.program,
    )


def executor_command(request: RunRequest, libraries: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The exec command of the resident executor that runs requests like this one (``executor.py``), loading the
    office ``libraries`` the sandbox's runs have used at once."""
    return (PYTHON, "-I", EXECUTOR, str(request.nproc_max), *([",".join(libraries)] if libraries else []))


def run_by_exec(
    backend: SandboxBackend, container_id: str, request: RunRequest, control: CallControl | None = None
) -> RunnerOutput:
    """Run a request as one exec of the per-exec runner, for backends (and checks) without a resident executor."""
    exec_request = ExecRequest(
        command=runner_command(request),
        user=request.user,
        environment=request.environment,
        working_dir=request.working_dir,
        stdout_max_bytes=request.host_caps[0],
        stderr_max_bytes=request.host_caps[1],
        deadline_s=request.deadline_s,
    )
    return RunnerOutput(*read_runner_verdict(backend.exec(container_id, exec_request, control)))


# the exit code the runner ends with for each of its own verdicts (``exited`` ends with the script's status)
_VERDICT_EXITS: dict[str, int] = {"timeout": 124, "output_limit": 125, "not_started": 126, "left_running": 127}
_VERDICT_LINE = re.compile(
    rb"\0sandbox-runtime-verdict (?P<verdict>exited|timeout|output_limit|not_started|left_running) "
    rb"(?P<exit>\d{1,3}) (?P<signal>\d{1,2}|-) (?P<stream>stdout|stderr|-)\n\Z"
)
_VERDICT_LINE_MAX_BYTES = 80


def read_runner_verdict(result: ExecResult) -> tuple[ExecResult, RunnerVerdict | None]:
    """The result as the script made it (the verdict line taken off stderr) and the runner's verdict.

    The verdict is None (and the result unchanged) unless stderr ends with a well-formed verdict line whose exit code
    is the exec's own and, for the runner's own verdicts, the code the runner ends with for that verdict. With
    ``exited`` the exit code is the script's own. A verdict line anywhere else in stderr is the script's text, and
    stays in it.
    """
    match = _VERDICT_LINE.search(result.stderr, max(0, len(result.stderr) - _VERDICT_LINE_MAX_BYTES))
    if match is None or result.exit_code is None or int(match["exit"]) != result.exit_code:
        return result, None
    verdict = cast(VerdictName, match["verdict"].decode())
    signal = None if match["signal"] == b"-" else int(match["signal"])
    if _VERDICT_EXITS.get(verdict, result.exit_code) != result.exit_code or (
        signal is not None and result.exit_code != 128 + signal
    ):
        return result, None
    stream = cast(Literal["stdout", "stderr"] | None, None if match["stream"] == b"-" else match["stream"].decode())
    cut = len(result.stderr) - match.start()
    script = result.model_copy(
        update={"stderr": result.stderr[: match.start()], "stderr_bytes_total": result.stderr_bytes_total - cut}
    )
    return script, RunnerVerdict(verdict, signal, stream)
