"""Explain a run: facts from Postgres and Kafka, verdict from the pure function."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from enum import Enum
from typing import Any
from uuid import UUID

import psycopg

from matcher.config import Settings
from matcher.domain.explain import ExplainFacts, Explanation, explain, rfc3339
from matcher.kafka.lag import group_lag, key_partitions
from matcher.store.explain import gather


def jsonable(value: Any) -> Any:
    """``value`` as JSON types, every timestamp in the one output format (RFC 3339, UTC,
    ``Z``: matcher.domain.explain.rfc3339), UUIDs and enums as their strings."""
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Enum):
        return jsonable(value.value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return value


def explanation_body(run_id: str, explanation: Explanation) -> dict[str, Any]:
    """The JSON answer of ``matcher explain --json`` and of the HTTP endpoint."""
    body: dict[str, Any] = jsonable(
        {
            "run_id": run_id,
            "tenant": explanation.evidence["wait"]["tenant"],
            "verdict": explanation.verdict,
            "reasons": explanation.reasons,
            "evidence": explanation.evidence,
        }
    )
    return body


NO_KAFKA = "Kafka is not configured (MATCHER_KAFKA_BOOTSTRAP_SERVERS)"
KAFKA_SILENT = "Kafka could not be asked"


async def consumer_lag(
    settings: Settings, wait_s: float = 10.0
) -> tuple[dict[int, int] | None, str]:
    """The group's lag per partition, or None and why it is unknown."""
    if not settings.kafka_bootstrap_servers:
        return None, NO_KAFKA
    lag = await group_lag(
        settings.kafka_client_options(), settings.consumer_group, settings.events_topic, wait_s
    )
    return lag, KAFKA_SILENT


def explain_with_lag(facts: ExplainFacts, lag: dict[int, int] | None, why: str) -> Explanation:
    """The verdict on ``facts`` given the consumer lag: the one path from the lag, through
    the partitions the wait's events go to, to ``explain`` (the CLI, the API and the
    console all take it)."""
    wait = facts.wait
    partitions = key_partitions(wait.tenant, wait.correlation_id, len(lag)) if lag else {}
    return explain(
        dataclasses.replace(facts, partitions=partitions, lag=lag, lag_unknown_because=why)
    )


async def explain_run(
    settings: Settings,
    conn: psycopg.AsyncConnection[Any],
    run_id: str,
    tenant: str | None = None,
    lag: dict[int, int] | None = None,
    ask_kafka: bool = True,
) -> Explanation:
    """Raises ``UnknownRun`` or ``AmbiguousRun`` (from matcher.store.explain).

    Kafka is asked for the group's lag only when the wait still waits and Kafka is
    configured (an empty ``kafka_bootstrap_servers``: the CLI without Kafka settings)."""
    facts = await gather(conn, run_id, tenant)
    why = KAFKA_SILENT
    if lag is None and ask_kafka and facts.wait.state == "waiting":
        lag, why = await consumer_lag(settings)
    return explain_with_lag(facts, lag, why)
