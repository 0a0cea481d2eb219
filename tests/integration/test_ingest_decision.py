"""matcher.ingest_events decides as matcher.domain.matching.decide_batch does.

The function restates the decision in SQL (migration 0016) for keys where it needs no
order, and leaves the others to the rematch loop, which runs decide_batch itself. On
random worlds (waits in every state, ids stored before, batches with repeated ids and
keys), against the real function:

- after the batch and the rematch passes it queued, every event's status and wait, and
  every wait's resolution, are decide_batch's for the whole batch;
- right after the batch, the keys it decided (not queued, and without two new events
  finding waiting waits) are decided as decide_batch decides them, and the others are
  stored pending and queued.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from matcher.domain.events import CompletionEvent
from matcher.domain.matching import (
    BatchDecision,
    Key,
    NewEvent,
    WaitView,
    decide_batch,
)
from matcher.domain.records import IngestRecord
from matcher.domain.waits import WaitState
from matcher.store.ingest import BatchResult, store_batch
from matcher.store.rematch import rematch_once
from tests.support.assertions import env_flag

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEYS: list[Key] = [("acme", "c1"), ("acme", "c2"), ("globex", "c1")]
TYPES = ["done", "failed", "progress"]
IDS = [("p1", f"e{i}") for i in range(8)] + [("p2", "e0")]


@dataclass(frozen=True)
class World:
    waits: list[WaitView]
    stored: set[tuple[str, str]]  # ids stored before the batch
    queued: set[Key]  # keys already waiting for a rematch pass
    batch: list[NewEvent]  # in arrival order
    # Waits with a condition: "$.n >= k" by wait id (an event's data is {"n": its place}).
    thresholds: dict[uuid.UUID, int]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    waits = []
    thresholds: dict[uuid.UUID, int] = {}
    for n in range(draw(st.integers(0, 8))):
        state = draw(st.sampled_from(list(WaitState)))
        tenant, correlation = draw(st.sampled_from(KEYS))
        wait_id = uuid.UUID(int=draw(st.integers(1, 2**64)) << 8 | n)
        types = draw(st.sets(st.sampled_from(TYPES), min_size=1))
        if draw(st.booleans()):
            thresholds[wait_id] = draw(st.integers(0, 6))
        waits.append(
            WaitView(
                id=wait_id,
                tenant=tenant,
                correlation_id=correlation,
                event_types=frozenset(types),
                progress_types=frozenset(draw(st.sets(st.sampled_from(TYPES))) - types),
                state=state,
                # Ties in created_at are drawn on purpose: the id breaks them.
                created_at=T0 + timedelta(seconds=draw(st.integers(0, 3))),
                resolved_at=None
                if state is WaitState.WAITING
                else T0 + timedelta(seconds=draw(st.integers(4, 7))),
            )
        )
    stored = draw(st.sets(st.sampled_from(IDS), max_size=3))
    batch = [
        NewEvent(
            producer, event_id, tenant, type_, correlation,
            refused_by=frozenset(w for w, k in thresholds.items() if n < k),
        )
        for n, ((producer, event_id), (tenant, correlation), type_) in enumerate(draw(
            st.lists(
                st.tuples(st.sampled_from(IDS), st.sampled_from(KEYS), st.sampled_from(TYPES)),
                min_size=1,
                max_size=12,
            )
        ))
    ]  # fmt: skip
    queued = draw(st.sets(st.sampled_from(KEYS), max_size=1))
    return World(waits, stored, queued, batch, thresholds)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    yield running
    running.close()


def _set_up(conn: psycopg.Connection[Any], world: World) -> None:
    conn.execute(
        "TRUNCATE matcher.outbox, matcher.launch_audit, matcher.launches, matcher.inbox,"
        " matcher.event_ids, matcher.quarantine, matcher.waits, matcher.match_queue"
    )
    for w in world.waits:
        done = w.state is not WaitState.WAITING
        conn.execute(
            "INSERT INTO matcher.waits (id, tenant, run_id, position, event_types,"
            " correlation_id, state, created_at, resolved_at, resolution, condition,"
            " progress_types, heartbeat_interval, heartbeat_due)"
            " VALUES (%s, %s, %s, 0, %s, %s, %s, %s, %s, %s, %s::jsonpath, %s,"
            " CASE WHEN %s THEN interval '1 hour' END, CASE WHEN %s THEN now() + '1 hour' END)",
            [
                w.id, w.tenant, f"run-{w.id}", sorted(w.event_types), w.correlation_id,
                w.state.value, w.created_at, w.resolved_at,
                {"matched": "event", "timed_out": "deadline", "cancelled": "cancel"}.get(
                    w.state.value
                ) if done else None,
                f"$.n >= {world.thresholds[w.id]}" if w.id in world.thresholds else None,
                sorted(w.progress_types) or None, bool(w.progress_types), bool(w.progress_types),
            ],
        )  # fmt: skip
    # The inserts queued their keys for a first look; the world says which are queued.
    conn.execute("DELETE FROM matcher.match_queue")
    for tenant, correlation in world.queued:
        conn.execute(
            "INSERT INTO matcher.match_queue (tenant, correlation_id) VALUES (%s, %s)",
            [tenant, correlation],
        )
    for producer, event_id in world.stored:
        # Stored long ago and settled: only a duplicate for the batch.
        conn.execute(
            "INSERT INTO matcher.inbox (producer, event_id, tenant, type, correlation_id,"
            " status) VALUES (%s, %s, 'old', 'old', 'old', 'expired')",
            [producer, event_id],
        )
        conn.execute(
            "INSERT INTO matcher.event_ids (producer, event_id) VALUES (%s, %s)",
            [producer, event_id],
        )


def _records(batch: list[NewEvent]) -> list[IngestRecord]:
    records = []
    for offset, e in enumerate(batch):
        event = CompletionEvent(
            id=e.event_id,
            source=e.producer,
            type=e.type,
            tenant=e.tenant,
            correlationid=e.correlation_id,
            data={"n": offset},
        )
        records.append(IngestRecord("events", 0, offset, None, None, (), event))
    return records


def _placements(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], tuple[str, Any]]:
    """Each event of the batch as stored: its status and the wait it names."""
    rows = conn.execute(
        "SELECT producer, event_id, status, coalesce(consumed_by, late_for, progress_for)"
        " FROM matcher.inbox WHERE tenant <> 'old'"
    ).fetchall()
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def _expected(decision: BatchDecision) -> dict[tuple[str, str], tuple[str, Any]]:
    return {p.event.event_key: (p.status.value, p.wait_id) for p in decision.placements}


def _resolutions(conn: psycopg.Connection[Any]) -> dict[uuid.UUID, tuple[str, str] | None]:
    rows = conn.execute(
        "SELECT w.id, w.resolved_by_producer, w.resolved_by_event_id,"
        " (SELECT count(*) FROM matcher.outbox AS o WHERE o.wait_id = w.id)"
        " FROM matcher.waits AS w WHERE w.resolution = 'event'"
        " AND w.resolved_by_producer IS NOT NULL"
    ).fetchall()
    assert all(r[3] == 1 for r in rows), "a wait resolved by an event has one resume"
    return {r[0]: (r[1], r[2]) for r in rows}


def _contended(world: World) -> set[Key]:
    """Keys where two or more of the batch's new events find a waiting wait."""
    seen = set(world.stored)
    takers: Counter[Key] = Counter()
    for e in world.batch:
        if e.event_key in seen:
            continue
        seen.add(e.event_key)
        if any(w.state is WaitState.WAITING and w.accepts(e) for w in world.waits):
            takers[e.key] += 1
    return {key for key, count in takers.items() if count > 1}


