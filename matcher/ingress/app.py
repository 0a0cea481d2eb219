"""The ingress's HTTP API: ``POST /v1/webhooks/{producer}``, ``POST /v1/callbacks/{token}``,
health, readiness, metrics.

A webhook is read within a deadline and a size bound, judged by the gate (the same code
and keys the daemon judges the record with again), and published to the events topic;
the sender gets 202 only after Kafka acknowledged it. A callback is read within the same
bounds and handed to the database in one call, which stores its event and resolves its
wait (or says why not) before the sender gets 202. Answers carry a reason code and nothing
of the request; bodies and tokens are never logged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect

from matcher import __version__
from matcher.auth.gate import judge, stale_at
from matcher.auth.registry import Producer, Registry
from matcher.config import IngressSettings
from matcher.domain.callbacks import CALLBACK_PRODUCER
from matcher.domain.events import CompletionEvent, Dropped
from matcher.ingress.callbacks import CallbackRequest, checked_token, to_callback
from matcher.ingress.forwarder import KafkaUnavailable
from matcher.ingress.metrics import (
    DROPPED,
    IN_FLIGHT,
    REGISTRY,
    REQUEST_DURATION,
    REQUESTS,
    UNKNOWN_PRODUCER,
)
from matcher.ingress.refusals import CLAIMS_MAX_BODY_BYTES, Claims, RefusalRecorder
from matcher.ingress.requests import Refusal, claims_of, refusal, to_record
from matcher.store.callbacks import CallbackAnswer, CallbackBusy, CallbackTypeRefused

log = logging.getLogger("matcher.ingress")

# A body's first second is not held to the minimum rate (a connection's slow start).
_RATE_GRACE_S = 1.0
# A webhook refusal's answer carries its detail (up to this many characters) for these
# reasons: matcher's own words and numbers, the producer's mapping, or what a sender whose
# signature was verified sent itself (the mapped type or tenant). Not for a reason whose
# detail may quote what an unauthenticated sender sent (malformed, ambiguous), nor one
# holding markup: an answer must never reflect a request.
_ANSWERED_DETAIL = frozenset(
    {"bad_signature", "expired_timestamp", "too_large", "limit_exceeded", "timeout",
     "unmappable", "type_not_allowed", "tenant_not_allowed", "schema_invalid", "overloaded",
     "kafka_unavailable"}
)  # fmt: skip
_MAX_ANSWERED_DETAIL = 300
_MARKUP = re.compile(r"[<>&`]")
_RETRY_AFTER_S = {
    "overloaded": "1",
    "kafka_unavailable": "5",
    "busy": "1",
    "database_unavailable": "5",
}
_SAFE_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}

# Publishes a record; answers when the broker appended it (its timestamp).
Send = Callable[[bytes, bytes, list[tuple[str, bytes]]], Awaitable[datetime]]
# Completes a callback in the database (matcher.ingress.database).
Complete = Callable[[CallbackRequest], Awaitable[CallbackAnswer]]
# The database's answer, by status: the HTTP status and the reason (None: accepted).
_CALLBACK_ANSWERS = {
    "accepted": (202, None),
    "duplicate": (409, "duplicate"),
    "resolved": (409, "resolved"),
    "late": (410, "late"),
}


@dataclass
class IngressState:
    settings: IngressSettings
    registry: Callable[[], Registry]
    send: Send
    kafka_reachable: Callable[[], Awaitable[bool]]
    stopping: asyncio.Event
    complete_callback: Complete | None = None  # None: no database, no callbacks
    refusals: RefusalRecorder | None = None  # None: no database, refusals only logged


class _FramingGuard:
    """ASGI middleware: a request framed two ways (Content-Length and Transfer-Encoding)
    is refused and its connection closed (RFC 9112, 6.1: a proxy in front may have framed
    it the other way, and what follows would be a request it never saw); so is one whose
    headers exceed ``max_header_bytes`` (431); every answer gets the safe headers, the
    framework's own 404 and 405 too.

    The header bound is checked here as well as in the HTTP parser because h11's bound
    (its incomplete-event size) holds only while the headers arrive in pieces: headers
    that come in one read are parsed whatever their size."""

    def __init__(self, app: Any, max_header_bytes: int) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope["headers"])
        if refusal is not None:
            reason, status = refusal
            REQUESTS.labels(UNKNOWN_PRODUCER, reason).inc()
            response = JSONResponse(
                {"reason": reason},
                status_code=status,
                headers={**_SAFE_HEADERS, "Connection": "close"},
            )
            await response(scope, receive, send)
            return

        async def send_safely(message: Any) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [
                    (name.lower().encode(), value.encode())
                    for name, value in _SAFE_HEADERS.items()
                    if name.lower().encode() not in present
                ]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_safely)

    def _refusal(self, headers: list[tuple[bytes, bytes]]) -> tuple[str, int] | None:
        size = sum(len(name) + len(value) for name, value in headers)
        if size > self.max_header_bytes:
            return "too_large", 431
        names = {name for name, _ in headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            return "malformed", 400
        return None


def create_app(state: IngressState) -> FastAPI:
    app = FastAPI(
        title="matcher webhook ingress",
        version=__version__,
        docs_url=None,  # internet-facing: no interactive pages
        redoc_url=None,
        openapi_url=None,
        # A trailing slash would be redirected to a URL built from the Host header: a
        # signed POST re-sent wherever a sender's Host says.
        redirect_slashes=False,
    )
    app.add_middleware(_FramingGuard, max_header_bytes=state.settings.max_header_bytes)
    slots = asyncio.Semaphore(state.settings.ingress_max_concurrency)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"}, headers=_SAFE_HEADERS)

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        kafka = not state.stopping.is_set() and await state.kafka_reachable()
        body = {"ready": kafka, "kafka": kafka, "draining": state.stopping.is_set()}
        return JSONResponse(body, status_code=200 if kafka else 503, headers=_SAFE_HEADERS)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/webhooks/{producer}")
    async def webhook(producer: str, request: Request) -> JSONResponse:
        started = time.monotonic()
        found = state.registry().producers.get(producer)
        label = producer if found is not None else UNKNOWN_PRODUCER
        if found is None:
            answer = _answer(state, label, Refusal("unknown_producer", "no such producer"), 404)
        else:
            answer = await _handle(state, found, request, started, slots)
        REQUEST_DURATION.labels(label).observe(time.monotonic() - started)
        return answer

    # {token:path}: a guess with a slash in it is an unknown token like any other.
    @app.post("/v1/callbacks/{token:path}")
    async def callback(token: str, request: Request) -> JSONResponse:
        started = time.monotonic()
        answer = await _handle_callback(state, token, request, started, slots)
        REQUEST_DURATION.labels(CALLBACK_PRODUCER).observe(time.monotonic() - started)
        return answer

    return app


async def _handle(
    state: IngressState,
    producer: Producer,
    request: Request,
    started: float,
    slots: asyncio.Semaphore,
) -> JSONResponse:
    """Read the body (no slot held: a slow sender costs a connection, not capacity), then
    judge and forward it in a slot."""
    settings = state.settings
    body = await _read_body(request, settings, started + settings.ingress_read_timeout_s)
    if isinstance(body, Refusal):
        return _answer(state, producer.source, body)
    if slots.locked():
        return _answer(state, producer.source, Refusal("overloaded", "every slot is busy"))
    async with slots:
        IN_FLIGHT.inc()
        try:
            return await _judge_and_forward(state, producer, request, body)
        finally:
            IN_FLIGHT.dec()


async def _judge_and_forward(
    state: IngressState, producer: Producer, request: Request, body: bytes
) -> JSONResponse:
    # Freshness is judged at the body's arrival here, and again below at the broker's
    # append time: the arrival the daemon judges the record by (invariant 12).
    given = list(request.scope["headers"])
    record = to_record(producer, given, body, datetime.now(UTC))

    # A claim is read from a small body only: a bounded parse, and a bounded queue's memory.
    small = body if len(body) <= CLAIMS_MAX_BODY_BYTES else b""

    def claims(refused: Refusal) -> Claims:
        return lambda: claims_of(producer, refused, given, small)

    if isinstance(record, Refusal):
        return _answer(state, producer.source, record, claims=claims(record))
    registry, policy = state.registry(), state.settings.policy()
    # In a worker thread, whatever its size: judging is bounded work (the gate's cost
    # bounds) but not nothing, and the event loop serves every other connection.
    judged = await asyncio.to_thread(judge, record, registry, policy)
    if isinstance(judged, Dropped):
        return _dropped(producer.source, judged.rule)
    if not isinstance(judged, CompletionEvent):
        refused = refusal(judged)
        return _answer(state, producer.source, refused, claims=claims(refused))
    if judged.source != producer.source:
        return _answer(
            state,
            producer.source,
            Refusal("ambiguous", "the event's source is not the URL's producer"),
        )
    key = f"{judged.tenant}\x1f{judged.correlationid}".encode()
    headers = [(name.decode("ascii"), value or b"") for name, value in record.headers]
    try:
        appended = await state.send(key, body, headers)
    except KafkaUnavailable:
        return _answer(state, producer.source, Refusal("kafka_unavailable", "not acknowledged"))
    stale = stale_at(dataclasses.replace(record, arrived_at=appended), producer, policy)
    if stale is not None:
        # Written, but past the tolerance where the daemon judges it: it will be
        # quarantined, so the sender must hear a refusal, not 202.
        refused = refusal(stale)
        return _answer(state, producer.source, refused, claims=claims(refused))
    REQUESTS.labels(producer.source, "accepted").inc()
    log.debug("webhook accepted", extra={"producer": producer.source})
    return JSONResponse({"accepted": True}, status_code=202, headers=_SAFE_HEADERS)


def _dropped(producer: str, rule: str) -> JSONResponse:
    """200, not 202: acknowledged so the sender stops retrying, and not stored."""
    REQUESTS.labels(producer, "dropped").inc()
    DROPPED.labels(producer, rule).inc()
    log.info("webhook dropped", extra={"producer": producer, "outcome": "dropped", "rule": rule})
    return JSONResponse({"dropped": rule}, status_code=200, headers=_SAFE_HEADERS)


async def _handle_callback(
    state: IngressState,
    token: str,
    request: Request,
    started: float,
    slots: asyncio.Semaphore,
) -> JSONResponse:
    """A callback: refused early when the route is off or the token cannot be one; else
    the body is read (no slot held, as for webhooks), then the database is called in a
    slot."""
    complete = state.complete_callback
    if complete is None:
        return _answer(state, CALLBACK_PRODUCER, Refusal("callbacks_disabled", "no database"))
    refused = checked_token(token)
    if refused is not None:
        return _answer(state, CALLBACK_PRODUCER, refused)
    settings = state.settings
    body = await _read_body(request, settings, started + settings.ingress_read_timeout_s)
    if isinstance(body, Refusal):
        return _answer(state, CALLBACK_PRODUCER, body)
    headers = list(request.scope["headers"])
    made = to_callback(token, request.scope.get("query_string", b""), headers, body)
    if isinstance(made, Refusal):
        return _answer(state, CALLBACK_PRODUCER, made)
    if slots.locked():
        return _answer(state, CALLBACK_PRODUCER, Refusal("overloaded", "every slot is busy"))
    async with slots:
        IN_FLIGHT.inc()
        try:
            return await _complete(state, complete, made)
        finally:
            IN_FLIGHT.dec()


async def _complete(state: IngressState, complete: Complete, made: CallbackRequest) -> JSONResponse:
    refused: Refusal | None = None
    try:
        answer = await complete(made)
    except CallbackTypeRefused as exc:
        refused = Refusal("type_not_allowed", str(exc))
    except CallbackBusy as exc:
        refused = Refusal("busy", str(exc))
    except (TimeoutError, psycopg.Error) as exc:
        # Logged by class and SQLSTATE, the values it quotes withheld (matcher.logs).
        log.warning("callback not completed", extra={"callback": made.label, "error": exc})
        refused = Refusal("database_unavailable", "see the log")
    else:
        if answer.status not in _CALLBACK_ANSWERS:
            refused = Refusal("unknown_callback", "no such token")
    if refused is not None:
        return _answer(state, CALLBACK_PRODUCER, refused, label=made.label)
    status, reason = _CALLBACK_ANSWERS[answer.status]
    REQUESTS.labels(CALLBACK_PRODUCER, reason or "accepted").inc()
    log.info(
        "callback answered",
        extra={"callback": made.label, "outcome": reason or "accepted", "status": status},
    )
    body: dict[str, Any] = {"accepted": True} if reason is None else {"reason": reason}
    return JSONResponse(
        {**body, "outcome": answer.outcome}, status_code=status, headers=_SAFE_HEADERS
    )


async def _read_body(
    request: Request, settings: IngressSettings, deadline: float
) -> bytes | Refusal:
    """The body, up to the size limit, by ``deadline`` (monotonic) and at no less than the
    minimum rate; never buffered past the limit."""
    limit = settings.max_event_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return Refusal("too_large", f"content-length is over the limit of {limit} bytes")
    pace = _Pace(settings.ingress_min_body_rate_bps, deadline)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout_at(_loop_time(pace.next_deadline(0))) as bound:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    return Refusal("too_large", f"the body is over the limit of {limit} bytes")
                chunks.append(chunk)
                bound.reschedule(_loop_time(pace.next_deadline(size)))
    except TimeoutError:
        return Refusal("timeout", pace.why_late(size))
    except ClientDisconnect:
        return Refusal("timeout", "the client went away before its body arrived")
    return b"".join(chunks)


@dataclass(frozen=True)
class _Pace:
    """When a body's next bytes must have arrived: by the read deadline, and at the
    minimum rate counted from a first second of grace."""

    rate_bps: int
    deadline: float  # monotonic
    began: float = dataclasses.field(default_factory=time.monotonic)

    def next_deadline(self, received: int) -> float:
        if self.rate_bps <= 0:
            return self.deadline
        return min(self.deadline, self.began + _RATE_GRACE_S + received / self.rate_bps)

    def why_late(self, received: int) -> str:
        if time.monotonic() >= self.deadline:
            return "the body did not arrive within the read timeout"
        return f"the body arrived slower than {self.rate_bps} bytes/s ({received} bytes so far)"


def _loop_time(monotonic_deadline: float) -> float:
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_deadline - time.monotonic())


def _answer(
    state: IngressState,
    producer: str,
    refused: Refusal,
    status: int | None = None,
    label: str | None = None,
    claims: Claims | None = None,
) -> JSONResponse:
    """The refusal's answer (its reason and detail), logged, counted and recorded."""
    status = status or refused.status
    REQUESTS.labels(producer, refused.reason).inc()
    extra = {"producer": producer, "outcome": refused.reason, "detail": _logged(refused)}
    if label is not None:
        extra["callback"] = label
    via = "callback" if producer == CALLBACK_PRODUCER else "webhook"
    log.info(f"{via} refused", extra=extra)
    told = refused.told or refused.detail
    if state.refusals is not None:
        state.refusals.offer(
            via, producer, refused.reason, told, status,
            claims or (lambda: claims_of(None, refused, [], b"")),
        )  # fmt: skip
    headers = dict(_SAFE_HEADERS)
    if refused.reason in _RETRY_AFTER_S:
        headers["Retry-After"] = _RETRY_AFTER_S[refused.reason]
    answer = {"reason": refused.reason}
    if refused.told is not None:
        answer["detail"] = refused.told
    elif via == "webhook" and refused.reason in _ANSWERED_DETAIL:
        detail = refused.detail[:_MAX_ANSWERED_DETAIL]
        if not _MARKUP.search(detail):
            answer["detail"] = detail
    return JSONResponse(answer, status_code=status, headers=headers)


def _logged(refused: Refusal) -> str:
    """A refusal's detail for the log: matcher's own words, a field's place and kind, a
    mapped value; a schema's complaint only up to where it would quote the data."""
    if refused.reason == "schema_invalid":
        return refused.detail.split(":", 1)[0]
    return refused.detail
