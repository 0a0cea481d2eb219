"""Verdicts of many waits at once: the overview's and the runs list's. The oldest
``OLDEST_WAITING`` waiting waits are explained with the same pure function as
``matcher explain``, from facts read in a few statements and one ask of Kafka for the lag."""

from __future__ import annotations

import dataclasses
from collections import Counter

import psycopg_pool

from matcher.config import Settings
from matcher.domain.explain import ExplainFacts, Explanation, Verdict, explain
from matcher.domain.waits import Wait
from matcher.kafka.lag import group_lag, key_partitions
from matcher.store.browsing import Overview, clock, overview, waiting_facts

OLDEST_WAITING = 200
LAG_WAIT_S = 3.0
WAITING_VERDICTS = [
    Verdict.MISSING_SIGNAL,
    Verdict.MISMATCH,
    Verdict.BACKLOG,
    Verdict.WAITING,
]


async def consumer_lag(settings: Settings) -> tuple[dict[int, int] | None, str]:
    if not settings.kafka_bootstrap_servers:
        return None, "Kafka is not configured (MATCHER_KAFKA_BOOTSTRAP_SERVERS)"
    lag = await group_lag(
        settings.kafka_client_options(),
        settings.consumer_group,
        settings.events_topic,
        wait_s=LAG_WAIT_S,
    )
    return lag, "Kafka could not be asked"


def judged(
    facts: list[ExplainFacts], lag: dict[int, int] | None, why: str
) -> list[tuple[Wait, Explanation]]:
    out = []
    for f in facts:
        partitions = key_partitions(f.wait.tenant, f.wait.correlation_id, len(lag)) if lag else {}
        full = dataclasses.replace(f, partitions=partitions, lag=lag, lag_unknown_because=why)
        out.append((f.wait, explain(full)))
    return out


@dataclasses.dataclass
class Summary:
    overview: Overview
    lag: dict[int, int] | None
    verdicts: Counter[str]


async def summary(settings: Settings, pool: psycopg_pool.AsyncConnectionPool) -> Summary:
    async with pool.connection() as conn:
        found = await overview(conn, OLDEST_WAITING)
    lag, why = await consumer_lag(settings)
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
    lag, why = await consumer_lag(settings)
    return judged(facts, lag, why)
