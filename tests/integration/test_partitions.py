"""The inbox partitioned by day: dedupe holds across days and through a purge under load.

The inbox has no unique key across its days (Postgres cannot have one): matcher.event_ids
holds one row per stored event instead, and the janitor forgets a day's ids before it drops
the day. These tests attack the promise where it is weakest: the same event id in two
concurrent batches under different correlation ids, duplicates of events stored days ago,
days being dropped while ingest is busy, and a janitor stopped between the two steps.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from matcher.config import Settings
from matcher.daemon import janitor
from matcher.daemon.janitor import tidy_once
from matcher.domain.events import CompletionEvent
from matcher.domain.waits import WaitSpec
from matcher.sdk import register_wait
from matcher.store.ingest import store_batch
from matcher.store.maintenance import _forget_day_ids, drop_expired_days
from matcher.store.sql import query
from tests.support.assertions import env_flag, eventually
from tests.support.db import backdate_events, ensure_inbox_days, register_waits, rows, scalar
from tests.support.kafka import produce
from tests.support.processes import running_daemon
from tests.support.records import event, ingest_record


def _day_of(settings: Settings, days_ago: int) -> str:
    return str(
        scalar(
            settings,
            "SELECT 'inbox_p' || to_char((now() - make_interval(days => %s)) AT TIME ZONE 'UTC',"
            " 'YYYYMMDD')",
            [days_ago],
        )
    )


def _attached_days(settings: Settings) -> set[str]:
    return {
        r["name"]
        for r in rows(
            settings,
            "SELECT c.relname AS name FROM pg_inherits AS i JOIN pg_class AS c"
            " ON c.oid = i.inhrelid WHERE i.inhparent = 'matcher.inbox'::regclass",
        )
    }


def _age(settings: Settings, events: list[CompletionEvent], days: int) -> None:
    """Move stored events ``days`` back in time (into that day's partition)."""
    backdate_events(settings, "event_id", [e.id for e in events], days * 86400)


def _copies(settings: Settings, events: list[CompletionEvent]) -> dict[str, int]:
    found = rows(
        settings,
        "SELECT event_id, count(*) AS n FROM matcher.inbox WHERE event_id = ANY(%s)"
        " GROUP BY event_id",
        [[e.id for e in events]],
    )
    return {r["event_id"]: r["n"] for r in found}


async def test_dedupe_holds_across_days_and_through_a_purge_under_load(
    settings: Settings,
) -> None:
    """Events stored 10 days ago are still duplicates when redelivered; events of a day
    past the window (16 days) are dropped with their day; meanwhile a live load is matched
    exactly once while the janitor drops days again and again."""
    settings = settings.model_copy(
        update={"inbox_retention": timedelta(days=7), "inbox_purge_after": timedelta(days=7)}
    )
    ensure_inbox_days(settings, 17)
    inside = [event(correlation=f"inside-{n}") for n in range(40)]
    outside = [event(correlation=f"outside-{n}") for n in range(40)]
    total = env_flag("MATCHER_TEST_LOAD_EVENTS", 600)
    correlations = register_waits(settings, total)
    load = [event(correlation=c) for c in correlations]

    # The daemon's own janitor keeps everything (the test drops days with its own calls).
    keep_all = settings.model_copy(update={"inbox_purge_after": timedelta(days=365)})
    async with running_daemon(keep_all):
        await produce(settings, inside + outside)
        await eventually(lambda: len(_copies(settings, inside + outside)) == 80, timeout=60)
        _age(settings, inside, 10)
        _age(settings, outside, 16)
        dropped_day = _day_of(settings, 16)
        assert dropped_day in _attached_days(settings)

        async def produce_load() -> None:
            for start in range(0, total, 50):
                await produce(settings, load[start : start + 50])
                await asyncio.sleep(0.05)

        async def purge_repeatedly(done: asyncio.Event) -> int:
            purged = 0
            async with AsyncConnectionPool(
                settings.database_url.get_secret_value(), min_size=1, open=False
            ) as pool:
                while not done.is_set():
                    purged += (await tidy_once(pool, settings))[1]
                    await asyncio.sleep(0.05)
            return purged

        done = asyncio.Event()
        purging = asyncio.create_task(purge_repeatedly(done))
        producing = asyncio.create_task(produce_load())
        # Redeliveries in the middle of the load and the purge.
        await produce(settings, inside)
        await producing
        await produce(settings, inside + outside)
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.resolutions") == total,
            timeout=90,
        )
        await eventually(lambda: len(_copies(settings, outside)) == 40, timeout=60)
        done.set()
        purged = await purging

    assert purged == 40, "the day past the window held the 40 'outside' events"
    assert dropped_day not in _attached_days(settings)
    # Inside the window: stored once, in their old day, whatever was redelivered.
    assert _copies(settings, inside) == {e.id: 1 for e in inside}
    assert scalar(
        settings,
        "SELECT count(*) FROM matcher.inbox WHERE event_id = ANY(%s)"
        " AND received_at < now() - interval '9 days'",
        [[e.id for e in inside]],
    ) == len(inside)
    # Past the window the promise ends: the redelivered copies are new events (once each).
    assert _copies(settings, outside) == {e.id: 1 for e in outside}
    # The live load: every event stored once, every wait resolved once.
    assert _copies(settings, load) == {e.id: 1 for e in load}
    assert scalar(settings, "SELECT count(*) FROM matcher.waits WHERE state = 'matched'") == total
    assert (
        scalar(settings, "SELECT count(*) FROM matcher.inbox GROUP BY producer, event_id"
               " ORDER BY 1 DESC LIMIT 1") == 1
    )  # fmt: skip