@settings(
    max_examples=env_flag("MATCHER_TEST_DECISION_EXAMPLES", 150),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(world=worlds())
def test_ingest_events_decides_as_decide_batch(
    db_url: str, loop: asyncio.AbstractEventLoop, world: World
) -> None:
    whole = decide_batch(world.batch, world.stored, world.waits)
    deferred = world.queued | _contended(world)
    at_once = decide_batch(world.batch, world.stored, world.waits, deferred=deferred)
    with psycopg.connect(db_url, autocommit=True) as conn:
        _set_up(conn, world)
        aconn = loop.run_until_complete(psycopg.AsyncConnection.connect(db_url))
        try:
            result: BatchResult = loop.run_until_complete(store_batch(aconn, _records(world.batch)))
            assert _placements(conn) == _expected(at_once)
            assert result.accepted == len(at_once.placements)
            assert result.duplicates == len(at_once.duplicates)
            assert result.matched == len(at_once.resolutions)
            queued = Counter(
                (r[0], r[1])
                for r in conn.execute("SELECT tenant, correlation_id FROM matcher.match_queue")
            )
            assert queued == Counter(world.queued | _contended(world))  # each once
            while loop.run_until_complete(rematch_once(aconn)).keys:
                pass
        finally:
            loop.run_until_complete(aconn.close())
        assert _placements(conn) == _expected(whole)
        assert _resolutions(conn) == {p.wait_id: p.event.event_key for p in whole.resolutions}
