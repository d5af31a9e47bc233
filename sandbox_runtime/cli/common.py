"""What the CLI's commands share: exit codes, tables, and the runtime a command opens."""

from __future__ import annotations

import argparse
import sys

from sandbox_runtime.api.runtime import Runtime

__all__ = ["EXIT_CODES", "EXIT_ENGINE", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "open_runtime", "progress", "table"]

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


def progress(line: str) -> None:
    print(f"  {line[:160]}", file=sys.stderr, flush=True)


def open_runtime(args: argparse.Namespace, *, sweep: bool = True) -> Runtime:
    return Runtime(
        args.state_dir,
        args.policy,
        sweep_on_start=sweep,
        reap_interval_s=None,
        retention_interval_s=None,
        extra_labels=dict(args.label),
    )
