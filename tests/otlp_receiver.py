"""A receiver of OpenTelemetry traces for the tests, on loopback: OTLP over HTTP with protobuf bodies.

:class:`OtlpReceiver` serves ``POST /v1/traces`` on 127.0.0.1 (a free port) from a thread of its own, as a
collector would: the body (at most :data:`MAX_BODY` bytes, un-gzipped or inflated as its ``Content-Encoding``
says) is parsed as an ``ExportTraceServiceRequest`` with the official protobuf definitions, its spans kept as
:class:`ReceivedSpan` values, and the answer is an ``ExportTraceServiceResponse``. ``/v1/metrics`` and ``/v1/logs``
are accepted and counted, not parsed. A test points the exporter under test at :attr:`OtlpReceiver.endpoint`
(``OTEL_EXPORTER_OTLP_ENDPOINT``; the exporter adds ``/v1/traces``) and waits for the spans it expects with
:meth:`OtlpReceiver.wait_for`, which wakes on each export rather than polling.

The module holds no ``assert`` (its failures are raised as :class:`AssertionError` explicitly), so pytest need not
rewrite it.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]  # protobuf ships no stubs
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.local_servers import StartedInBlock

MAX_BODY = 16 * 1024 * 1024  # bytes of a request body, before and after decompression
STOP_S = 10.0
POLL_S = 0.05  # how soon the serving thread notices a shutdown
TRACES_PATH = "/v1/traces"
# the other signals: accepted and counted, answered with their (empty) response message
OTHER_SIGNALS: dict[str, bytes] = {
    "/v1/metrics": ExportMetricsServiceResponse().SerializeToString(),
    "/v1/logs": ExportLogsServiceResponse().SerializeToString(),
}
PROTOBUF = "application/x-protobuf"
# Content-Encoding -> zlib's wbits: gzip's container, or zlib's (what HTTP calls "deflate")
DECODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}

# an attribute's value as Python: OTLP's string, int, double, bool, bytes, arrays (tuples), key-value lists (dicts)
AttributeValue = str | int | float | bool | bytes | tuple["AttributeValue", ...] | dict[str, "AttributeValue"] | None
Attributes = dict[str, AttributeValue]


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver got it: ids in lowercase hex, enums by their proto names."""

    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str | None  # 16 hex digits, None for a root span
    name: str
    kind: str  # e.g. "SPAN_KIND_SERVER"
    start_ns: int
    end_ns: int
    attributes: Attributes
    events: tuple[tuple[str, Attributes], ...]  # (name, attributes) in the span's order
    status_code: str  # e.g. "STATUS_CODE_ERROR"
    status_message: str
    resource: Attributes  # the attributes of the resource that sent it
    scope: str  # the instrumentation scope's name

    def describe(self) -> str:
        """One line for a failure's message: name, kind, ids and parent."""
        return (
            f"{self.name!r} {self.kind} trace={self.trace_id} span={self.span_id} parent={self.parent_span_id} "
            f"status={self.status_code}"
        )


def _value(value: AnyValue) -> AttributeValue:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(item) for item in value.array_value.values)
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    # string_value, bool_value, int_value, double_value, bytes_value; None when the value is empty
    scalar: AttributeValue = None if kind is None else getattr(value, kind)
    return scalar


def _attributes(pairs: Iterable[KeyValue]) -> Attributes:
    """A repeated ``KeyValue`` field as a dict."""
    return {pair.key: _value(pair.value) for pair in pairs}


def _spans(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    received: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                received.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        name=span.name,
                        kind=Span.SpanKind.Name(span.kind),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        events=tuple((event.name, _attributes(event.attributes)) for event in span.events),
                        status_code=Status.StatusCode.Name(span.status.code),
                        status_message=span.status.message,
                        resource=resource,
                        scope=scope_spans.scope.name,
                    )
                )
    return received


