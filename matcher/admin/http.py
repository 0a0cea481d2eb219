"""The admin HTTP API inside the daemon: health, readiness, metrics, and read-only views
(explain, waits, events, quarantine). FastAPI publishes its OpenAPI description at
``/openapi.json``; a copy is in ``schemas/openapi.json``.
"""

import hmac
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import psycopg
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from matcher import __version__
from matcher.admin import console
from matcher.admin.explain import explain_run, explanation_body
from matcher.admin.filters import (
    EventFilters,
    FilterIdent,
    QuarantineFilters,
    RefusalFilters,
    WaitFilters,
    page,
)
from matcher.admin.state import AdminState
from matcher.admin.throttle import FailureThrottle
from matcher.config import Settings
from matcher.domain.events import QuarantinedRecord, RefusedDelivery, StoredEvent
from matcher.domain.explain import Verdict
from matcher.domain.waits import Wait
from matcher.store import session
from matcher.store.explain import AmbiguousRun, UnknownRun
from matcher.store.views import View, view_rows_async


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    ready: bool
    postgres: bool
    kafka: bool
    assigned_partitions: int | None


class ExplainResponse(BaseModel):
    run_id: str
    tenant: str
    verdict: Verdict
    reasons: list[str]
    evidence: dict[str, Any]


class WaitsPage(BaseModel):
    items: list[Wait]
    next_offset: int | None


class EventsPage(BaseModel):
    items: list[StoredEvent]
    next_offset: int | None


class QuarantinePage(BaseModel):
    items: list[QuarantinedRecord]
    next_offset: int | None


class RefusalsPage(BaseModel):
    items: list[RefusedDelivery]
    next_offset: int | None


class Problem(BaseModel):
    detail: str


def _in_utc(row: dict[str, Any]) -> dict[str, Any]:
    # Every timestamp is served as RFC 3339 in UTC ("...Z"), whatever the session's
    # TimeZone: pydantic writes an aware datetime with its own offset.
    return {k: v.astimezone(UTC) if isinstance(v, datetime) else v for k, v in row.items()}


def create_app(state: AdminState) -> FastAPI:
    app = FastAPI(
        title="matcher admin API",
        version=__version__,
        description="Health, metrics, and read-only views of waits, events and quarantine, "
        "and `explain` for any run. `/v1/*` takes `Authorization: Bearer <token>` when "
        "MATCHER_ADMIN_TOKEN is set.",
        # A trailing slash would be redirected to a URL built from the Host header.
        redirect_slashes=False,
    )
    # Failed token attempts, per client address, on /v1 and the console alike.
    throttle = FailureThrottle(
        state.settings.admin_auth_failures_burst, state.settings.admin_auth_failure_interval_s
    )
    app.include_router(_operations(state))
    app.include_router(_inspection(state, [Depends(_bearer_check(state.settings, throttle))]))
    # The operator console (/console), behind the same admin token.
    console.mount(app, state, throttle)
    _handle_database_errors(app)
    return app


# The error bodies every /v1 route may answer with, for the OpenAPI document.
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem},
    429: {"model": Problem},
    404: {"model": Problem},
    409: {"model": Problem},
}


def _bearer_check(settings: Settings, throttle: FailureThrottle) -> Callable[..., Awaitable[None]]:
    """The /v1 dependency: the bearer token, compared in constant time (none if unset),
    unless the client's address failed too often (429)."""
    bearer = HTTPBearer(auto_error=False)
    token = settings.admin_token

    async def authorised(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        if token is None:
            return
        client = request.client.host if request.client is not None else "unknown"
        wait = throttle.retry_after(client)
        if wait is not None:
            raise HTTPException(
                429, "too many failed attempts: try again later",
                {"Retry-After": str(math.ceil(wait))},
            )  # fmt: skip
        given = credentials.credentials if credentials else ""
        if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
            throttle.failed(client)
            raise HTTPException(
                401, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"}
            )

    return authorised


def _operations(state: AdminState) -> APIRouter:
    """Health, readiness and metrics: open, for probes and scrapers."""
    router = APIRouter(tags=["operations"])

    @router.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        """Alive: the process answers."""
        return Health(status="ok")

    @router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
    async def readyz() -> Any:
        """Ready: Postgres and Kafka reachable, partitions of the events topic assigned."""
        try:
            async with state.pool.connection(timeout=2) as conn:
                await session.ping(conn)
            postgres = True
        except (psycopg.Error, TimeoutError, Exception):
            postgres = False
        kafka = await state.kafka_reachable()
        assigned = state.assigned_partitions()
        body = Readiness(
            ready=postgres and kafka and bool(assigned),
            postgres=postgres,
            kafka=kafka,
            assigned_partitions=assigned,
        )
        return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)

    @router.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        """Prometheus exposition format."""
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return router


