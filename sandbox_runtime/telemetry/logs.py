"""Structured logs (``--log-format json``): one JSON object per line with the time, level, logger and message,
and, for a line logged while a call runs, its conversation, call id, tool and trace id.

The pipeline names the call it runs (:func:`log_fields`, a context variable: it follows the call into the
threads it runs in, as the current span does); :class:`JsonLogFormatter` adds those fields and the trace id to each
record. A record's arguments are formatted into its message as usual and nothing else of the call is added: the
runtime logs no argument values and no secrets, and a line never carries more than these fields.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import json
import logging
from collections.abc import Iterator
from typing import Any

from sandbox_runtime.telemetry.tracing import trace_id

__all__ = ["JsonLogFormatter", "current_log_fields", "log_fields"]

_FIELDS: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("sandbox_runtime_log_fields", default={})  # noqa: B039  (never mutated: replaced)


@contextlib.contextmanager
def log_fields(**fields: str | None) -> Iterator[None]:
    """Name what runs inside the block in every line it logs (``conversation``, ``call_id``, ``tool``)."""
    merged = {**_FIELDS.get(), **{name: value for name, value in fields.items() if value is not None}}
    token = _FIELDS.set(merged)
    try:
        yield
    finally:
        _FIELDS.reset(token)


def current_log_fields() -> dict[str, str]:
    """The fields the lines logged here carry."""
    return dict(_FIELDS.get())


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, the call's fields,
    ``trace_id``, and ``exception`` (its traceback) when the record has one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_FIELDS.get())
        traced = trace_id()
        if traced is not None:
            line["trace_id"] = traced
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)
