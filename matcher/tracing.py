"""Tracing with OpenTelemetry: one trace from the event to the resumed run.

Off unless the standard variables ask for an export (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, and OTEL_SDK_DISABLED not true) and the SDK is
installed (``pip install 'matcher[otel]'``); the exporter reads the rest of OTEL_* itself
(headers, timeout, service name, sampler). Off, a span is OpenTelemetry's no-op one and
the code that would build a span's attributes asks ``enabled()`` first. An application
that configures OpenTelemetry itself (a worker embedded in it) is traced by its provider.

The event's W3C trace context (``matcher.domain.trace_context``) is the parent of the
relay's publication span and of the worker's handling span, and a link of the ingest
batch's span; the integrations' spans are children of the worker's.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from matcher.domain.trace_context import valid

log = logging.getLogger("matcher.tracing")
tracer = trace.get_tracer("matcher")
_PROPAGATOR = TraceContextTextMapPropagator()
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_configured = False


def requested() -> bool:
    """Whether the environment asks for traces to be exported."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(os.environ.get(name) for name in _ENDPOINTS)


def configure_from_env() -> bool:
    """Install an OTLP/HTTP exporter when the environment asks for one (once per
    process); True when traces are exported."""
    global _configured
    if _configured or not requested():
        return _configured
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed"
            " (pip install 'matcher[otel]'): no traces are exported"
        )
        return False
    provider = TracerProvider(resource=Resource.create())  # OTEL_SERVICE_NAME and the rest
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _configured = True
    return True


def enabled() -> bool:
    """Whether spans are recorded: a provider is installed (ours, or the application's)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def parent(traceparent: str | None) -> context.Context | None:
    """The context whose span is the one ``traceparent`` names (None: a new trace)."""
    if traceparent is None:
        return None
    return _PROPAGATOR.extract({"traceparent": traceparent})


def link(traceparent: str | None) -> trace.Link | None:
    """A link to the span ``traceparent`` names."""
    ctx = parent(traceparent)
    if ctx is None:
        return None
    span_context = trace.get_current_span(ctx).get_span_context()
    return trace.Link(span_context) if span_context.is_valid else None


@contextmanager
def span(
    name: str, traceparent: str | None = None, attributes: dict[str, Any] | None = None
) -> Iterator[trace.Span]:
    """A span named ``name``, the child of ``traceparent``'s span when given (else of the
    current span), current while the block runs."""
    with tracer.start_as_current_span(
        name, context=parent(traceparent), attributes=attributes
    ) as current:
        yield current


def record_span(
    name: str,
    traceparent: str | None,
    start_ns: int,
    end_ns: int,
    attributes: dict[str, Any] | None = None,
    links: list[trace.Link] | None = None,
) -> None:
    """A span that has already happened (from ``start_ns`` to ``end_ns``, time.time_ns()),
    the child of ``traceparent``'s span: for work done for many events at once."""
    done = tracer.start_span(
        name, context=parent(traceparent), attributes=attributes, links=links,
        start_time=start_ns,
    )  # fmt: skip
    done.end(end_time=end_ns)


def message_traceparent(message: str) -> str | None:
    """The traceparent of a resume message's envelope (only read when tracing is on)."""
    try:
        envelope = json.loads(message)
    except ValueError:
        return None
    found = envelope.get("traceparent") if isinstance(envelope, dict) else None
    return found if isinstance(found, str) and valid(found) else None