def _inspection(state: AdminState, v1: list[Any]) -> APIRouter:
    """The /v1 read-only views and explain, behind the bearer check ``v1``."""
    router = APIRouter(tags=["inspect"])

    async def rows(name: View, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with state.pool.connection() as conn:
            return [_in_utc(row) for row in await view_rows_async(conn, name, params)]

    @router.get(
        "/v1/runs/{run_id}/explain",
        response_model=ExplainResponse,
        dependencies=v1,
        responses=_ERRORS,
    )
    async def explain_endpoint(
        # The same rule as the CLI's explain (RunFilters): one definition of an identifier.
        run_id: Annotated[FilterIdent, Path()],
        tenant: Annotated[
            FilterIdent | None, Query(description="Needed when run ids repeat across tenants.")
        ] = None,
    ) -> ExplainResponse:
        """Why the run is where it is: its latest wait's verdict, reasons and evidence."""
        async with state.pool.connection() as conn:
            try:
                explanation = await explain_run(state.settings, conn, run_id, tenant)
            except UnknownRun:
                raise HTTPException(404, f"no waits for run {run_id!r}") from None
            except AmbiguousRun as exc:
                raise HTTPException(409, f"{exc}: give ?tenant=") from None
        return ExplainResponse(**explanation_body(run_id, explanation))

    @router.get("/v1/waits", response_model=WaitsPage, dependencies=v1, responses=_ERRORS)
    async def list_waits(filters: Annotated[WaitFilters, Query()]) -> WaitsPage:
        """Waits, newest first."""
        items, next_offset = page(await rows("waits", filters.params()), filters)
        return WaitsPage(items=[Wait.model_validate(r) for r in items], next_offset=next_offset)

    @router.get("/v1/events", response_model=EventsPage, dependencies=v1, responses=_ERRORS)
    async def list_events(filters: Annotated[EventFilters, Query()]) -> EventsPage:
        """Stored events, newest first."""
        items, next_offset = page(await rows("events", filters.params()), filters)
        return EventsPage(
            items=[StoredEvent.model_validate(r) for r in items], next_offset=next_offset
        )

    @router.get("/v1/quarantine", response_model=QuarantinePage, dependencies=v1, responses=_ERRORS)
    async def list_quarantine(filters: Annotated[QuarantineFilters, Query()]) -> QuarantinePage:
        """Quarantined records, newest first (raw bytes are not served here)."""
        items, next_offset = page(await rows("quarantine", filters.params()), filters)
        return QuarantinePage(
            items=[QuarantinedRecord.model_validate(r) for r in items], next_offset=next_offset
        )

    @router.get("/v1/refusals", response_model=RefusalsPage, dependencies=v1, responses=_ERRORS)
    async def list_refusals(filters: Annotated[RefusalFilters, Query()]) -> RefusalsPage:
        """Deliveries the webhook ingress refused, newest first: the reason, the detail,
        and what each claimed (producer, event id, type, tenant, correlation id), never
        verified. Kept for MATCHER_QUARANTINE_RETENTION."""
        items, next_offset = page(await rows("refusals", filters.params()), filters)
        return RefusalsPage(
            items=[RefusedDelivery.model_validate(r) for r in items], next_offset=next_offset
        )

    return router


def _handle_database_errors(app: FastAPI) -> None:
    """A database that is down or not migrated is a 503 with a sentence, not a 500."""

    @app.exception_handler(psycopg.OperationalError)
    async def database_unavailable(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
        return JSONResponse({"detail": "the database is unavailable"}, status_code=503)

    @app.exception_handler(psycopg.errors.UndefinedTable)
    async def schema_missing(request: Request, exc: psycopg.errors.UndefinedTable) -> JSONResponse:
        return JSONResponse(
            {"detail": "the database has no matcher schema: run `matcher migrate`"},
            status_code=503,
        )
