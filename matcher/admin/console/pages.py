"""The console's pages: overview, runs, a run, events, quarantine and its replay."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from matcher.admin.console import verdicts
from matcher.admin.console.auth import (
    Access,
    Visitor,
    context,
    first,
    require,
    require_post,
    set_session,
)
from matcher.admin.console.preview import headers, show
from matcher.admin.console.render import BadRequest, choice, html, ident, pager, paging
from matcher.admin.console.replaying import replay_records
from matcher.admin.console.timeline import related, timeline
from matcher.admin.explain import explain_run
from matcher.admin.state import AdminState
from matcher.domain.events import BIGINT_MAX, REASONS, RefusedDelivery
from matcher.domain.explain import Verdict
from matcher.domain.waits import Wait, WaitState
from matcher.store import browsing as store
from matcher.store.explain import gather
from matcher.store.views import view_rows_async

STATES = [s.value for s in WaitState]
VERDICTS = [v.value for v in Verdict]
# Verdicts past the resume topic: listed from the workers' failures.
WORKER_VERDICTS = ("parked", "worker_failing")
RESOLVED_STATE = {
    "resolved_by_event": "matched",
    "timed_out": "timed_out",
    "cancelled": "cancelled",
}


def routes(state: AdminState, access: Access) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/console")
    async def overview_page(request: Request) -> Response:
        visitor = await require(access, request)
        found = await verdicts.summary(state.settings, state.pool)
        return _page(
            visitor,
            "overview.html",
            open_console=access.sessions.open,
            summary=found,
            total_lag=None if found.lag is None else sum(found.lag.values()),
            oldest_waiting=verdicts.OLDEST_WAITING,
            reasons=list(REASONS),
        )

    @router.get("/console/runs")
    async def runs_page(request: Request) -> Response:
        visitor = await require(access, request)
        return await _runs(state, visitor, request)

    @router.get("/console/runs/{run_id:path}")
    async def run_page(request: Request, run_id: str) -> Response:
        visitor = await require(access, request)
        return await _run(state, visitor, run_id, ident(request.query_params, "tenant"))

    @router.get("/console/events")
    async def events_page(request: Request) -> Response:
        visitor = await require(access, request)
        return await _events(state, visitor, request)

    @router.get("/console/quarantine")
    async def quarantine_page(request: Request) -> Response:
        visitor = await require(access, request)
        return await _quarantine(state, visitor, request)

    @router.get("/console/refusals")
    async def refusals_page(request: Request) -> Response:
        visitor = await require(access, request)
        return await _refusals(state, visitor, request)

    @router.post("/console/quarantine/replay")
    async def replay_page(request: Request) -> Response:
        visitor, fields = await require_post(access, request)
        return await _replay(state, visitor, fields)

    return router


def _page(visitor: Visitor, template: str, status: int = 200, **values: Any) -> Response:
    response = html(template, context(visitor, **values), status)
    if visitor.new and visitor.session is not None:
        set_session(response, visitor.secure, visitor.session)
    return response


def _wait_filters(request: Request) -> dict[str, Any]:
    params = request.query_params
    filters = {
        "tenant": ident(params, "tenant"),
        "state": choice(params, "state", STATES),
        "verdict": choice(params, "verdict", VERDICTS),
        "correlation_id": ident(params, "correlation_id"),
        "job_id": ident(params, "job_id"),
        "run_id": ident(params, "run_id"),
        "sort": choice(params, "sort", ["age_asc", "age_desc"]) or "age_asc",
    }
    if not any(filters[k] for k in ("state", "verdict", "correlation_id", "job_id", "run_id")):
        filters["state"] = "waiting"
    return filters


async def _runs(state: AdminState, visitor: Visitor, request: Request) -> Response:
    filters = _wait_filters(request)
    limit, offset = paging(request.query_params)
    verdict = filters["verdict"]
    notice = None
    shown: list[tuple[Wait, str | None]] = []
    more = False
    if verdict in RESOLVED_STATE:
        filters["state"] = RESOLVED_STATE[verdict]
    if verdict in WORKER_VERDICTS:
        async with state.pool.connection() as conn:
            failing = await store.waits_with_worker_failures(
                conn, parked=verdict == "parked", limit=limit + 1, offset=offset
            )
        shown, more = [(w, verdict) for w in failing[:limit]], len(failing) > limit
    elif verdict is not None and verdict not in RESOLVED_STATE:
        judged = await verdicts.waiting_judged(state.settings, state.pool)
        matching: list[tuple[Wait, str | None]] = [
            (w, e.verdict.value) for w, e in judged if _keep(w, filters, verdict == e.verdict)
        ]
        if filters["sort"] == "age_desc":
            matching.reverse()
        shown, more = matching[offset : offset + limit], len(matching) > offset + limit
        notice = f"Verdicts are those of the {verdicts.OLDEST_WAITING} oldest waiting waits."
    else:
        try:
            async with state.pool.connection() as conn:
                waits = await store.waits_page(conn, _wait_query(filters, limit, offset))
            found = await verdicts.of_waits(state.settings, state.pool, waits[:limit])
            shown = [(w, found[w.id].value) for w in waits[:limit]]
            more = len(waits) > limit
        except store.NeedsKey:
            notice = "Resolved waits are listed by run id, correlation id or external job id."
    return _page(
        visitor,
        "runs.html",
        filters=filters,
        rows=shown,
        notice=notice,
        states=STATES,
        verdicts=VERDICTS,
        pages=pager("/console/runs", filters, limit, offset, more),
        limit=limit,
    )


def _keep(wait: Wait, filters: dict[str, Any], verdict_matches: bool) -> bool:
    return (
        verdict_matches
        and filters["tenant"] in (None, wait.tenant)
        and filters["run_id"] in (None, wait.run_id)
        and filters["correlation_id"] in (None, wait.correlation_id)
        and filters["job_id"] in (None, wait.external_job_id)
    )


def _wait_query(filters: dict[str, Any], limit: int, offset: int) -> store.WaitQuery:
    return store.WaitQuery(
        tenant=filters["tenant"],
        state=filters["state"],
        run_id=filters["run_id"],
        correlation_id=filters["correlation_id"],
        job_id=filters["job_id"],
        newest=filters["sort"] == "age_desc",
        limit=limit + 1,
        offset=offset,
    )


async def _run(state: AdminState, visitor: Visitor, run_id: str, tenant: str | None) -> Response:
    if len(run_id) > 512 or "\x00" in run_id:
        raise BadRequest("a run id is at most 512 characters, without NUL")
    # One connection per step: gather opens its own read-only snapshot, which must not
    # start inside the implicit transaction of an earlier statement.
    async with state.pool.connection() as conn:
        waits = await store.run_waits(conn, run_id, tenant)
    tenants = sorted({w.tenant for w in waits})
    if not waits:
        return _page(visitor, "not_found.html", 404, what=f"No waits for run {run_id!r}.")
    if len(tenants) > 1:
        return _page(visitor, "choose_tenant.html", run_id=run_id, tenants=tenants)
    current = waits[-1]
    async with state.pool.connection() as conn:
        facts = await gather(conn, run_id, current.tenant)
    async with state.pool.connection() as conn:
        explanation = await explain_run(state.settings, conn, run_id, current.tenant)
    async with state.pool.connection() as conn:
        record = await store.run_record(conn, current.tenant, run_id, facts.wait.id)
    return _page(
        visitor,
        "run.html",
        run_id=run_id,
        tenant=current.tenant,
        waits=waits,
        current=facts.wait,
        timeline=timeline(facts, record),
        related=related(facts),
        explanation=explanation,
        record=record,
    )


async def _events(state: AdminState, visitor: Visitor, request: Request) -> Response:
    params = request.query_params
    correlation_id, job_id = ident(params, "correlation_id"), ident(params, "job_id")
    limit, offset = paging(params)
    async with state.pool.connection() as conn:
        events = await store.events_page(conn, correlation_id, job_id, limit + 1, offset)
        ids = {i for e in events for i in (e.consumed_by, e.late_for) if i is not None}
        runs = await store.runs_of_waits(conn, ids)
    filters = {"correlation_id": correlation_id, "job_id": job_id}
    return _page(
        visitor,
        "events.html",
        filters=filters,
        events=events[:limit],
        runs=runs,
        pages=pager("/console/events", filters, limit, offset, len(events) > limit),
    )


async def _quarantine(state: AdminState, visitor: Visitor, request: Request) -> Response:
    params = request.query_params
    filters = {
        "reason": choice(params, "reason", list(REASONS)),
        "producer": ident(params, "producer"),
        "correlation_id": ident(params, "correlation_id"),
    }
    limit, offset = paging(params)
    async with state.pool.connection() as conn:
        query = store.QuarantineQuery(**filters, limit=limit + 1, offset=offset)
        rows = await store.quarantine_page(conn, query)
    previews = [
        (row.record, headers(row.headers), show(row.value_preview, row.value_size))
        for row in rows[:limit]
    ]
    return _page(
        visitor,
        "quarantine.html",
        filters=filters,
        rows=previews,
        reasons=list(REASONS),
        pages=pager("/console/quarantine", filters, limit, offset, len(rows) > limit),
    )


async def _refusals(state: AdminState, visitor: Visitor, request: Request) -> Response:
    params = request.query_params
    filters = {
        "reason": ident(params, "reason"),
        "producer": ident(params, "producer"),
        "correlation_id": ident(params, "correlation_id"),
    }
    limit, offset = paging(params)
    async with state.pool.connection() as conn:
        found = await view_rows_async(
            conn, "refusals", {**filters, "limit": limit + 1, "offset": offset}
        )
    return _page(
        visitor,
        "refusals.html",
        filters=filters,
        rows=[RefusedDelivery.model_validate(r) for r in found[:limit]],
        pages=pager("/console/refusals", filters, limit, offset, len(found) > limit),
    )


async def _replay(state: AdminState, visitor: Visitor, fields: dict[str, list[str]]) -> Response:
    try:
        ids = sorted({int(v) for v in fields.get("ids", [])})
    except ValueError:
        raise BadRequest("ids must be quarantine ids") from None
    if any(not 1 <= i <= BIGINT_MAX for i in ids):
        raise BadRequest(f"ids must be quarantine ids (whole numbers from 1 to {BIGINT_MAX})")
    reason = choice({"reason": first(fields, "reason")}, "reason", list(REASONS))
    if not ids and reason is None:
        raise BadRequest("select records, or filter by a reason, to replay")
    if first(fields, "confirm") != "yes":
        if ids:
            count = len(ids)
        else:
            assert reason is not None
            async with state.pool.connection() as conn:
                count = await store.unreplayed_with_reason(conn, reason)
        return _page(visitor, "replay_confirm.html", ids=ids, reason=reason, count=count)
    outcomes, problem = await replay_records(state, ids, reason)
    return _page(visitor, "replay_done.html", outcomes=outcomes, problem=problem, ids=ids)