class _Refused(Exception):
    """A request answered with an error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Server(ThreadingHTTPServer):
    receiver: OtlpReceiver


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if path != TRACES_PATH and path not in OTHER_SIGNALS:
            self.send_error(404)
            return
        try:
            body = self._body()
            if path == TRACES_PATH:
                request = ExportTraceServiceRequest()
                try:
                    request.ParseFromString(body)
                except DecodeError as error:
                    raise _Refused(400, f"not an ExportTraceServiceRequest: {error}") from None
                self.server.receiver._received(path, _spans(request))
                answer = ExportTraceServiceResponse().SerializeToString()
            else:
                self.server.receiver._received(path, [])
                answer = OTHER_SIGNALS[path]
        except _Refused as refused:
            self.send_error(refused.status, explain=refused.reason)
            return
        self.send_response(200)
        self.send_header("Content-Type", PROTOBUF)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def _body(self) -> bytes:
        """The request's body, read as far as its Content-Length says and decompressed as its encoding says."""
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise _Refused(411, "a Content-Length is required") from None
        if length < 0:
            raise _Refused(400, "a negative Content-Length")
        if length > MAX_BODY:
            raise _Refused(413, f"a body of {length} bytes; at most {MAX_BODY}")
        body = self.rfile.read(length)
        if len(body) != length:
            raise _Refused(400, f"the body ended after {len(body)} of {length} bytes")
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding == "identity":
            return body
        if encoding not in DECODINGS:
            raise _Refused(415, f"Content-Encoding {encoding!r}: only gzip and deflate")
        inflater = zlib.decompressobj(DECODINGS[encoding])
        try:
            plain = inflater.decompress(body, MAX_BODY + 1)
        except zlib.error as error:
            raise _Refused(400, f"a body that is not {encoding}: {error}") from None
        if len(plain) > MAX_BODY:
            raise _Refused(413, f"a body of more than {MAX_BODY} bytes once decompressed")
        if not inflater.eof:
            raise _Refused(400, f"a truncated {encoding} body")
        return plain

    def log_message(self, format: str, *args: Any) -> None:
        pass


class OtlpReceiver(StartedInBlock):
    """An OTLP/HTTP trace receiver on ``http://127.0.0.1:PORT``, serving from a daemon thread while the ``with``
    block runs (or from :meth:`start` to :meth:`close`)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._spans: list[ReceivedSpan] = []
        self._requests: dict[str, int] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listens on a free port and serves from a thread of its own."""
        server = _Server(("127.0.0.1", 0), _Handler)
        server.receiver = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(POLL_S,), name="otlp-receiver", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops serving and closes the listening socket (the thread is waited for at most ``STOP_S``)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=STOP_S)

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``: the base URL (``OTEL_EXPORTER_OTLP_ENDPOINT``); traces go to ``/v1/traces``."""
        if self._server is None:
            raise RuntimeError("the receiver is not running: use it as a context manager")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def spans(self) -> list[ReceivedSpan]:
        """The spans received so far, in the order they came (a copy)."""
        with self._changed:
            return list(self._spans)

    @property
    def requests(self) -> int:
        """How many trace exports (``POST /v1/traces``) were accepted."""
        return self.requests_to(TRACES_PATH)

    def requests_to(self, path: str) -> int:
        """How many requests to ``path`` (``/v1/traces``, ``/v1/metrics`` or ``/v1/logs``) were accepted."""
        with self._changed:
            return self._requests.get(path, 0)

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30) -> list[ReceivedSpan]:
        """The spans received, once ``predicate`` holds for them (checked now and after each export); an
        :class:`AssertionError` listing the spans received if it does not within ``timeout_s``."""
        with self._changed:
            if self._changed.wait_for(lambda: predicate(list(self._spans)), timeout=timeout_s):
                return list(self._spans)
            raise AssertionError(self._dump(f"no match within {timeout_s}s"))

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans of one trace received so far, earliest start first."""
        return sorted((span for span in self.spans if span.trace_id == trace_id), key=lambda span: span.start_ns)

    def children(self, span: ReceivedSpan) -> list[ReceivedSpan]:
        """The spans received so far whose parent is ``span``, earliest start first."""
        return [child for child in self.trace(span.trace_id) if child.parent_span_id == span.span_id]

    def _received(self, path: str, spans: list[ReceivedSpan]) -> None:
        with self._changed:
            self._spans.extend(spans)
            self._requests[path] = self._requests.get(path, 0) + 1
            self._changed.notify_all()

    def _dump(self, headline: str) -> str:
        """``headline`` and the spans received (caller holds the lock)."""
        lines = [f"{headline}; {len(self._spans)} span(s) received in {self._requests.get(TRACES_PATH, 0)} export(s)"]
        lines += [f"  {span.describe()}" for span in self._spans]
        return "\n".join(lines)
