"""What the model is shown of one tool result: its body (spilled to a file, or whole), the stand-in the turn budget
may show instead, the file's descriptor, and what follows the body (the failure's short form, the notes).

The pipeline calls :func:`shown_result` once per call that ran, with what the tool returned; it decides nothing
here about the call itself (whether it failed, how it is stored), only what its result looks like to the model.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sandbox_runtime.models import ResultDescriptor, SpillMode
from sandbox_runtime.policy import SpillPolicy
from sandbox_runtime.spill.failures import spill_error
from sandbox_runtime.spill.spiller import result_text, spill_result
from sandbox_runtime.spill.streamed import TableStream
from sandbox_runtime.store.safe_paths import ResultsRoot

__all__ = ["ShownResult", "shown_result", "spill_rule", "spill_threshold_chars"]


@dataclass
class ShownResult:
    """One result as the model will see it, before the turn budget."""

    body: str = ""  # the result, or its spill notice
    stand_in: str | None = None  # what the turn budget may show instead of the body
    tail: str = ""  # the short error, notes: shown after the body (or the stand-in) either way
    descriptor: ResultDescriptor | None = None
    error_path: str | None = None
    warnings: list[str] = field(default_factory=list)
    rows_failed: bool = False  # a table's rows stopped with an error: what came is kept, and the call failed


def spill_rule(
    policy: SpillPolicy, tool: str, mode: SpillMode, threshold_chars: int | None
) -> tuple[SpillMode, int | None]:
    """How ``tool``'s results are spilled: what the tool declares (``mode``, ``threshold_chars``), unless the
    policy names the tool in ``[spill.tools]``."""
    rule = policy.tools.get(tool)
    if rule is not None:
        mode, threshold_chars = rule.mode, rule.threshold_chars or threshold_chars
    return mode, threshold_chars


def spill_threshold_chars(policy: SpillPolicy, tool: str) -> int:
    """The length from which results of ``tool`` (one that declares no threshold of its own) are spilled."""
    return spill_rule(policy, tool, "normal", None)[1] or policy.threshold_chars


def shown_result(
    root: ResultsRoot,
    content: object,
    *,
    error: str | None,
    note: str | None,
    built: ResultDescriptor | None,
    error_path: str | None,
    tool: str,
    call_id: str,
    mode: SpillMode,
    threshold_chars: int | None,
    policy: SpillPolicy,
    now: dt.datetime,
) -> ShownResult:
    """The result a tool returned (``content``; ``error``, its full failure text; ``note``, a status line;
    ``built``, the file a file-building tool made; ``error_path``, the full error the tool saved itself) as the
    model will see it: its body spilled (or not), its error saved and shortened, its notes after them. The files
    are written but not synced: the caller syncs the results folder once for the turn."""
    shown = ShownResult(error_path=error_path)
    if mode == "self_bounded":
        shown.body = result_text(content)
    else:
        spilled = spill_result(
            root,
            content,
            tool=tool,
            call_id=call_id,
            policy=policy,
            now=now,
            threshold_chars=threshold_chars,
            durable=False,
        )
        shown.body, shown.stand_in, shown.descriptor = spilled.text, spilled.stand_in, spilled.descriptor
        shown.warnings += [spilled.warning] if spilled.warning else []
        shown.rows_failed = spilled.failed is not None
    if shown.descriptor is None and built is not None:
        shown.descriptor = built  # a built file: described like a spill, shown inline in words
    tail = []
    if error is not None:
        failure = spill_error(
            root,
            error,
            tool=tool,
            call_id=call_id,
            keep_whole_chars=policy.threshold_chars,
            max_chars=policy.inline_cap_chars,
            durable=False,
        )
        tail.append(failure.text)
        shown.error_path = failure.error_path
        shown.warnings += [failure.warning] if failure.warning else []
    if isinstance(content, TableStream):
        tail += content.notes  # e.g. the rows were cut at a limit
    if note:
        tail.append(note)
    shown.tail = "\n".join(tail)
    if shown.descriptor is not None and shown.descriptor.truncated_inline:
        shown.stand_in = None  # already the stand-in: nothing more to give way
    return shown
