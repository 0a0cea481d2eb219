"""The janitor (retention), the relay's prompt wake-up, and isolation of refused data."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import timedelta

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from matcher.config import Settings
from matcher.daemon.ingest import Ingest
from matcher.daemon.janitor import tidy_once
from matcher.domain.events import CompletionEvent
from matcher.domain.records import IngestRecord
from matcher.domain.waits import WaitSpec
from matcher.sdk import cancel_wait, register_wait
from tests.support.assertions import eventually
from tests.support.db import (
    backdate_events,
    ensure_inbox_days,
    published,
    rematch_all,
    rows,
    scalar,
)
from tests.support.kafka import read_resumes, to_record
from tests.support.processes import running_daemon
from tests.support.records import event, raw


def _age(settings: Settings, correlation: str, days: float) -> None:
    backdate_events(settings, "correlation_id", [correlation], days * 86400)


async def test_retention_expires_then_purges(settings: Settings) -> None:
    settings = settings.model_copy(
        update={"inbox_retention": timedelta(days=7), "inbox_purge_after": timedelta(days=7)}
    )
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        register_wait(
            conn,
            WaitSpec(
                tenant="acme",
                run_id="r",
                position=0,
                event_types=["job.completed"],
                correlation_id="consumed-old",
            ),
        )
    async with running_daemon(settings):
        from tests.support.kafka import produce

        await produce(
            settings,
            [
                event(correlation="fresh"),
                event(correlation="old"),
                event(correlation="ancient"),
                event(correlation="consumed-old"),
            ],
        )
        await read_resumes(settings, at_least=1)
    ensure_inbox_days(settings, 16)
    _age(settings, "old", 8)
    _age(settings, "ancient", 15)
    _age(settings, "consumed-old", 15)

    async with AsyncConnectionPool(
        settings.database_url.get_secret_value(), min_size=1, open=False
    ) as pool:
        expired, purged = await tidy_once(pool, settings)
        # "old" and "ancient" were pending past retention: expired. The day 15 days ago is
        # wholly past retention + purge window: dropped, with "ancient" and "consumed-old".
        assert (expired, purged) == (2, 2)
        statuses = {
            r["correlation_id"]: r["status"]
            for r in rows(settings, "SELECT correlation_id, status FROM matcher.inbox")
        }
        assert statuses == {"fresh": "pending", "old": "expired"}
        assert await tidy_once(pool, settings) == (0, 0)
        days = scalar(
            settings,
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'matcher.inbox'::regclass"
            " AND inhrelid::regclass::text = 'matcher.inbox_p' || to_char("
            "(now() - interval '15 days') AT TIME ZONE 'UTC', 'YYYYMMDD')",
        )
        assert days == 0, "the expired day is still attached"

    # An expired event no longer resolves a new wait.
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        wait = register_wait(
            conn,
            WaitSpec(
                tenant="acme",
                run_id="r2",
                position=0,
                event_types=["job.completed"],
                correlation_id="old",
            ),
        )
    assert await rematch_all(settings) == 0
    assert scalar(settings, "SELECT state FROM matcher.waits WHERE id = %s", [wait.id]) == (
        "waiting"
    )


async def test_quarantine_keeps_its_retention(settings: Settings) -> None:
    settings = settings.model_copy(update={"quarantine_retention": timedelta(days=30)})
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO matcher.quarantine (received_at, kafka_topic, kafka_partition,"
            " kafka_offset, reason) SELECT now() - make_interval(days => d), 't', 0, d,"
            " 'malformed' FROM unnest(ARRAY[0, 29, 31, 400]) AS d"
        )
    async with AsyncConnectionPool(
        settings.database_url.get_secret_value(), min_size=1, open=False
    ) as pool:
        await tidy_once(pool, settings, limit=1)  # batches of one: the loop must go on
    kept = [
        r["kafka_offset"] for r in rows(settings, "SELECT kafka_offset FROM matcher.quarantine")
    ]
    assert sorted(kept) == [0, 29]


def _cancel_a_wait(settings: Settings, run: str) -> None:
    """Register a wait and cancel it, from a connection of the test's own (another
    process's commit, as far as the daemon knows): one resolution in the outbox."""
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        wait = register_wait(
            conn,
            WaitSpec(tenant="acme", run_id=run, position=0, event_types=["x"], correlation_id=run),
        )
        assert cancel_wait(conn, wait.id)


