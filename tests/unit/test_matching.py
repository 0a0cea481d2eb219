"""Property tests of the pure matching decision against a one-event-at-a-time model."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from matcher.domain.matching import (
    BatchDecision,
    InboxStatus,
    NewEvent,
    WaitView,
    decide_batch,
)
from matcher.domain.waits import WaitState

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TENANTS = ["acme", "globex"]
CORRELATIONS = ["c1", "c2", "c3"]
TYPES = ["job.completed", "job.failed", "job.progress"]

events_st = st.lists(
    st.builds(
        NewEvent,
        producer=st.sampled_from(["p1", "p2"]),
        event_id=st.sampled_from([f"e{i}" for i in range(12)]),
        tenant=st.sampled_from(TENANTS),
        type=st.sampled_from(TYPES),
        correlation_id=st.sampled_from(CORRELATIONS),
    ),
    max_size=25,
)


@st.composite
def waits_st(draw: st.DrawFn) -> list[WaitView]:
    count = draw(st.integers(0, 10))
    waits = []
    for n in range(count):
        state = draw(st.sampled_from(list(WaitState)))
        waits.append(
            WaitView(
                id=uuid.UUID(int=n + 1),
                tenant=draw(st.sampled_from(TENANTS)),
                correlation_id=draw(st.sampled_from(CORRELATIONS)),
                event_types=frozenset(draw(st.sets(st.sampled_from(TYPES), min_size=1))),
                state=state,
                created_at=T0 + timedelta(seconds=draw(st.integers(0, 100))),
                resolved_at=None
                if state is WaitState.WAITING
                else T0 + timedelta(seconds=draw(st.integers(101, 200))),
            )
        )
    return waits


stored_st = st.sets(
    st.tuples(st.sampled_from(["p1", "p2"]), st.sampled_from([f"e{i}" for i in range(12)])),
    max_size=4,
)


def model(
    events: list[NewEvent], stored: set[tuple[str, str]], waits: list[WaitView]
) -> list[tuple[str, str, str, uuid.UUID | None]]:
    """The rules read literally, one event at a time, over a mutable list of waits."""
    seen = set(stored)
    live = list(waits)
    out: list[tuple[str, str, str, uuid.UUID | None]] = []
    for e in events:
        if (e.producer, e.event_id) in seen:
            continue
        seen.add((e.producer, e.event_id))
        waiting = sorted(
            (
                w
                for w in live
                if w.state is WaitState.WAITING
                and (w.tenant, w.correlation_id) == (e.tenant, e.correlation_id)
                and e.type in w.event_types
            ),
            key=lambda w: (w.created_at, str(w.id)),
        )
        if waiting:
            chosen = waiting[0]
            live[live.index(chosen)] = replace(chosen, state=WaitState.MATCHED)
            out.append((e.producer, e.event_id, "consumed", chosen.id))
            continue
        finished = [
            w
            for w in live
            if w.state in (WaitState.TIMED_OUT, WaitState.CANCELLED)
            and (w.tenant, w.correlation_id) == (e.tenant, e.correlation_id)
            and e.type in w.event_types
        ]
        if finished:
            latest = max(finished, key=lambda w: (w.resolved_at or w.created_at, str(w.id)))
            out.append((e.producer, e.event_id, "late", latest.id))
        else:
            out.append((e.producer, e.event_id, "pending", None))
    return out


def _flat(decision: BatchDecision) -> list[tuple[str, str, str, uuid.UUID | None]]:
    return [
        (p.event.producer, p.event.event_id, p.status.value, p.wait_id) for p in decision.placements
    ]


@settings(max_examples=500)
@given(events_st, stored_st, waits_st())
def test_batch_decision_equals_the_sequential_model(
    events: list[NewEvent], stored: set[tuple[str, str]], waits: list[WaitView]
) -> None:
    assert _flat(decide_batch(events, stored, waits)) == model(events, stored, waits)


@settings(max_examples=300)
@given(events_st, stored_st, waits_st(), st.integers(0, 25))
def test_one_batch_equals_two_consecutive_batches(
    events: list[NewEvent], stored: set[tuple[str, str]], waits: list[WaitView], cut: int
) -> None:
    """Batch boundaries must not change any outcome (they depend on Kafka's timing)."""
    whole = decide_batch(events, stored, waits)
    first = decide_batch(events[:cut], stored, waits)
    resolved = {p.wait_id for p in first.resolutions}
    after_first = [replace(w, state=WaitState.MATCHED) if w.id in resolved else w for w in waits]
    stored_after = stored | {(p.event.producer, p.event.event_id) for p in first.placements}
    second = decide_batch(events[cut:], stored_after, after_first)
    assert _flat(whole) == _flat(first) + _flat(second)


@settings(max_examples=300)
@given(events_st, stored_st, waits_st())
def test_invariants_of_a_decision(
    events: list[NewEvent], stored: set[tuple[str, str]], waits: list[WaitView]
) -> None:
    decision = decide_batch(events, stored, waits)
    by_id = {w.id: w for w in waits}
    consumed_waits = [p.wait_id for p in decision.resolutions]
    assert len(consumed_waits) == len(set(consumed_waits)), "a wait resolved twice"
    placed = [(p.event.producer, p.event.event_id) for p in decision.placements]
    assert len(placed) == len(set(placed)), "an event stored twice"
    assert not set(placed) & stored, "a stored event placed again"
    assert len(placed) + len(decision.duplicates) == len(events)
    for p in decision.placements:
        if p.status is InboxStatus.CONSUMED:
            assert p.wait_id is not None
            wait = by_id[p.wait_id]
            assert wait.state is WaitState.WAITING
            assert wait.accepts(p.event)
        elif p.status is InboxStatus.LATE:
            assert p.wait_id is not None
            wait = by_id[p.wait_id]
            assert wait.state in (WaitState.TIMED_OUT, WaitState.CANCELLED)
            assert wait.accepts(p.event)
        else:
            # Pending only if no waiting wait for it is left unresolved (tenancy included).
            assert p.status is InboxStatus.PENDING
            assert not any(
                w.state is WaitState.WAITING and w.accepts(p.event) and w.id not in consumed_waits
                for w in waits
            )


def test_other_tenants_wait_is_never_matched() -> None:
    wait = WaitView(uuid.uuid4(), "acme", "c1", frozenset({"job.completed"}), WaitState.WAITING, T0)
    intruder = NewEvent("p", "e1", "globex", "job.completed", "c1")
    decision = decide_batch([intruder], set(), [wait])
    assert [p.status for p in decision.placements] == [InboxStatus.PENDING]


def test_first_event_wins_and_the_second_waits_for_the_next_wait() -> None:
    older = WaitView(
        uuid.UUID(int=1), "acme", "c1", frozenset({"job.completed"}), WaitState.WAITING, T0
    )
    newer = replace(older, id=uuid.UUID(int=2), created_at=T0 + timedelta(seconds=1))
    e1 = NewEvent("p", "e1", "acme", "job.completed", "c1")
    e2 = NewEvent("p", "e2", "acme", "job.completed", "c1")
    e3 = NewEvent("p", "e3", "acme", "job.completed", "c1")
    decision = decide_batch([e1, e2, e3], set(), [newer, older])
    assert [(p.status, p.wait_id) for p in decision.placements] == [
        (InboxStatus.CONSUMED, older.id),
        (InboxStatus.CONSUMED, newer.id),
        (InboxStatus.PENDING, None),
    ]
