"""The scripted "model" of the third-party client tests: it picks each tool call from what the previous call gave
it, as a model would, and records exactly what it was given.

Standard library only: the drivers in this folder import it under other environments' interpreters
(``python -m tests.clients.<driver>`` from the repository root).

The walk: ``sql_query`` (its 360 rows spill to a file) → ``export_table`` from the path the model was handed →
``attach_file`` of the export's path → a small ``run_python`` whose stdout must reach the model → a failing
script (the model must read its exception line) → a script that writes a note → ``read_file`` of the note.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

QUERY = "SELECT * FROM orders ORDER BY order_id"
EXPORT_COLUMNS = ["order_id", "customer", "total"]
EXPORT_FILENAME = "top-orders.xlsx"
STDOUT_CODE = "print('stdout reaches the model:', 6 * 7)"
STDOUT_LINE = "stdout reaches the model: 42"
FAILING_CODE = "rows = [{'total': 12.5}]\nprint(sum(row['amount'] for row in rows))\n"
EXCEPTION_LINE = "KeyError: 'amount'"
NOTE_PATH = "/mnt/results/notes/squares.txt"
NOTE_CODE = (  # relative paths: a run starts in the results folder, on every backend (the fake's is on the host)
    "import os\n"
    "os.makedirs('notes', exist_ok=True)\n"
    "open('notes/squares.txt', 'w').write('\\n'.join(f'square {i * i}' for i in range(4)) + '\\n')\n"
)
NOTE_TEXT = "square 0\nsquare 1\nsquare 4\nsquare 9"  # computed in the sandbox: not in any argument the model sent

# a path as it appears in prose, in JSON text or in a Python repr: it ends at a quote, a space or a bracket
_PATH = re.compile(r"/mnt/results/[^\s\"'`,;()\[\]{}<>\\]+")


@dataclass
class Call:
    tool: str
    arguments: dict[str, Any]


@dataclass
class Received:
    """One tool return, as the model was handed it."""

    tool: str
    text: str  # the text the model reads
    is_error: bool
    raw: Any = None  # the client's own form of it (for the test's messages and the report)


class MissingPath(LookupError):
    """What the model was handed names no path it can use for its next call."""


def find_path(text: str, *, prefix: str = "/mnt/results/", suffix: str = "") -> str:
    """The first in-sandbox path in ``text`` that starts with ``prefix`` and ends with ``suffix``."""
    for match in _PATH.finditer(text):
        path = match.group(0).rstrip(".:")
        if path.startswith(prefix) and path.endswith(suffix):
            return path
    raise MissingPath(f"no path {prefix}…{suffix} in what the model was handed: {text[:2000]!r}")


Step = Callable[["Received | None"], Call]


def _query(previous: Received | None) -> Call:
    return Call("sql_query", {"query": QUERY})


def _export(previous: Received | None) -> Call:
    assert previous is not None
    source = find_path(previous.text, prefix="/mnt/results/spill/")
    return Call(
        "export_table",
        {
            "source": source,
            "format": "xlsx",
            "columns": EXPORT_COLUMNS,
            "sort": {"column": "total", "direction": "desc"},
            "filename": EXPORT_FILENAME,
        },
    )


def _attach(previous: Received | None) -> Call:
    assert previous is not None
    return Call("attach_file", {"path": find_path(previous.text, suffix=".xlsx")})


def _stdout(previous: Received | None) -> Call:
    return Call("run_python", {"code": STDOUT_CODE})


def _failing(previous: Received | None) -> Call:
    return Call("run_python", {"code": FAILING_CODE})


def _note(previous: Received | None) -> Call:
    return Call("run_python", {"code": NOTE_CODE})


def _read(previous: Received | None) -> Call:
    return Call("read_file", {"path": NOTE_PATH})


WALK: list[Step] = [_query, _export, _attach, _stdout, _failing, _note, _read]


@dataclass
class ScriptedModel:
    """Decides the next call from the last return; stops early (``stopped``) when it lacks a path it needs."""

    steps: list[Step] = field(default_factory=lambda: list(WALK))
    calls: list[Call] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    stopped: str | None = None

    def next_call(self) -> Call | None:
        if self.stopped is not None or len(self.calls) >= len(self.steps):
            return None
        if len(self.received) < len(self.calls):
            self.stopped = f"the return of {self.calls[-1].tool} never reached the model"
            return None
        try:
            call = self.steps[len(self.calls)](self.received[-1] if self.received else None)
        except MissingPath as exc:
            self.stopped = f"after {self.calls[-1].tool}: {exc}"
            return None
        self.calls.append(call)
        return call

    def receive(self, tool: str, text: str, *, is_error: bool, raw: Any = None) -> None:
        self.received.append(Received(tool, text, is_error, raw))

    def report(self) -> dict[str, Any]:
        return {
            "calls": [asdict(c) for c in self.calls],
            "received": [asdict(r) for r in self.received],
            "stopped": self.stopped,
        }