async def test_one_event_id_in_concurrent_batches_is_stored_once(settings: Settings) -> None:
    """A producer reusing an event id under another correlation id: the two batches lock
    different wait keys, and only the unique claim in matcher.event_ids stops both finding
    the id new."""
    url = settings.database_url.get_secret_value()
    rounds = env_flag("MATCHER_TEST_RACE_ROUNDS", 20) * 2
    ids = [f"reused-{uuid.uuid4().hex[:8]}" for _ in range(rounds)]

    async def deliver(correlation_prefix: str, offset: int) -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for n, event_id in enumerate(ids):
                batch = [
                    ingest_record(
                        event(correlation=f"{correlation_prefix}-{n}-{k}"), offset + 10 * n + k
                    )
                    for k in range(3)
                ]
                batch.append(
                    ingest_record(
                        event(correlation=f"{correlation_prefix}-{n}", event_id=event_id),
                        offset + 10 * n + 9,
                    )
                )
                # A batch that met another's uncommitted claim of the id fails as a
                # serialization failure and is retried, as the daemon's batch writer does.
                for _ in range(20):
                    try:
                        await store_batch(conn, batch)
                        break
                    except psycopg.errors.SerializationFailure:
                        continue
                else:
                    raise AssertionError("a batch kept failing")

    await asyncio.gather(deliver("a", 0), deliver("b", 100_000), deliver("c", 200_000))
    copies = rows(
        settings,
        "SELECT event_id, count(*) AS n FROM matcher.inbox WHERE event_id = ANY(%s)"
        " GROUP BY event_id",
        [ids],
    )
    assert {r["event_id"]: r["n"] for r in copies} == dict.fromkeys(ids, 1)


async def test_a_janitor_stopped_after_forgetting_keeps_ids_claimed_again(
    settings: Settings,
) -> None:
    """The janitor forgets a day's ids, then stops before it drops the day; the events are
    redelivered meanwhile (new events now: stored again, their ids claimed again today).
    Its next pass forgets the old day again and drops it: the new claims must survive, or
    the next redelivery would be stored a third time."""
    url = settings.database_url.get_secret_value()
    ensure_inbox_days(settings, 17)
    old = [event(correlation=f"old-{n}") for n in range(12)]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await store_batch(conn, [ingest_record(e, n) for n, e in enumerate(old)])
        _age(settings, old, 16)
        cur = await conn.execute(query("maintenance", "expired_days"), {"keep": timedelta(days=15)})
        days = {r[0]: (r[2], r[3]) for r in await cur.fetchall()}
        name = _day_of(settings, 16)
        day = sql.Identifier("matcher", name)
        # Batches of 5: the keyset walks 5, 5, 2.
        assert await _forget_day_ids(conn, day, *days[name], limit=5) == len(old)
        assert _claimed(settings, old) == 0
        again = old[:4]
        await store_batch(conn, [ingest_record(e, 100 + n) for n, e in enumerate(again)])
        assert _copies(settings, again) == {e.id: 2 for e in again}
        assert await _forget_day_ids(conn, day, *days[name], limit=5) == 0
        assert _claimed(settings, again) == len(again)
    assert await drop_expired_days(url, timedelta(days=15)) == len(old)
    assert name not in _attached_days(settings)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await store_batch(conn, [ingest_record(e, 200 + n) for n, e in enumerate(again)])
    assert _copies(settings, again) == {e.id: 1 for e in again}  # today's copy only
    assert _claimed(settings, again) == len(again)


