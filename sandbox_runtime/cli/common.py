"""What the CLI's commands share: exit codes, tables, and the runtime a command opens."""

from __future__ import annotations

import argparse
import logging
import sys

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.telemetry.logs import JsonLogFormatter

__all__ = [
    "EXIT_CODES",
    "EXIT_ENGINE",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "add_log_format",
    "configure_logging",
    "open_runtime",
    "progress",
    "say",
    "table",
]

_said = logging.getLogger("sandbox_runtime.cli")
_json_logs = {"on": False}

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_ENGINE = 0, 1, 2, 3
EXIT_CODES = (
    "exit codes: 0 success; 1 a check failed or the work did not succeed; 2 bad usage or configuration; 3 the "
    "engine or the executor image is not available"
)


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def add_log_format(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    """``--log-format``: on the command line before the command, or after it (``serve --log-format json``)."""
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=argparse.SUPPRESS if default is None else default,
        help="json: one JSON object per line on stderr (time, level, logger, message, and a call's conversation, "
        "call id, tool and trace id), from info up; default text",
    )


def configure_logging(log_format: str, verbose: bool) -> None:
    """Logs to stderr: ``text`` (shown from warnings up; with ``verbose`` from info up) or ``json`` (one object per
    line: :mod:`~sandbox_runtime.telemetry.logs`; the runtime's own from info up, other libraries' from warnings
    up), and what :func:`say` says in the same form."""
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLogFormatter())
        root = logging.getLogger()
        root.handlers[:] = [handler]
        root.setLevel(logging.WARNING)  # other libraries' warnings; the runtime's own lines from info up
        logging.getLogger("sandbox_runtime").setLevel(logging.INFO)
        _json_logs["on"] = True
    elif verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def say(line: str) -> None:
    """A line for whoever started the command, on stderr (a log record of its own when logs are JSON)."""
    if _json_logs["on"]:
        _said.info(line)
    else:
        _whole_line(line)


def progress(line: str) -> None:
    _whole_line(f"  {line[:160]}")


def _whole_line(line: str) -> None:
    """``line`` and its newline on stderr in one write, as a log record is written: a record another thread writes
    meanwhile comes before or after it, never inside it (``print`` writes the newline on its own, and a reader
    of ``serving MCP at URL`` once got the URL with a log record glued to it)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def open_runtime(args: argparse.Namespace, *, sweep: bool = True) -> Runtime:
    return Runtime(
        args.state_dir,
        args.policy,
        sweep_on_start=sweep,
        reap_interval_s=None,
        retention_interval_s=None,
        extra_labels=dict(args.label),
    )
