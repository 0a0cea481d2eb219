"""Explain a run: facts from Postgres and Kafka, verdict from the pure function."""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg

from matcher.config import Settings
from matcher.domain.explain import Explanation, explain
from matcher.kafka.lag import group_lag, partition_for
from matcher.store.explain import gather


def explanation_body(run_id: str, explanation: Explanation) -> dict[str, Any]:
    """The JSON answer of ``matcher explain --json`` and of the HTTP endpoint."""
    return {
        "run_id": run_id,
        "tenant": explanation.evidence["wait"]["tenant"],
        "verdict": explanation.verdict,
        "reasons": explanation.reasons,
        "evidence": explanation.evidence,
    }


async def explain_run(
    settings: Settings,
    conn: psycopg.AsyncConnection[Any],
    run_id: str,
    tenant: str | None = None,
    lag: dict[int, int] | None = None,
    ask_kafka: bool = True,
) -> Explanation:
    """Raises ``UnknownRun`` or ``AmbiguousRun`` (from matcher.store.explain)."""
    facts = await gather(conn, run_id, tenant)
    wait = facts.wait
    if lag is None and ask_kafka and wait.state == "waiting":
        lag = await group_lag(
            settings.kafka_client_options(), settings.consumer_group, settings.events_topic
        )
    partition = None
    if lag:
        partition = partition_for(wait.tenant, wait.correlation_id, len(lag))
    return explain(dataclasses.replace(facts, partition=partition, lag=lag))
