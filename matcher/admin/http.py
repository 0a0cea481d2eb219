"""The admin HTTP API inside the daemon: health, readiness, metrics, and read-only views
(explain, waits, events, quarantine). FastAPI publishes its OpenAPI description at
``/openapi.json``; a copy is in ``schemas/openapi.json``.
"""

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

import psycopg
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from matcher import __version__
from matcher.admin.explain import explain_run, explanation_body
from matcher.config import Settings
from matcher.domain.explain import Verdict
from matcher.domain.waits import Wait
from matcher.store.explain import AmbiguousRun, UnknownRun
from matcher.store.sql import query


@dataclass
class AdminState:
    settings: Settings
    pool: AsyncConnectionPool
    # Readiness of the Kafka side: partitions this daemon's consumer holds (None: not
    # in the group yet).
    assigned_partitions: Callable[[], int | None]
    kafka_reachable: Callable[[], Awaitable[bool]]


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


class Event(BaseModel):
    producer: str
    event_id: str
    tenant: str
    type: str
    correlation_id: str
    external_job_id: str | None
    occurred_at: datetime | None
    received_at: datetime
    kafka_topic: str | None
    kafka_partition: int | None
    kafka_offset: int | None
    data: Any
    status: str
    consumed_by: UUID | None
    late_for: UUID | None


class EventsPage(BaseModel):
    items: list[Event]
    next_offset: int | None


class QuarantineRecord(BaseModel):
    id: int
    received_at: datetime
    kafka_topic: str
    kafka_partition: int
    kafka_offset: int
    reason: str
    detail: str | None
    producer: str | None
    event_id: str | None
    tenant: str | None
    type: str | None
    correlation_id: str | None
    replayed_at: datetime | None
    replay_result: str | None


class QuarantinePage(BaseModel):
    items: list[QuarantineRecord]
    next_offset: int | None


class Problem(BaseModel):
    detail: str


Limit = Annotated[int, Query(ge=1, le=1000, description="Page size.")]
# Identifiers as stored: bounded, and never NUL (which Postgres text cannot hold).
_IDENT_PATTERN = "^[^\\x00]*$"
Ident = Annotated[str | None, Query(max_length=512, pattern=_IDENT_PATTERN)]
Offset = Annotated[int, Query(ge=0, le=1_000_000, description="Items to skip.")]


def _page(rows: list[Any], limit: int, offset: int) -> tuple[list[Any], int | None]:
    # One row more than asked tells whether another page exists.
    return rows[:limit], (offset + limit if len(rows) > limit else None)


def create_app(state: AdminState) -> FastAPI:
    app = FastAPI(
        title="matcher admin API",
        version=__version__,
        description="Health, metrics, and read-only views of waits, events and quarantine, "
        "and `explain` for any run. `/v1/*` takes `Authorization: Bearer <token>` when "
        "MATCHER_ADMIN_TOKEN is set.",
    )
    bearer = HTTPBearer(auto_error=False)
    token = state.settings.admin_token

    async def authorised(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> None:
        if token is None:
            return
        given = credentials.credentials if credentials else ""
        if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
            raise HTTPException(
                401, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"}
            )

    v1 = [Depends(authorised)]
    errors: dict[int | str, dict[str, Any]] = {
        401: {"model": Problem},
        404: {"model": Problem},
        409: {"model": Problem},
    }

    async def rows(name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with state.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query("views", name), params)
            return await cur.fetchall()

    @app.get("/healthz", response_model=Health, tags=["operations"])
    async def healthz() -> Health:
        """Alive: the process answers."""
        return Health(status="ok")

    @app.get(
        "/readyz",
        response_model=Readiness,
        responses={503: {"model": Readiness}},
        tags=["operations"],
    )
    async def readyz() -> Any:
        """Ready: Postgres and Kafka reachable, partitions of the events topic assigned."""
        try:
            async with state.pool.connection(timeout=2) as conn:
                await conn.execute("SELECT 1")
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

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def prometheus_metrics() -> Response:
        """Prometheus exposition format."""
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get(
        "/v1/runs/{run_id}/explain",
        response_model=ExplainResponse,
        dependencies=v1,
        responses=errors,
        tags=["inspect"],
    )
    async def explain_endpoint(
        run_id: Annotated[str, Path(max_length=512, pattern=_IDENT_PATTERN)],
        tenant: Annotated[
            str | None,
            Query(
                max_length=512,
                pattern=_IDENT_PATTERN,
                description="Needed when run ids repeat across tenants.",
            ),
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

    @app.get(
        "/v1/waits", response_model=WaitsPage, dependencies=v1, responses=errors, tags=["inspect"]
    )
    async def list_waits(
        tenant: Ident = None,
        state_: Annotated[
            str | None, Query(alias="state", pattern="^(waiting|matched|timed_out|cancelled)$")
        ] = None,
        run_id: Ident = None,
        correlation_id: Ident = None,
        external_job_id: Ident = None,
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> WaitsPage:
        """Waits, newest first."""
        found = await rows(
            "waits",
            {
                "tenant": tenant,
                "state": state_,
                "run_id": run_id,
                "correlation_id": correlation_id,
                "external_job_id": external_job_id,
                "limit": limit + 1,
                "offset": offset,
            },
        )
        items, next_offset = _page(found, limit, offset)
        return WaitsPage(items=[Wait.model_validate(r) for r in items], next_offset=next_offset)

    @app.get(
        "/v1/events", response_model=EventsPage, dependencies=v1, responses=errors, tags=["inspect"]
    )
    async def list_events(
        tenant: Ident = None,
        correlation_id: Ident = None,
        status: Annotated[str | None, Query(pattern="^(pending|consumed|late|expired)$")] = None,
        external_job_id: Ident = None,
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> EventsPage:
        """Stored events, newest first."""
        found = await rows(
            "events",
            {
                "tenant": tenant,
                "correlation_id": correlation_id,
                "status": status,
                "external_job_id": external_job_id,
                "limit": limit + 1,
                "offset": offset,
            },
        )
        items, next_offset = _page(found, limit, offset)
        return EventsPage(items=[Event.model_validate(r) for r in items], next_offset=next_offset)

    @app.get(
        "/v1/quarantine",
        response_model=QuarantinePage,
        dependencies=v1,
        responses=errors,
        tags=["inspect"],
    )
    async def list_quarantine(
        reason: Ident = None,
        correlation_id: Ident = None,
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> QuarantinePage:
        """Quarantined records, newest first (raw bytes are not served here)."""
        found = await rows(
            "quarantine",
            {
                "reason": reason,
                "correlation_id": correlation_id,
                "limit": limit + 1,
                "offset": offset,
            },
        )
        items, next_offset = _page(found, limit, offset)
        return QuarantinePage(
            items=[QuarantineRecord.model_validate(r) for r in items], next_offset=next_offset
        )

    @app.exception_handler(psycopg.OperationalError)
    async def database_unavailable(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
        return JSONResponse({"detail": "the database is unavailable"}, status_code=503)

    return app