def _listening(settings: Settings) -> bool:
    """Whether the daemon's notification listener has run its LISTENs (its session's last
    statement was one, and it is idle: waiting for notifications)."""
    return bool(
        scalar(
            settings,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state = 'idle' AND query LIKE 'LISTEN %'",
        )
    )


async def test_relay_wakes_on_commit_not_on_its_poll(settings: Settings) -> None:
    # The relay's safety-net poll is an hour away: a resume published within seconds of a
    # commit was published because the commit's NOTIFY woke the relay, nothing else.
    slow_poll = settings.model_copy(update={"relay_poll_interval_s": 3600.0})
    async with running_daemon(slow_poll):
        await eventually(lambda: _listening(settings), what="the daemon listens for commits")
        # A first resolution, published however it was (the relay's first pass, the
        # listener's catch-up nudge, a NOTIFY): past it the relay waits, with only its
        # hour-long poll or a wake-up to make it look again.
        _cancel_a_wait(settings, "warm-up")
        await eventually(lambda: published(settings) == 1, what="the first resume published")
        started = time.monotonic()
        _cancel_a_wait(settings, "wake")  # its commit sends the NOTIFY
        await eventually(
            lambda: published(settings) == 2,
            timeout=5,
            what="the NOTIFY wakes the relay (its poll is an hour away)",
        )
        woken_after = time.monotonic() - started
        resumes = await read_resumes(settings, at_least=2)
    assert woken_after < 5
    assert {r.run_id: r.outcome for r in resumes} == {"warm-up": "cancelled", "wake": "cancelled"}


@pytest.mark.parametrize("poison", ["nul_in_data", "index_entry_too_large"])
async def test_refused_record_is_isolated_and_quarantined(settings: Settings, poison: str) -> None:
    """If Postgres refuses one record of a batch, the rest is stored and it is quarantined:
    a data error, or a program limit (an OperationalError that is not transient)."""
    good = [event(correlation=f"iso-{i}") for i in range(5)]
    # Built without validation, as a parser bug would let it through.
    base = event(correlation="iso-bad").model_dump()
    if poison == "nul_in_data":
        base["data"] = {"x": "a\x00b"}
    else:  # tenant and correlation id past the btree entry limit (2704 bytes) together
        rng = random.Random(7)  # incompressible: Postgres would compress a repeated one
        base["tenant"], base["correlationid"] = (
            "".join(chr(0x1F300 + rng.randrange(700)) for _ in range(512)) for _ in range(2)
        )
    bad = CompletionEvent.model_construct(**base)
    records = []
    for n, e in enumerate([*good[:2], bad, *good[2:]]):
        key, headers, value = to_record(good[0] if e is bad else e)
        names = raw(headers, key, value).headers
        records.append(IngestRecord(settings.events_topic, 0, n, key, value, names, e))
    async with AsyncConnectionPool(
        settings.database_url.get_secret_value(), min_size=1, open=False
    ) as pool:
        ingest = Ingest(settings, pool, asyncio.Event(), on_resolved=lambda: None)
        result = await asyncio.wait_for(ingest.writer.store(records), 60)
    assert result.accepted == 5
    assert result.quarantined == 1
    [refused] = rows(settings, "SELECT kafka_offset, reason, detail FROM matcher.quarantine")
    assert (refused["kafka_offset"], refused["reason"]) == (2, "malformed")
    assert "refused by the database" in refused["detail"]
    assert scalar(settings, "SELECT count(*) FROM matcher.inbox") == 5
