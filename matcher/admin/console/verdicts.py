"""Verdicts of many waits at once: the overview's and the runs list's. The oldest
``OLDEST_WAITING`` waiting waits are explained with the same pure function as
``matcher explain``, from facts read in a few statements and one ask of Kafka for the lag."""

from __future__ import annotations

import dataclasses
from collections import Counter
from uuid import UUID

import psycopg_pool

from matcher.admin.explain import consumer_lag, explain_with_lag
from matcher.config import Settings
from matcher.domain.explain import ExplainFacts, Explanation, Verdict
from matcher.domain.waits import Wait, WaitState
from matcher.store.browsing import (
    Overview,
    clock,
    facts_of_waits,
    overview,
    waiting_facts,
    worker_failures_of,
)

OLDEST_WAITING = 200
LAG_WAIT_S = 3.0
# A resolved wait's verdict, unless a worker's handler failed on its resume.
RESOLVED_VERDICTS = {
    WaitState.MATCHED: Verdict.RESOLVED_BY_EVENT,
    WaitState.TIMED_OUT: Verdict.TIMED_OUT,
    WaitState.CANCELLED: Verdict.CANCELLED,
}
WAITING_VERDICTS = [
    Verdict.MISSING_SIGNAL,
    Verdict.MISMATCH,
    Verdict.BACKLOG,
    Verdict.WAITING,
]


def judged(
    facts: list[ExplainFacts], lag: dict[int, int] | None, why: str
) -> list[tuple[Wait, Explanation]]:
    return [(f.wait, explain_with_lag(f, lag, why)) for f in facts]


@dataclasses.dataclass
class Summary:
    overview: Overview
    lag: dict[int, int] | None
    verdicts: Counter[str]


async def summary(settings: Settings, pool: psycopg_pool.AsyncConnectionPool) -> Summary:
    async with pool.connection() as conn:
        found = await overview(conn, OLDEST_WAITING)
    lag, why = await consumer_lag(settings, LAG_WAIT_S)
    counts: Counter[str] = Counter({v.value: 0 for v in WAITING_VERDICTS})
    counts.update(e.verdict.value for _, e in judged(found.facts, lag, why))
    return Summary(found, lag, counts)


async def waiting_judged(
    settings: Settings, pool: psycopg_pool.AsyncConnectionPool
) -> list[tuple[Wait, Explanation]]:
    """The oldest waiting waits with their verdicts, oldest first."""
    async with pool.connection() as conn:
        now = await clock(conn)
        facts = await waiting_facts(conn, OLDEST_WAITING, now)
    lag, why = await consumer_lag(settings, LAG_WAIT_S)
    return judged(facts, lag, why)


async def of_waits(
    settings: Settings, pool: psycopg_pool.AsyncConnectionPool, waits: list[Wait]
) -> dict[UUID, Verdict]:
    """The verdicts of a page of waits, in a few statements for the page (not one explain
    per wait) and one ask of Kafka for the lag when any of them still waits."""
    waiting = [w for w in waits if w.state == WaitState.WAITING]
    resolved = [w for w in waits if w.state != WaitState.WAITING]
    found = {w.id: RESOLVED_VERDICTS[w.state] for w in resolved}
    async with pool.connection() as conn:
        failing = await worker_failures_of(conn, resolved)
        facts = await facts_of_waits(conn, waiting, await clock(conn)) if waiting else []
    for wait_id, parked in failing.items():
        found[wait_id] = Verdict.PARKED if parked else Verdict.WORKER_FAILING
    if facts:
        lag, why = await consumer_lag(settings, LAG_WAIT_S)
        found.update((w.id, e.verdict) for w, e in judged(facts, lag, why))
    return found
