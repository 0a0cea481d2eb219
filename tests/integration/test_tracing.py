"""One trace from the event to the resumed run (OpenTelemetry), against the real daemon,
broker and Postgres: the trace context an event arrives with is stored with it, put on
its resume, and continued by the relay, the worker and the LangGraph resumer; the ingest
batch links to it. Spans are collected in memory, and exported once by a daemon process
to a real OTLP/HTTP receiver. Off, nothing is recorded and the resume is as it was."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from matcher import tracing
from matcher.config import Settings
from matcher.domain.resume import read_resume, resume_message
from matcher.domain.trace_context import trace_parent
from matcher.integrations.langgraph import GraphResumer, Waits
from tests.support import graphs
from tests.support.assertions import eventually
from tests.support.db import register_waits, rows, scalar
from tests.support.kafka import produce_raw, read_resume_messages, to_record
from tests.support.processes import DaemonProcess, process_env, running_daemon
from tests.support.records import event
from tests.support.worker import running_worker, worker_settings

pytestmark = pytest.mark.timeout(240)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{SPAN}-01"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """matcher's tracer on a provider of this test's own, exporting to memory (the
    process's global provider is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", provider.get_tracer("matcher"))
    monkeypatch.setattr(tracing, "enabled", lambda: True)
    yield exporter
    provider.shutdown()


def _traced(correlation: str, traceparent: str = TRACEPARENT, **extra: Any) -> Any:
    key, headers, value = to_record(event(correlation=correlation, **extra))
    return key, [*headers, ("traceparent", traceparent.encode())], value


def _named(found: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


async def test_one_trace_runs_from_the_event_to_the_resumed_graph(
    settings: Settings, spans: InMemorySpanExporter
) -> None:
    url = settings.database_url.get_secret_value()
    graphs.setup(url)
    builder = graphs.job_graph(Waits(graphs.TENANT, url), url)
    thread = f"traced-{uuid.uuid4().hex[:8]}"
    await graphs.start(builder, url, thread, {"log": []})
    [job] = rows(settings, "SELECT * FROM lg_jobs WHERE run_id LIKE %s",
                 [f"langgraph:{thread}/%"])  # fmt: skip
    resumer = GraphResumer(graphs.compiled(builder))
    worker = worker_settings(settings)
    async with running_daemon(settings), running_worker(worker, resumer, resumer.accepts):
        await produce_raw(settings, [_traced(job["correlation_id"], data={"rows": 4})])
        await eventually(
            lambda: bool(_named(list(spans.get_finished_spans()), "langgraph.resume")),
            timeout=60, what="the graph resumed",
        )  # fmt: skip
    assert scalar(settings, "SELECT trace_parent FROM matcher.inbox WHERE correlation_id = %s",
                  [job["correlation_id"]]) == TRACEPARENT  # fmt: skip
    [message] = [m for m in await read_resume_messages(settings, at_least=1)
                 if json.loads(m)["subject"] == job["run_id"]]  # fmt: skip
    assert json.loads(message)["traceparent"] == TRACEPARENT
    resume = read_resume(message)
    assert resume.traceparent == TRACEPARENT
    # The SQL-built message is the reference model's, traceparent included.
    assert json.loads(message) == json.loads(resume_message(resume, TRACEPARENT))
    found = list(spans.get_finished_spans())
    [publish] = _named(found, "matcher.resume publish")
    [handle] = _named(found, "matcher.resume handle")
    [resumed] = _named(found, "langgraph.resume")
    for span in (publish, handle, resumed):
        assert _hex(span.context.trace_id, 32) == TRACE, span.name
    assert publish.parent is not None
    assert _hex(publish.parent.span_id, 16) == SPAN
    assert handle.parent is not None
    assert _hex(handle.parent.span_id, 16) == SPAN
    assert resumed.parent is not None
    assert resumed.parent.span_id == handle.context.span_id
    assert handle.attributes is not None
    assert handle.attributes["matcher.run_id"] == job["run_id"]
    batches = _named(found, "matcher.ingest batch")
    assert any(_hex(link.context.trace_id, 32) == TRACE for b in batches for link in b.links)


def test_a_trace_context_is_kept_only_when_it_is_one_and_unambiguous() -> None:
    good = TRACEPARENT.encode()
    assert trace_parent([(b"traceparent", good)]) == TRACEPARENT
    assert trace_parent([(b"ce_traceparent", good), (b"traceparent", good)]) == TRACEPARENT
    other = f"00-{TRACE}-{'1' * 16}-01".encode()
    assert trace_parent([(b"traceparent", good), (b"ce_traceparent", other)]) is None
    for bad in (b"", b"00-" + b"0" * 32 + b"-" + SPAN.encode() + b"-01", good.upper(),
                b"01-" + good[3:], good + b"-x", b"\xff" + good[1:]):  # fmt: skip
        assert trace_parent([(b"traceparent", bad)]) is None, bad
    assert trace_parent([(b"TraceParent", good)]) is None  # another name: not ours


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP traces endpoint: keeps each request's spans."""

    received: ClassVar[list[ExportTraceServiceRequest]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            self.received.append(request)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:  # quiet
        pass


def _exported_names(trace_id: str) -> set[str]:
    return {
        span.name
        for request in _Receiver.received
        for resource in request.resource_spans
        for scoped in resource.scope_spans
        for span in scoped.spans
        if span.trace_id.hex() == trace_id
    }


async def test_a_daemon_exports_its_spans_to_an_otlp_receiver(settings: Settings) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    trace = uuid.uuid4().hex
    env = process_env(
        settings,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}",
        OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_SERVICE_NAME="matcher-test",
    )
    daemon = DaemonProcess(env)
    try:
        daemon.wait_ready()
        [correlation] = register_waits(settings, 1, prefix="otlp")
        await produce_raw(settings, [_traced(correlation, f"00-{trace}-{SPAN}-01")])
        await eventually(lambda: "matcher.resume publish" in _exported_names(trace),
                         timeout=60, what="the publication's span exported")  # fmt: skip
    finally:
        assert daemon.terminate() == 0, daemon.output
        server.shutdown()
        server.server_close()
    services = {
        attribute.value.string_value
        for request in _Receiver.received
        for resource in request.resource_spans
        for attribute in resource.resource.attributes
        if attribute.key == "service.name"
    }
    assert "matcher-test" in services