def _claimed(settings: Settings, events: list[CompletionEvent]) -> int:
    return int(
        scalar(
            settings,
            "SELECT count(*) FROM matcher.event_ids WHERE event_id = ANY(%s)",
            [[e.id for e in events]],
        )
    )


def _drop_days(settings: Settings, names: set[str]) -> None:
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as c:
        c.execute("SET lock_timeout = '30s'")  # a lock never granted fails the test
        for name in names:
            c.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier("matcher", name)))


async def test_ingest_creates_a_missing_day_instead_of_refusing_events(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If every janitor was down for days, today's partition may not exist: ingest must
    create it and store the events, not quarantine them as refused data."""
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        register_wait(
            conn,
            WaitSpec(
                tenant="acme",
                run_id="run-missing-day",
                position=0,
                event_types=["job.completed"],
                correlation_id="missing-day",
            ),
        )
    slow_janitor = settings.model_copy(update={"janitor_interval_s": 3600.0})
    # The janitor's first pass (at start) must be over, days made and expired ones
    # dropped, before the test drops every day: its next pass is an hour away.
    tidied = asyncio.Event()
    original = janitor.tidy_once

    async def tidy_and_tell(*args: Any, **kwargs: Any) -> tuple[int, int]:
        try:
            return await original(*args, **kwargs)
        finally:
            tidied.set()

    monkeypatch.setattr(janitor, "tidy_once", tidy_and_tell)
    async with running_daemon(slow_janitor):
        await asyncio.wait_for(tidied.wait(), 30)
        assert _day_of(settings, 0) in _attached_days(settings)
        # In a thread: a DROP waits for the daemon's transactions on the inbox (its
        # rematch pass may hold one), and they need this event loop to commit.
        await asyncio.to_thread(_drop_days, settings, _attached_days(settings))
        assert _attached_days(settings) == set()
        await produce(settings, [event(correlation="missing-day"), event()])
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 2, timeout=60
        )
    assert scalar(settings, "SELECT count(*) FROM matcher.quarantine") == 0
    assert scalar(settings, "SELECT state FROM matcher.waits") == "matched"
    assert _day_of(settings, 0) in _attached_days(settings)
    assert "the inbox has no partition for today" in caplog.text  # ingest did it


async def test_a_resume_still_verifies_after_its_events_day_is_dropped(
    settings: Settings,
) -> None:
    """The relay records nothing when it publishes (its mark is the queue row's delete):
    the janitor records each resume's digest on its wait before it drops the day of the
    event that resolved it, so verify_resume_v1 still accepts the resume as published,
    and nothing else, once the message can no longer be rebuilt."""
    url = settings.database_url.get_secret_value()
    ensure_inbox_days(settings, 17)
    correlations = register_waits(settings, 3, prefix="gone")
    arrived = [event(correlation=c) for c in correlations]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("DELETE FROM matcher.match_queue")  # decided by ingest itself
        await store_batch(conn, [ingest_record(e, n) for n, e in enumerate(arrived)])
    _age(settings, arrived, 16)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE matcher.waits AS w SET resolved_by_received_at = i.received_at"
            " FROM matcher.inbox AS i WHERE i.consumed_by = w.id"
        )
        with conn.transaction():  # the relay's claim, committed as after Kafka's ack
            published = [
                r[5] for r in conn.execute(query("outbox", "claim_unpublished"), {"limit": 10})
            ]
    assert len(published) == 3
    assert [_verified(url, m) for m in published] == [True] * 3  # rebuilt from the event
    assert await drop_expired_days(url, timedelta(days=15)) == 3
    assert [_verified(url, m) for m in published] == [True] * 3  # by the recorded digest
    forged = published[0].replace('"deadline" : null', '"deadline" : "2030-01-01T00:00:00Z"')
    assert forged != published[0]
    assert not _verified(url, forged)
    assert scalar(settings, "SELECT count(*) FROM matcher.waits WHERE resume_sha256 IS NULL"
                  " AND resolution_id IS NOT NULL") == 0  # fmt: skip


def _verified(url: str, message: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute("SELECT matcher.verify_resume_v1(%s)", [message])
        except psycopg.Error as exc:
            if exc.sqlstate != "MR001":
                raise
            return False
    return True
