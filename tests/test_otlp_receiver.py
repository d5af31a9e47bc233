"""The tests' OTLP/HTTP trace receiver (tests/otlp_receiver.py) against the real OpenTelemetry SDK exporter: spans
arrive with their parent, attributes, event, status and resource, plain or compressed; bodies that are not OTLP are
refused. Loopback only: the exporter's session and the raw requests ignore any proxy of the environment."""

from __future__ import annotations

import gzip
import http.client
import urllib.request
from collections.abc import Iterator
from urllib.error import HTTPError

import pytest
import requests
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from tests.otlp_receiver import MAX_BODY, OtlpReceiver, ReceivedSpan

EXPORT_TIMEOUT_S = 10.0


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def _loopback_session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # no HTTP(S)_PROXY: the exporter talks to 127.0.0.1 itself
    return session


def _export_parent_and_child(receiver: OtlpReceiver, compression: Compression) -> None:
    """A parent (server) span and its child (attributes, an event, an error status), exported one by one as they end."""
    exporter = OTLPSpanExporter(
        endpoint=receiver.endpoint + "/v1/traces",
        compression=compression,
        session=_loopback_session(),
        timeout=EXPORT_TIMEOUT_S,
    )
    provider = TracerProvider(resource=Resource.create({"service.name": "probe"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.probe")
    try:
        with (
            tracer.start_as_current_span("parent", kind=SpanKind.SERVER),
            tracer.start_as_current_span(
                "child",
                attributes={"tool": "run_python", "attempt": 2, "ratio": 0.5, "cached": False, "tags": ["a", "b"]},
                record_exception=False,
                set_status_on_exception=False,
            ) as child,
        ):
            child.add_event("spilled", {"rows": 1000, "path": "out.csv"})
            child.set_status(Status(StatusCode.ERROR, "the sandbox ran out of memory"))
    finally:
        provider.shutdown()


def _by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {span.name: span for span in spans}


def _post(receiver: OtlpReceiver, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """POSTs ``body`` to the receiver (no proxy); its status and body, errors included."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(  # noqa: S310 (the receiver's own http://127.0.0.1 URL)
        receiver.endpoint + path,
        data=body,
        headers={"Content-Type": "application/x-protobuf", **(headers or {})},
        method="POST",
    )
    try:
        with opener.open(request, timeout=EXPORT_TIMEOUT_S) as response:
            return int(response.status), bytes(response.read())
    except HTTPError as error:
        with error:
            return error.code, error.read()


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip, Compression.Deflate])
def test_sdk_exporter_spans_arrive_with_parent_attributes_event_status_and_resource(
    receiver: OtlpReceiver, compression: Compression
) -> None:
    _export_parent_and_child(receiver, compression)

    spans = _by_name(receiver.wait_for(lambda spans: {"parent", "child"} <= {span.name for span in spans}))
    parent, child = spans["parent"], spans["child"]
    assert len(parent.trace_id) == 32
    assert len(parent.span_id) == 16
    assert parent.parent_span_id is None
    assert parent.kind == "SPAN_KIND_SERVER"
    assert parent.status_code == "STATUS_CODE_UNSET"
    assert child.trace_id == parent.trace_id
    assert child.parent_span_id == parent.span_id
    assert child.kind == "SPAN_KIND_INTERNAL"
    assert child.attributes == {"tool": "run_python", "attempt": 2, "ratio": 0.5, "cached": False, "tags": ("a", "b")}
    assert child.events == (("spilled", {"rows": 1000, "path": "out.csv"}),)
    assert child.status_code == "STATUS_CODE_ERROR"
    assert child.status_message == "the sandbox ran out of memory"
    assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns
    for span in (parent, child):
        assert span.resource["service.name"] == "probe"
        assert span.resource["telemetry.sdk.language"] == "python"
        assert span.scope == "tests.probe"
    assert receiver.trace(parent.trace_id) == [parent, child]
    assert receiver.children(parent) == [child]
    assert receiver.children(child) == []
    assert receiver.requests == 2  # SimpleSpanProcessor: one export per span


def test_wait_for_times_out_with_the_spans_received(receiver: OtlpReceiver) -> None:
    _export_parent_and_child(receiver, Compression.NoCompression)
    receiver.wait_for(lambda spans: len(spans) == 2)

    with pytest.raises(AssertionError, match=r"no match within 0\.2s; 2 span") as raised:
        receiver.wait_for(lambda spans: any(span.name == "never" for span in spans), timeout_s=0.2)
    parent = _by_name(receiver.spans)["parent"]
    assert f"'child' SPAN_KIND_INTERNAL trace={parent.trace_id}" in str(raised.value)
    assert f"parent={parent.span_id}" in str(raised.value)


def test_bodies_that_are_not_otlp_are_refused(receiver: OtlpReceiver) -> None:
    for garbage in (b"this is not protobuf", b"\xff" * 12):
        assert _post(receiver, "/v1/traces", garbage)[0] == 400
    assert _post(receiver, "/v1/traces", b"not gzip at all", {"Content-Encoding": "gzip"})[0] == 400
    assert _post(receiver, "/v1/traces", gzip.compress(b"x" * 100)[:-12], {"Content-Encoding": "gzip"})[0] == 400
    assert _post(receiver, "/v1/traces", b"", {"Content-Encoding": "br"})[0] == 415
    assert _post(receiver, "/v1/traces", gzip.compress(bytes(MAX_BODY + 1)), {"Content-Encoding": "gzip"})[0] == 413
    assert _post(receiver, "/v2/traces", b"")[0] == 404
    assert receiver.requests == 0
    assert receiver.spans == []


def test_a_declared_oversized_body_is_refused_unread(receiver: OtlpReceiver) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", int(receiver.endpoint.rsplit(":", 1)[1]), timeout=10)
    try:
        connection.putrequest("POST", "/v1/traces")
        connection.putheader("Content-Type", "application/x-protobuf")
        connection.putheader("Content-Length", str(MAX_BODY + 1))
        connection.endheaders()  # and no body: the receiver answers from the header alone
        assert connection.getresponse().status == 413
    finally:
        connection.close()


def test_an_empty_export_and_the_other_signals_are_accepted(receiver: OtlpReceiver) -> None:
    assert _post(receiver, "/v1/traces", b"") == (200, b"")  # an empty ExportTraceServiceRequest is valid
    assert _post(receiver, "/v1/metrics", b"anything") == (200, b"")
    assert _post(receiver, "/v1/logs", b"anything") == (200, b"")
    assert (receiver.requests, receiver.requests_to("/v1/metrics"), receiver.requests_to("/v1/logs")) == (1, 1, 1)
    assert receiver.spans == []
