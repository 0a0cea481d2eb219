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
from dataclasses import dataclass, field, replace
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
    # Fan-in waits (waiting), by id: how many conditions they need, and their own key
    # (which no event may resolve them by). Their conditions are waits with group_id.
    groups: dict[uuid.UUID, tuple[int, Key]] = field(default_factory=dict)

    def needs(self) -> dict[uuid.UUID, int]:
        """How many more conditions each fan-in wait needs."""
        met = Counter(w.group_id for w in self.waits if w.group_id and w.state is WaitState.MATCHED)
        return {g: needed - met[g] for g, (needed, _) in self.groups.items()}


@st.composite
def worlds(draw: st.DrawFn) -> World:
    waits = []
    thresholds: dict[uuid.UUID, int] = {}
    group_ids = [uuid.UUID(int=(1 << 120) | g) for g in range(draw(st.integers(0, 2)))]
    for n in range(draw(st.integers(0, 8))):
        state = draw(st.sampled_from(list(WaitState)))
        tenant, correlation = draw(st.sampled_from(KEYS))
        wait_id = uuid.UUID(int=draw(st.integers(1, 2**64)) << 8 | n)
        types = draw(st.sets(st.sampled_from(TYPES), min_size=1))
        if draw(st.booleans()):
            thresholds[wait_id] = draw(st.integers(0, 6))
        # A fan-in condition (of a waiting fan-in wait): waiting, or met already.
        group = (
            draw(st.sampled_from([None, *group_ids]))
            if group_ids and state in (WaitState.WAITING, WaitState.MATCHED)
            else None
        )
        if group is not None:
            tenant = "acme"  # a fan-in wait's conditions are of its tenant
        waits.append(
            WaitView(
                id=wait_id,
                tenant=tenant,
                correlation_id=correlation,
                event_types=frozenset(types),
                group_id=group,
                progress_types=frozenset()
                if group
                else frozenset(draw(st.sets(st.sampled_from(TYPES))) - types),
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
    groups: dict[uuid.UUID, tuple[int, Key]] = {}
    for g in group_ids:
        met = sum(1 for w in waits if w.group_id == g and w.state is WaitState.MATCHED)
        open_ = sum(1 for w in waits if w.group_id == g and w.state is WaitState.WAITING)
        needed = met + draw(st.integers(1, max(1, open_)))
        groups[g] = (needed, ("acme", draw(st.sampled_from(["c1", "c2"]))))
    return World(waits, stored, queued, batch, thresholds, groups)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    yield running
    running.close()


def _set_up(conn: psycopg.Connection[Any], world: World) -> None:
    conn.execute(
        "TRUNCATE matcher.resume_queue, matcher.open_waits, matcher.launch_audit,"
        " matcher.launches, matcher.inbox,"
        " matcher.event_ids, matcher.quarantine, matcher.waits, matcher.match_queue"
    )
    for g, (needed, (tenant, correlation)) in world.groups.items():
        conn.execute(
            "INSERT INTO matcher.waits (id, tenant, run_id, position, event_types,"
            " correlation_id, needed, created_at) VALUES (%s, %s, %s, 0, %s, %s, %s, %s)",
            [g, tenant, f"run-{g}", TYPES, correlation, needed, T0],
        )
    for index, w in enumerate(world.waits):
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
        if w.group_id is not None:
            conn.execute(
                "UPDATE matcher.waits SET group_id = %s, condition_index = %s WHERE id = %s",
                [w.group_id, index, w.id],
            )
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
    """The waits and fan-in conditions events resolved, by the event."""
    rows = conn.execute(
        "SELECT w.id, w.resolved_by_producer, w.resolved_by_event_id, w.group_id,"
        " (SELECT count(*) FROM matcher.resolutions AS o WHERE o.wait_id = w.id)"
        " FROM matcher.waits AS w WHERE w.resolution = 'event'"
        " AND w.resolved_by_producer IS NOT NULL AND w.needed IS NULL"
    ).fetchall()
    # A wait resolved by an event has one resume; a condition met, none of its own.
    assert all(r[4] == (0 if r[3] else 1) for r in rows), rows
    return {r[0]: (r[1], r[2]) for r in rows}


def _fan_ins(conn: psycopg.Connection[Any]) -> dict[uuid.UUID, tuple[str, int]]:
    """Each fan-in wait's state and resumes."""
    rows = conn.execute(
        "SELECT w.id, w.state,"
        " (SELECT count(*) FROM matcher.resolutions AS o WHERE o.wait_id = w.id)"
        " FROM matcher.waits AS w WHERE w.needed IS NOT NULL"
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _contended(world: World) -> set[Key]:
    """Keys where two or more of the batch's new events find a waiting wait, and the keys
    of new events that find conditions of one fan-in wait, two or more of them."""
    seen = set(world.stored)
    takers: Counter[Key] = Counter()
    by_group: dict[uuid.UUID, list[Key]] = {}
    waiting = sorted(
        (w for w in world.waits if w.state is WaitState.WAITING),
        key=lambda w: (w.created_at, str(w.id)),
    )
    for e in world.batch:
        if e.event_key in seen:
            continue
        seen.add(e.event_key)
        taker = next((w for w in waiting if w.accepts(e)), None)
        if taker is not None:
            takers[e.key] += 1
            if taker.group_id is not None:
                by_group.setdefault(taker.group_id, []).append(e.key)
    keys = {key for key, count in takers.items() if count > 1}
    return keys.union(*(k for k in by_group.values() if len(k) > 1))


def _after_rematch(world: World, deferred: set[Key], at_once: BatchDecision) -> BatchDecision:
    """What ingest and then the rematch pass decide together: the events ingest decided
    stay so; the deferred keys' events are decided next, in arrival order, against the
    waits as ingest left them (fan-in waits needing what ingest did not give them)."""
    taken = {p.wait_id for p in at_once.resolutions}
    needs = world.needs()
    for p in at_once.resolutions:
        group = next(w.group_id for w in world.waits if w.id == p.wait_id)
        if group is not None:
            needs[group] -= 1
    waits = [replace(w, state=WaitState.MATCHED) if w.id in taken else w for w in world.waits]
    left = [p.event for p in at_once.placements if p.event.key in deferred]
    later = decide_batch(left, (), waits, needs=needs)
    decided = [p for p in at_once.placements if p.event.key not in deferred]
    return BatchDecision(placements=decided + later.placements)


@settings(
    max_examples=env_flag("MATCHER_TEST_DECISION_EXAMPLES", 150),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(world=worlds())
def test_ingest_events_decides_as_decide_batch(
    db_url: str, loop: asyncio.AbstractEventLoop, world: World
) -> None:
    needs = world.needs()
    whole = decide_batch(world.batch, world.stored, world.waits, needs=needs)
    deferred = world.queued | _contended(world)
    at_once = decide_batch(world.batch, world.stored, world.waits, deferred=deferred, needs=needs)
    final = _after_rematch(world, deferred, at_once)
    if not world.groups:  # keys apart: deciding some first changes nothing
        assert _expected(final) == _expected(whole)
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
        assert _placements(conn) == _expected(final)
        assert _resolutions(conn) == {p.wait_id: p.event.event_key for p in final.resolutions}
        remaining = world.needs()
        for p in final.resolutions:
            group = next(w.group_id for w in world.waits if w.id == p.wait_id)
            if group is not None:
                remaining[group] -= 1
        assert _fan_ins(conn) == {
            g: ("matched", 1) if remaining[g] <= 0 else ("waiting", 0) for g in world.groups
        }
