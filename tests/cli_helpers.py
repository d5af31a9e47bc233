"""The command line run in the test's own process: what an operator reads (exit code, stdout, stderr) without the
second or so a new Python process costs. Tests of what only a real process shows — the installed entry point,
``python -m``, ``serve`` (its transports, signals, start-up refusals), logging set up by ``--log-format`` or
``--verbose`` — start the real command instead."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from unittest import mock

from sandbox_runtime.cli.main import main

__all__ = ["CliRun", "run_cli"]


@dataclass(frozen=True)
class CliRun:
    """How a command ended, as :class:`subprocess.CompletedProcess` would say it."""

    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """The process environment with ``changes`` (None removes a variable), as it was afterwards."""
    with mock.patch.dict(os.environ):
        for name, value in changes.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield


def run_cli(*args: str, env: Mapping[str, str | None] | None = None) -> CliRun:
    """``sandbox-runtime ARGS`` in this process, with ``env`` laid over the environment (None: unset)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with _environment(env or {}), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors and --help
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    return CliRun(code, stdout.getvalue(), stderr.getvalue())
