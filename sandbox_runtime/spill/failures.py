"""Full errors spill too: a failed call's whole error text goes to ``results/errors/``, the model gets it short.

The short message keeps the first line, the exception (or last meaningful) line and the file's path, and says
how long the full text is. An error that fits in ``keep_whole_chars`` is shown whole, still with the path. When
the file cannot be written (disk full, quota, a planted name) the call still fails only as the tool failed: the
model gets the error inline, cut to ``max_chars`` and marked "not saved".
"""

from __future__ import annotations

import logging
import re

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.errors import PathRejected
from sandbox_runtime.spill.spiller import file_stem, publish_once
from sandbox_runtime.store.safe_paths import ResultsRoot

__all__ = ["FailureOutcome", "shorten_error", "spill_error"]

logger = logging.getLogger(__name__)

_EXCEPTION_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Fault|Denied)\b")
_LINE_MAX_CHARS = 400


class FailureOutcome(BaseModel):
    """What the model sees of a failed call, where the full error is, and a warning when it was not saved."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    error_path: str | None = None
    warning: str | None = None


def _cut(line: str, limit: int = _LINE_MAX_CHARS) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


def shorten_error(error: str, error_path: str, *, keep_whole_chars: int) -> str:
    """First line, exception line, and the path; the whole text when it is at most ``keep_whole_chars``."""
    count = len(error.splitlines())
    lines = [line.rstrip() for line in error.splitlines() if line.strip()]
    size = f"{len(error):,} character{'s' * (len(error) != 1)}, {count:,} line{'s' * (count != 1)}"
    where = f"Full error ({size}): {error_path} — read it with read_file."
    if len(error) <= keep_whole_chars:
        return f"{error.rstrip()}\n{where}"
    if not lines:
        return where
    last = next((i for i in range(len(lines) - 1, -1, -1) if _EXCEPTION_LINE.match(lines[i])), len(lines) - 1)
    shown = [_cut(lines[0].strip())]
    if last > 0:
        shown += ["…", _cut(lines[last].strip())]
    return "\n".join([*shown, where])


def spill_error(
    root: ResultsRoot,
    error: str,
    *,
    tool: str,
    call_id: str,
    keep_whole_chars: int,
    max_chars: int,
    durable: bool = True,
) -> FailureOutcome:
    """Write ``error`` to ``errors/<tool>-<call>.txt`` and return the short message; never raises."""
    relative = f"errors/{file_stem(tool, call_id)}.txt"
    try:
        path, _new = publish_once(root, relative, error.encode("utf-8", "surrogatepass"), durable=durable)
    except (OSError, PathRejected) as exc:
        warning = f"the error of {tool} could not be saved to {relative}: {exc}"
        logger.warning(warning)
        shown = error if len(error) <= max_chars else error[:max_chars]
        cut = f" (only the first {len(shown):,} of {len(error):,} characters are shown)" if shown != error else ""
        return FailureOutcome(text=f"{shown}\n[not saved to a file{cut}: {exc}]", warning=warning)
    return FailureOutcome(text=shorten_error(error, path, keep_whole_chars=keep_whole_chars), error_path=path)
