"""Verdicts of many waits at once: the overview's and the runs list's. The oldest
``OLDEST_WAITING`` waiting waits are explained with the same pure function as
``matcher explain``, from facts read in a few statements and one ask of Kafka for the lag."""

from __future__ import annotations

import dataclasses
from collections import Counter

import psycopg_pool

from matcher.admin.explain import consumer_lag, explain_with_lag
from matcher.config import Settings
from matcher.domain.explain import ExplainFacts, Explanation, Verdict
from matcher.domain.waits import Wait
from matcher.store.browsing import Overview, clock, overview, waiting_facts

OLDEST_WAITING = 200
LAG_WAIT_S = 3.0
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
