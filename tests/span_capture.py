"""The spans the runtime records in this test process, as a host that installed OpenTelemetry's SDK would get them.

OpenTelemetry keeps one global tracer provider per process, set once: the first :func:`captured_spans` installs an
SDK provider whose exporter keeps spans only while a capture is open (and drops them otherwise), so the tests
that come later run with spans recorded and thrown away, as in a host that exports them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class _Gate(SpanExporter):
    def __init__(self) -> None:
        self.open: list[ReadableSpan] | None = None
        self.guard = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.guard:
            if self.open is not None:
                self.open.extend(spans)
        return SpanExportResult.SUCCESS


_gate = _Gate()
_installed = threading.Lock()


def _install() -> None:
    with _installed:
        provider = trace.get_tracer_provider()
        if isinstance(provider, TracerProvider):
            if getattr(provider, "_test_gate", False):
                return
            raise AssertionError("another SDK tracer provider is installed in this process")
        ours = TracerProvider()
        ours.add_span_processor(SimpleSpanProcessor(_gate))
        ours._test_gate = True  # type: ignore[attr-defined]
        trace.set_tracer_provider(ours)


@contextmanager
def captured_spans() -> Iterator[list[ReadableSpan]]:
    """The spans that end inside the block (a list filled as they end)."""
    _install()
    spans: list[ReadableSpan] = []
    with _gate.guard:
        _gate.open = spans
    try:
        yield spans
    finally:
        with _gate.guard:
            _gate.open = None


def named(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    """The one span of that name."""
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, f"{len(found)} spans named {name!r}: {[s.name for s in spans]}"
    return found[0]


def parent_of(span: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan:
    assert span.parent is not None, f"{span.name} has no parent"
    found = [s for s in spans if s.context is not None and s.context.span_id == span.parent.span_id]
    assert len(found) == 1, f"the parent of {span.name} is not among {[s.name for s in spans]}"
    return found[0]
