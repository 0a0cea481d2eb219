"""A live database upgraded: what it held at migration 0025 comes out right after the rest.

A database at 0025 is populated as a running matcher would have left it: waits still
waiting, events stored before their wait, resolutions whose resume is not published yet,
resolutions whose resume was published (one of them past its event's retention), a fan-in
wait half met, waits about to reach their deadline, and matches ingest left to the rematch
loop that it has not made yet. Then every later migration is applied,
the real daemon runs on it, the missing events are produced (signed) and the missing waits
registered, and the resume topic must hold each resolution exactly once, none of those
published before the upgrade again, every message verifiable.

Today 0025 is the last migration and the upgrade applies nothing; the test is for the
migrations to come, which may replace any table. So it speaks only through what a release
keeps: the worker API's SQL functions, the daemon's ingest function (called as the 0025
daemon called it), the daemon process, the Kafka topics. What the 0025 daemon's loops did
to that version's tables (the relay marking resumes published, the rematch loop taking
keys off its queue, the janitor purging an event) is done with their SQL copied below as
it was at 0025: no daemon of a later version can run on a database at 0025.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from hashlib import sha256
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from matcher.config import Settings
from matcher.store.migrate import load_migrations, migrate
from tests.support.kafka import produce_raw, started, within
from tests.support.processes import DaemonProcess, process_env
from tests.support.producers import K1, producers_file, signed
from tests.support.services import Services, own_settings

pytestmark = pytest.mark.timeout(180)

TENANT = "acme"
PRODUCER = "billing-svc"  # the signed producer of tests/support/producers.py
DONE = "job.completed"
EACH = 12  # waits (or events) of each kind: enough to be a population, quick to check

# --- The worker API (stable across releases) ----------------------------------------------

REGISTER = """
SELECT matcher.register_wait_v2(
    tenant => %(tenant)s, run_id => %(run_id)s, "position" => 0,
    event_types => %(types)s, correlation_id => %(correlation_id)s,
    deadline => %(deadline)s)::jsonb ->> 'id'
"""
REGISTER_FAN_IN = """
SELECT matcher.register_wait_v2(
    tenant => %(tenant)s, run_id => %(run_id)s, "position" => 0,
    conditions => %(conditions)s::jsonb, rule => 'all')::jsonb ->> 'id'
"""
CANCEL = "SELECT matcher.cancel_wait_v1(wait_id => %s)"
GET_WAIT = "SELECT matcher.get_wait_v1(wait_id => %s)::jsonb"
VERIFY = "SELECT matcher.verify_resume_v1(message => %s)::jsonb"
COMMITTED = "SELECT matcher.committed_resume_v1(wait_id => %s)"

# --- As the daemon called it at 0025 (matcher/store/queries/ingest.sql) -------------------

INGEST_0025 = """
SELECT accepted, duplicates, matched, late, deferred
FROM matcher.ingest_events(
    %(producer)s::text[], %(event_id)s::text[], %(tenant)s::text[], %(type)s::text[],
    %(correlation_id)s::text[], %(external_job_id)s::text[], %(occurred_at)s::timestamptz[],
    %(topic)s::text[], %(partition)s::integer[], %(offset)s::bigint[], %(data)s::jsonb[],
    %(trace_parent)s::text[]
)
"""

# --- The 0025 relay and janitor (matcher/store/queries/outbox.sql, maintenance.sql) ------
# Copied as they were at 0025: later versions change these tables, so the relay's SQL
# changes too. Only the setup of resumes published before the upgrade uses them.

CLAIM_UNPUBLISHED_0025 = """
WITH claimed AS (
    SELECT o.id, o.resolution_id, o.outcome, o.wait_id
    FROM matcher.outbox AS o
    WHERE o.published_at IS NULL
    ORDER BY o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
)
SELECT c.id, w.id::text AS wait_id,
       matcher.resume_message(c.resolution_id, c.outcome, w, i)::text AS message
