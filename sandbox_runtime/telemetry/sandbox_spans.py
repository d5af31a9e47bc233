"""The spans a run's code opens inside its sandbox (``sandbox_tools.span``, ``sandbox_tools.event``), made on the host
as children of the run's span: they come over the executor's pipe, as the script's tool calls do, so a sandbox with
no network is traced all the same.

Each request is one line the run wrote and gets one reply (the run's clock stands still meanwhile)::

    {"op": "span", "phase": "start", "span": N, "parent": M | null, "name": "...", "attributes": {...}}
    {"op": "span", "phase": "end", "span": N, "attributes": {...}, "error": "..." | null}
    {"op": "event", "span": N | null, "name": "...", "attributes": {...}}

``N`` numbers the run's spans (the run's own numbering: the host makes the real ids); a span's times are the host's
when each line came, so a sandbox's clock is never believed. The host checks everything: a run may open at most
``telemetry.sandbox_spans_max_count`` spans and events, each with at most ``sandbox_span_attributes_max_count``
attributes (strings, numbers, booleans, lists of them), names and texts cut at ``sandbox_span_text_max_chars``;
attributes in the runtime's own namespace (``sandbox_runtime.``, ``gen_ai.``) are dropped. Past a limit the reply
says ``limit`` and the span is not made; while nothing records traces it says ``off`` and the run sends no more.
Spans still open when the run ends are ended then, marked failed ("the run ended first").
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from sandbox_runtime.policy.telemetry import TelemetryPolicy
from sandbox_runtime.telemetry.tracing import tracer

__all__ = ["RunSpans"]

_RESERVED_PREFIXES = ("sandbox_runtime.", "gen_ai.")
_FROM_SANDBOX = "sandbox_runtime.from_sandbox"
_LIST_ITEMS_MAX = 64
_SCALARS = {str, int, float, bool}


class RunSpans:
    """The spans of one run, under the span current when it is made (the run's)."""

    def __init__(self, limits: TelemetryPolicy, on_drop: Callable[[], None] = lambda: None) -> None:
        self._limits = limits
        self._on_drop = on_drop
        self._parent = otel_context.get_current()
        self._recording = trace.get_current_span().is_recording()
        self._open: dict[int, Span] = {}
        self.taken = 0
        self.dropped = 0

    def answer(self, number: object, request: dict[str, Any]) -> dict[str, Any]:
        """The reply to one ``span`` or ``event`` request."""
        if not self._recording:
            return {"id": number, "ok": False, "error": "off"}
        op, phase = request.get("op"), request.get("phase")
        if op == "span" and phase == "end":
            return self._end(number, request)
        if op == "span" and phase != "start":
            return {"id": number, "ok": False, "error": "invalid_arguments", "message": "a span's phase: start or end"}
        if self.taken >= self._limits.sandbox_spans_max_count:
            self.dropped += 1
            self._on_drop()
            return {"id": number, "ok": False, "error": "limit"}
        self.taken += 1
        if op == "span" and phase == "start":
            return self._start(number, request)
        target = self._opened(request.get("span"))
        (target or trace.get_current_span(self._parent)).add_event(
            self._text(request.get("name")) or "event", self._attributes(request.get("attributes"))
        )
        return {"id": number, "ok": True}

    def context(self, number: object) -> otel_context.Context:
        """The context of the run's span ``number`` (the run's own when it has none open by that number)."""
        opened = self._opened(number)
        return self._parent if opened is None else trace.set_span_in_context(opened, self._parent)

    @contextlib.contextmanager
    def inside(self, number: object) -> Iterator[None]:
        """Current inside the block: the run's span ``number`` (a tool call the run makes inside it is its child)."""
        token = otel_context.attach(self.context(number))
        try:
            yield
        finally:
            otel_context.detach(token)

    def _opened(self, number: object) -> Span | None:
        """The open span of that number (whatever JSON the run sent for it: only an integer names one)."""
        return self._open.get(number) if isinstance(number, int) else None

    def close(self) -> None:
        """The run ended: end the spans it left open, marked failed."""
        for opened in reversed(list(self._open.values())):
            opened.set_status(Status(StatusCode.ERROR, "the run ended before this span did"))
            opened.end()
        self._open.clear()

    def _start(self, number: object, request: dict[str, Any]) -> dict[str, Any]:
        span_number = request.get("span")
        if not isinstance(span_number, int) or span_number in self._open:
            return {"id": number, "ok": False, "error": "invalid_arguments", "message": "a span needs a new number"}
        parent = self.context(request.get("parent"))
        attributes = self._attributes(request.get("attributes"))
        attributes[_FROM_SANDBOX] = True
        self._open[span_number] = tracer.start_span(
            self._text(request.get("name")) or "span", context=parent, attributes=attributes
        )
        return {"id": number, "ok": True}

    def _end(self, number: object, request: dict[str, Any]) -> dict[str, Any]:
        opened = self._opened(request.get("span"))
        if opened is not None:
            del self._open[request["span"]]
        if opened is None:
            return {"id": number, "ok": True}  # never started (dropped), or ended already
        opened.set_attributes(self._attributes(request.get("attributes")))
        error = request.get("error")
        if error:
            opened.set_status(Status(StatusCode.ERROR, self._text(error)))
        opened.end()
        return {"id": number, "ok": True}

    def _text(self, value: object) -> str:
        text = value if isinstance(value, str) else "" if value is None else str(value)
        return text[: self._limits.sandbox_span_text_max_chars]

    def _attributes(self, raw: object) -> dict[str, Any]:
        if not isinstance(raw, dict):
            return {}
        kept: dict[str, Any] = {}
        for key, value in raw.items():
            if len(kept) >= self._limits.sandbox_span_attributes_max_count:
                break
            name = self._text(key)
            if not name or name.startswith(_RESERVED_PREFIXES):
                continue
            clean = self._value(value)
            if clean is not None:
                kept[name] = clean
        return kept

    def _value(self, value: object) -> Any:
        if isinstance(value, bool | int):
            return value if -(2**63) <= value < 2**63 else self._text(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else str(value)
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, list) and value:
            items = [self._value(item) for item in value[:_LIST_ITEMS_MAX]]
            kinds = {type(item) for item in items}
            return items if len(kinds) == 1 and kinds <= _SCALARS else [str(item) for item in items]
        return None if value is None else self._text(value)