FROM claimed AS c
JOIN matcher.waits AS w ON w.id = c.wait_id
LEFT JOIN matcher.inbox AS i
  ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
  AND i.received_at = w.resolved_by_received_at
ORDER BY c.id
"""
MARK_PUBLISHED_0025 = """
UPDATE matcher.outbox AS o SET published_at = now(), message_sha256 = u.digest
FROM unnest(%(ids)s::bigint[], %(digests)s::bytea[]) AS u(id, digest)
WHERE o.id = u.id
"""
# The rematch loop's pass, for keys with no pending event: a registration queues its key
# (to look for events stored before it) and the pass takes it off the queue, finding
# nothing. An event of a key still queued is left to the loop by ingest.
REMATCH_CLAIM_KEYS_0025 = """
WITH claimed AS (
    SELECT id FROM matcher.match_queue
    WHERE not_before <= now()
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM matcher.match_queue AS q
USING claimed
WHERE q.id = claimed.id
RETURNING q.tenant, q.correlation_id
"""
# The janitor drops a whole day of the inbox, with that day's claimed ids, once the day is
# past the dedupe window and no unpublished resume needs it; for one event that is its
# inbox row and its id's row going.
PURGE_EVENT_0025 = [
    "DELETE FROM matcher.event_ids WHERE producer = %(producer)s AND event_id = %(event_id)s",
    "DELETE FROM matcher.inbox WHERE producer = %(producer)s AND event_id = %(event_id)s",
]


@dataclass
class Event:
    correlation_id: str
    id: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class Population:
    """What the 0025 database holds, by kind (wait ids)."""

    waiting: dict[str, str] = field(default_factory=dict)  # (a) wait -> correlation id
    pending: list[Event] = field(default_factory=list)  # (b) events with no wait yet
    late_waits: dict[str, str] = field(default_factory=dict)  # (b) their waits, registered after
    unpublished: dict[str, str] = field(default_factory=dict)  # (c) wait -> outcome
    published: dict[str, str] = field(default_factory=dict)  # (d) wait -> message as sent
    purged: str = ""  # (d) the wait whose event left the inbox
    fan_in: str = ""  # (e) all of two conditions, one met
    fan_in_missing: str = ""  # the correlation id of the condition not met
    deadlines: set[str] = field(default_factory=set)  # (e) timing out soon
    deferred: set[str] = field(default_factory=set)  # waits whose event ingest left queued
    produced: dict[str, str] = field(default_factory=dict)  # after: correlation -> event id

    def kinds(self) -> dict[str, set[str]]:
        """The waits whose resume the upgraded daemon must publish, by kind."""
        return {
            "waiting": set(self.waiting), "registered after their event": set(self.late_waits),
            "unpublished": set(self.unpublished), "fan-in": {self.fan_in},
            "deadline": set(self.deadlines), "deferred": set(self.deferred),
        }  # fmt: skip

    def expected_after(self) -> set[str]:
        """The waits whose resume the upgraded daemon must publish."""
        return set().union(*self.kinds().values())


# --- Helpers -------------------------------------------------------------------------------


@contextlib.contextmanager
def connect(url: str) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    with psycopg.connect(
        url, autocommit=True, connect_timeout=10,
        options="-c lock_timeout=30s -c statement_timeout=60s",
    ) as conn:  # fmt: skip
        yield conn


def one(conn: psycopg.Connection[tuple[Any, ...]], sql: str, params: Any = None) -> Any:
    row = conn.execute(sql.encode(), params).fetchone()  # the test's own, constant SQL
    assert row is not None
    return row[0]


def register(
    conn: psycopg.Connection[tuple[Any, ...]],
    correlation_id: str,
    deadline: datetime | None = None,
) -> str:
    params = {
        "tenant": TENANT, "run_id": f"run-{correlation_id}", "types": [DONE],
        "correlation_id": correlation_id, "deadline": deadline,
    }  # fmt: skip
    return str(one(conn, REGISTER, params))


def register_fan_in(conn: psycopg.Connection[tuple[Any, ...]], correlation_ids: list[str]) -> str:
    """A wait for all of ``correlation_ids``' events."""
    conditions = [{"event_types": [DONE], "correlation_id": c} for c in correlation_ids]
    params = {
        "tenant": TENANT, "run_id": f"run-{correlation_ids[0]}",
        "conditions": json.dumps(conditions),
    }  # fmt: skip
    return str(one(conn, REGISTER_FAN_IN, params))


def ingest_0025(
    conn: psycopg.Connection[tuple[Any, ...]], topic: str, events: list[Event]
) -> tuple[int, int, int]:
    """Store ``events`` in one batch as the 0025 daemon did; (accepted, matched, deferred).
    They never were on Kafka: their coordinates are made up, past any real offset."""
    n = len(events)
    params = {
        "producer": [PRODUCER] * n, "event_id": [e.id for e in events],
        "tenant": [TENANT] * n, "type": [DONE] * n,
        "correlation_id": [e.correlation_id for e in events], "external_job_id": [None] * n,
        "occurred_at": [datetime.now(UTC)] * n, "topic": [topic] * n, "partition": [0] * n,
        "offset": [10**12 + k for k in range(n)],
        "data": [json.dumps({"rows": k}) for k in range(n)], "trace_parent": [None] * n,
    }  # fmt: skip
    with conn.transaction():
        row = conn.execute(INGEST_0025.encode(), params).fetchone()
    assert row is not None
    accepted, _, matched, _, deferred = row
    return accepted, matched, deferred


def publish_0025(conn: psycopg.Connection[tuple[Any, ...]]) -> dict[str, str]:
    """What the 0025 relay did for every unpublished resume: claim, send, mark with the
    digest of the message as sent. Returns each wait's message (the test is the topic)."""
    with conn.transaction():
        claimed = conn.execute(CLAIM_UNPUBLISHED_0025.encode(), {"limit": 1000}).fetchall()
        conn.execute(
            MARK_PUBLISHED_0025.encode(),
            {
                "ids": [c[0] for c in claimed],
                "digests": [sha256(c[2].encode()).digest() for c in claimed],
            },
        )
    return {wait_id: message for _, wait_id, message in claimed}


def rematch_keys_without_events_0025(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    """The rematch loop's pass over the queued keys, which have no pending event."""
    conn.execute(REMATCH_CLAIM_KEYS_0025.encode(), {"limit": 10_000})


def purge_event_0025(conn: psycopg.Connection[tuple[Any, ...]], event_id: str) -> None:
    with conn.transaction():
        for statement in PURGE_EVENT_0025:
            conn.execute(statement.encode(), {"producer": PRODUCER, "event_id": event_id})


def new_correlation(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:10]}"


# --- The database at 0025 ------------------------------------------------------------------


def populate_0025(url: str, topic: str) -> Population:
    """A live database at 0025, each kind made through the interfaces of that version."""
    population = Population()
    with connect(url) as conn:
        # (d) first: the 0025 relay publishes every unpublished resume there is.
        published = [new_correlation("published") for _ in range(EACH)]
        waits = {c: register(conn, c) for c in published}
        rematch_keys_without_events_0025(conn)
        events = [Event(c) for c in published[:-2]]
        assert ingest_0025(conn, topic, events) == (len(events), len(events), 0)
        for c in published[-2:]:
            assert one(conn, CANCEL, [waits[c]]) is True
        population.published = publish_0025(conn)
        assert set(population.published) == set(waits.values())
        population.purged = waits[events[0].correlation_id]
        purge_event_0025(conn, events[0].id)

        # (c) resolved (by events, or cancelled) while no relay ran.
        unpublished = [new_correlation("unpublished") for _ in range(EACH)]
        waits = {c: register(conn, c) for c in unpublished}
        rematch_keys_without_events_0025(conn)
        events = [Event(c) for c in unpublished[: EACH // 2]]
        assert ingest_0025(conn, topic, events) == (len(events), len(events), 0)
        population.unpublished = {waits[e.correlation_id]: "event" for e in events}
        for c in unpublished[EACH // 2 :]:
            assert one(conn, CANCEL, [waits[c]]) is True
            population.unpublished[waits[c]] = "cancelled"

        # (a) waiting, their events still to come.
        for c in (new_correlation("waiting") for _ in range(EACH)):
            population.waiting[register(conn, c)] = c
        rematch_keys_without_events_0025(conn)

        # (b) events stored before their waits.
        population.pending = [Event(new_correlation("pending")) for _ in range(EACH)]
        assert ingest_0025(conn, topic, population.pending) == (EACH, 0, 0)

        # (e) a fan-in wait with one of its two conditions met, and deadlines soon.
        met, population.fan_in_missing = new_correlation("fan-a"), new_correlation("fan-b")
        population.fan_in = register_fan_in(conn, [met, population.fan_in_missing])
        rematch_keys_without_events_0025(conn)
        assert ingest_0025(conn, topic, [Event(met)]) == (1, 1, 0)
        soon = datetime.now(UTC) + timedelta(seconds=2)
        population.deadlines = {register(conn, new_correlation("deadline"), soon) for _ in range(4)}
        rematch_keys_without_events_0025(conn)

        # In flight: waits and their events both stored, the match left to the rematch loop.
        deferred = [new_correlation("deferred") for _ in range(EACH)]
        population.deferred = {register(conn, c) for c in deferred}
        assert ingest_0025(conn, topic, [Event(c) for c in deferred]) == (EACH, 0, EACH)

        for wait_id in population.waiting.keys() | population.deferred | {population.fan_in}:
            assert one(conn, GET_WAIT, [wait_id])["state"] == "waiting"
    return population


# --- The resume topic ----------------------------------------------------------------------


def resume_data(message: str) -> dict[str, Any]:
    data = json.loads(message)["data"]
    assert isinstance(data, dict)
    return data


async def read_resumes(
    settings: Settings, *, until: Callable[[list[str]], bool] | None, timeout: float = 60
) -> list[str]:
    """The resume topic from its beginning, each message's value as published: until
    ``until`` holds of what was read, or (``None``) up to the topic's current end."""
    consumer = AIOKafkaConsumer(
        **settings.kafka_client_options(), group_id=None, enable_auto_commit=False
    )
    found: list[str] = []
    async with started(consumer):
        partitions = [
            TopicPartition(settings.resume_topic, p) for p in range(settings.topic_partitions)
        ]
        consumer.assign(partitions)
        await within(consumer.seek_to_beginning(*partitions))
        ends = await within(consumer.end_offsets(partitions))
        deadline = time.monotonic() + timeout

        async def done() -> bool:
            if until is not None:
                return until(found)
            positions = [await within(consumer.position(p)) for p in partitions]
            return all(pos >= ends[p] for pos, p in zip(positions, partitions, strict=True))

        while not await done():
            if time.monotonic() > deadline:
                raise AssertionError(f"not all resumes within {timeout}s: {len(found)} read")
            batch = await within(consumer.getmany(timeout_ms=100))
            found.extend(r.value.decode() for records in batch.values() for r in records)
    return found


# --- The test ------------------------------------------------------------------------------


async def test_a_live_database_keeps_its_work_across_the_upgrade(
    services: Services, empty_db: str, tmp_path: Path
) -> None:
    migrations = load_migrations()
    assert [m.version for m in migrations] == sorted(m.version for m in migrations)
    assert (migrations[24].version, migrations[24].name) == (25, "refusals")
    with own_settings(
        services, empty_db,
        allow_unsigned=False, producers_file=producers_file(tmp_path, {"k1": K1}),
    ) as settings:  # fmt: skip
        migrate(empty_db, migrations[:25])
        population = populate_0025(empty_db, settings.events_topic)

        assert migrate(empty_db) == migrations[25:]
        daemon = DaemonProcess(process_env(settings))
        try:
            daemon.wait_ready()
            await finish_the_work(settings, empty_db, population)
            assert daemon.terminate() == 0, daemon.output
        finally:
            if daemon.process.poll() is None:
                daemon.kill()
        # Stopped: whatever it was going to publish is on the topic now.
        messages = await read_resumes(settings, until=None)
        check_published_once(population, messages)
        check_verifiable(empty_db, population, messages)


async def finish_the_work(settings: Settings, url: str, population: Population) -> None:
    """The rest of each wait's life on the upgraded database: the events the waiting waits
    need (signed, through Kafka), the waits of the stored events; deadlines pass. Returns
    once every expected resume is on the resume topic."""
    with connect(url) as conn:
        for event in population.pending:
            population.late_waits[register(conn, event.correlation_id)] = event.correlation_id
    awaited = [*population.waiting.values(), population.fan_in_missing]
    produced = [signed(correlation_id=c, data={"rows": 1}) for c in awaited]
    population.produced = {e.correlation_id: e.id for e, _ in produced}
    await produce_raw(settings, [(r.key, r.headers, r.value) for _, r in produced])

    missing = population.kinds()

    def all_arrived(found: list[str]) -> bool:
        arrived = {resume_data(m)["wait_id"] for m in found}
        for kind in missing:
            missing[kind] -= arrived
        return not any(missing.values())

    try:
        await read_resumes(settings, until=all_arrived)
    except AssertionError as exc:
        counts = {kind: len(waits) for kind, waits in missing.items() if waits}
        raise AssertionError(f"{exc}; resumes missing: {counts}") from None


def check_published_once(population: Population, messages: list[str]) -> None:
    by_resolution = Counter(resume_data(m)["resolution_id"] for m in messages)
    assert [r for r, n in by_resolution.items() if n > 1] == []  # no crash, no duplicate
    by_wait = Counter(resume_data(m)["wait_id"] for m in messages)
    # Published before the upgrade, so not again (not as another resolution either).
    before = {resume_data(m)["resolution_id"] for m in population.published.values()}
    assert set(by_resolution) & before == set()
    assert set(by_wait) & set(population.published) == set()
    assert by_wait == dict.fromkeys(population.expected_after(), 1)

    outcomes = {resume_data(m)["wait_id"]: resume_data(m)["outcome"] for m in messages}
    assert {w: outcomes[w] for w in population.unpublished} == population.unpublished
    assert {outcomes[w] for w in population.waiting.keys() | population.late_waits} == {"event"}
    assert {outcomes[w] for w in population.deadlines} == {"timeout"}
    assert {outcomes[w] for w in population.deferred} == {"event"}
    assert outcomes[population.fan_in] == "event"
    event_ids = population.produced | {e.correlation_id: e.id for e in population.pending}
    for message in messages:  # each resolved by the event meant for it
        data = resume_data(message)
        if data["wait_id"] in population.waiting.keys() | population.late_waits:
            assert data["event"]["id"] == event_ids[data["correlation_id"]]
    fan_in = next(
        resume_data(m) for m in messages if resume_data(m)["wait_id"] == population.fan_in
    )
    assert len(fan_in["events"]) == 2, fan_in  # the one met before the upgrade, and the other


def check_verifiable(url: str, population: Population, messages: list[str]) -> None:
    with connect(url) as conn:
        for message in messages:
            assert one(conn, VERIFY, [message]) == resume_data(message)
            assert one(conn, COMMITTED, [resume_data(message)["wait_id"]]) == message
        for wait_id, message in population.published.items():
            # Verified against the stored event, or, once it is gone, the digest recorded
            # when the 0025 relay published the message.
            assert one(conn, VERIFY, [message]) == resume_data(message), wait_id
            committed = one(conn, COMMITTED, [wait_id])
            assert committed == (None if wait_id == population.purged else message)
        every_wait = population.expected_after() | set(population.published)
        assert len(every_wait) == 5 * EACH + 1 + len(population.deadlines)
        for wait_id in every_wait:
            assert one(conn, GET_WAIT, [wait_id])["state"] != "waiting", wait_id
