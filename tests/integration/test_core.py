"""The core scenarios of the product note, against real Kafka and Postgres."""

from __future__ import annotations

import asyncio
import base64
import logging
import random
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client import REGISTRY

from matcher.config import Settings
from matcher.domain.events import CompletionEvent
from matcher.domain.waits import WaitSpec, WaitState
from matcher.sdk import advance, register_wait
from tests.support.assertions import eventually
from tests.support.db import rows, scalar
from tests.support.kafka import (
    events_producer,
    produce,
    produce_raw,
    read_resumes,
    started,
    to_record,
    within,
)
from tests.support.processes import running_daemon
from tests.support.records import event


def _spec(correlation: str, run: str = "run-1", **extra: object) -> WaitSpec:
    return WaitSpec.model_validate(
        {
            "tenant": "acme",
            "run_id": run,
            "position": 0,
            "event_types": ["job.completed", "job.failed"],
            "correlation_id": correlation,
            **extra,
        }
    )


@pytest.mark.smoke
async def test_event_before_wait_resolves_on_registration(settings: Settings) -> None:
    early = event(correlation="corr-early", data={"result": 42})
    async with running_daemon(settings):
        await produce(settings, [early])
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 1,
            what="event stored",
        )
        # Stored and pending: whenever the wait comes now, the event came first.
        assert scalar(settings, "SELECT status FROM matcher.inbox") == "pending"

        with psycopg.connect(settings.database_url.get_secret_value()) as conn:
            wait = register_wait(conn, _spec("corr-early"))
        # Stored, then matched by the daemon's rematch pass once the registration committed.
        assert wait.state is WaitState.WAITING
        await eventually(
            lambda: scalar(settings, "SELECT state FROM matcher.waits") == "matched",
            what="the early event resolves the wait",
        )
        [resolved] = rows(
            settings, "SELECT resolved_by_producer, resolved_by_event_id FROM matcher.waits"
        )
        assert (resolved["resolved_by_producer"], resolved["resolved_by_event_id"]) == (
            "billing",
            early.id,
        )

        [resume] = await read_resumes(settings, at_least=1)
    assert resume.wait_id == wait.id
    assert resume.outcome == "event"
    assert resume.event is not None
    assert (resume.event.source, resume.event.id) == ("billing", early.id)
    assert resume.event.data == {"result": 42}
    assert scalar(settings, "SELECT status FROM matcher.inbox") == "consumed"


async def test_a_deadline_already_past_does_not_beat_an_event_already_stored(
    settings: Settings,
) -> None:
    """The API accepts a deadline in the past (a client's clock may run ahead). Such a wait
    still goes to the event stored before it, however the sweeper and the rematch pass
    race; with no event it times out."""
    runs = 20
    async with running_daemon(settings):
        await produce(settings, [event(correlation=f"stored-{i}") for i in range(runs)])
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == runs,
            what="the early events stored",
        )
        past = datetime.now(UTC) - timedelta(seconds=30)
        with psycopg.connect(settings.database_url.get_secret_value()) as conn:
            for i in range(runs):
                register_wait(conn, _spec(f"stored-{i}", run=f"run-{i}", deadline=past))
            register_wait(conn, _spec("never-sent", run="run-none", deadline=past))
        await eventually(
            lambda: (
                scalar(settings, "SELECT count(*) FROM matcher.waits WHERE state = 'waiting'") == 0
            ),
            what="every wait resolved",
        )
        resumes = await read_resumes(settings, at_least=runs + 1)
    states = {
        r["correlation_id"]: r["state"]
        for r in rows(settings, "SELECT correlation_id, state FROM matcher.waits")
    }
    assert states == {
        **{f"stored-{i}": "matched" for i in range(runs)},
        "never-sent": "timed_out",
    }
    assert sorted(r.outcome for r in resumes) == ["event"] * runs + ["timeout"]


@pytest.mark.smoke
async def test_wait_before_event_resolves_on_ingest(settings: Settings) -> None:
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        wait = register_wait(conn, _spec("corr-late-arrival"))
    assert wait.state is WaitState.WAITING
    failed = event(correlation="corr-late-arrival", type_="job.failed")
    async with running_daemon(settings):
        await produce(settings, [failed])
        [resume] = await read_resumes(settings, at_least=1)
    assert resume.wait_id == wait.id
    assert resume.event is not None
    assert resume.event.type == "job.failed"


async def test_duplicates_resolve_once_even_across_restarts(settings: Settings) -> None:
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        register_wait(conn, _spec("corr-dup"))
    original = event(correlation="corr-dup", event_id="evt-1", job_id="job-7")
    async with running_daemon(settings):
        await produce(settings, [original, original])
        await read_resumes(settings, at_least=1)
    async with running_daemon(settings):  # a restart, then the same event again
        # A sentinel behind it on the same partition: once it is stored, so was the copy.
        sentinel = event(correlation="corr-dup", type_="job.progress")
        await produce(settings, [original], structured=True)
        await produce(settings, [sentinel])
        await eventually(
            lambda: (
                scalar(
                    settings,
                    "SELECT count(*) FROM matcher.inbox WHERE event_id = %s",
                    [sentinel.id],
                )
                == 1
            )
        )
        resumes = await read_resumes(settings, at_least=1)
    assert len(resumes) == 1
    assert scalar(settings, "SELECT count(*) FROM matcher.inbox WHERE event_id = 'evt-1'") == 1
    assert scalar(settings, "SELECT count(*) FROM matcher.resolutions") == 1


async def test_events_sharing_a_job_id_are_all_kept(settings: Settings) -> None:
    progress = event(correlation="corr-job", type_="job.progress", job_id="job-9")
    completed = event(correlation="corr-job", type_="job.completed", job_id="job-9")
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        wait = register_wait(conn, _spec("corr-job"))
    async with running_daemon(settings):
        await produce(settings, [progress, completed])
        [resume] = await read_resumes(settings, at_least=1)
    assert resume.wait_id == wait.id
    assert resume.event is not None
    assert resume.event.id == completed.id
    stored = rows(
        settings,
        "SELECT event_id, status FROM matcher.inbox WHERE external_job_id = 'job-9' ORDER BY 1",
    )
    assert {r["event_id"]: r["status"] for r in stored} == {
        progress.id: "pending",  # a type this wait does not accept
        completed.id: "consumed",
    }


async def test_a_duplicate_id_with_other_content_is_dropped_but_logged_and_counted(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """CloudEvents identity is source + id, so a second event under a stored id is a
    duplicate whatever it says; one that says something else (a producer reusing ids)
    must not vanish silently. Replays are not reported, even with a new time (this
    helper stamps each send with the time it is sent)."""
    caplog.set_level(logging.WARNING, logger="matcher.ingest")

    def conflicts() -> float:
        return REGISTRY.get_sample_value("matcher_conflicting_duplicates_total") or 0.0

    def duplicates() -> float:
        found = REGISTRY.get_sample_value("matcher_events_received_total", {"result": "duplicate"})
        return found or 0.0

    conflicts_before, duplicates_before = conflicts(), duplicates()
    first = event(correlation="reused", event_id="id-reused", data={"n": 1})
    other_data = first.model_copy(update={"data": {"n": 2}})
    other_key = first.model_copy(update={"correlationid": "someone-else"})
    async with running_daemon(settings):
        await produce(settings, [first])
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 1,
            what="the first event stored",
        )
        # Replays (binary and structured, each with a new time), then two that say
        # something else.
        await produce(settings, [first])
        await produce(settings, [first], structured=True)
        await produce(settings, [other_data, other_key])
        # Every record read (each a duplicate) before the count of conflicts is judged.
        await eventually(lambda: duplicates() >= duplicates_before + 4, what="the duplicates read")
    assert duplicates() == duplicates_before + 4
    assert conflicts() == conflicts_before + 2
    assert rows(settings, "SELECT data FROM matcher.inbox WHERE event_id = 'id-reused'") == [
        {"data": {"n": 1}}
    ]
    reported = [r for r in caplog.records if r.getMessage().startswith("duplicate id with other")]
    assert [(r.__dict__["event_id"], r.__dict__["producer"]) for r in reported] == [
        ("id-reused", "billing")
    ] * 2


@pytest.mark.smoke
async def test_timeout_races_completion_and_the_loser_is_recorded(settings: Settings) -> None:
    runs = 40
    now = datetime.now(UTC)
    rng = random.Random(7)
    deadlines = [now + timedelta(seconds=2 + rng.uniform(0, 1.5)) for _ in range(runs)]
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        waits = [
            register_wait(conn, _spec(f"race-{i}", run=f"run-{i}", deadline=deadlines[i]))
            for i in range(runs)
        ]
    async with running_daemon(settings):
        # Each event lands within ±0.5 s of its wait's deadline.
        schedule = sorted(
            (deadlines[i] + timedelta(seconds=rng.uniform(-0.5, 0.5)), i) for i in range(runs)
        )
        for when, i in schedule:
            delay = (when - datetime.now(UTC)).total_seconds()
            if delay > 0:
                await asyncio.sleep(delay)
            await produce(settings, [event(correlation=f"race-{i}")])
        await eventually(
            lambda: (
                scalar(settings, "SELECT count(*) FROM matcher.inbox") == runs
                and scalar(settings, "SELECT count(*) FROM matcher.waits WHERE state = 'waiting'")
                == 0
            ),
            timeout=30,
        )
        resumes = await read_resumes(settings, at_least=runs)

    assert sorted(str(r.wait_id) for r in resumes) == sorted(str(w.id) for w in waits)
    facts = rows(
        settings,
        """
        SELECT w.id, w.state, i.status, i.consumed_by, i.late_for,
               (SELECT count(*) FROM matcher.resolutions o WHERE o.wait_id = w.id) AS resolutions
        FROM matcher.waits w JOIN matcher.inbox i ON i.correlation_id = w.correlation_id
        """,
    )
    assert len(facts) == runs
    outcomes = {"matched": 0, "timed_out": 0}
    for f in facts:
        assert f["resolutions"] == 1
        outcomes[f["state"]] += 1
        if f["state"] == "matched":
            assert (f["status"], f["consumed_by"], f["late_for"]) == ("consumed", f["id"], None)
        else:
            assert f["state"] == "timed_out"
            assert (f["status"], f["consumed_by"], f["late_for"]) == ("late", None, f["id"])
    # The jitter must have produced both outcomes, or the race was not exercised.
    assert outcomes["matched"] > 0, outcomes
    assert outcomes["timed_out"] > 0, outcomes


async def test_cancel_then_event_is_late(settings: Settings) -> None:
    from matcher.sdk import cancel_wait

    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        wait = register_wait(conn, _spec("corr-cancel"))
        assert cancel_wait(conn, wait.id)
        assert not cancel_wait(conn, wait.id)  # a second cancel is a recorded no-op
    async with running_daemon(settings):
        await produce(settings, [event(correlation="corr-cancel")])
        [resume] = await read_resumes(settings, at_least=1)
        await eventually(lambda: scalar(settings, "SELECT status FROM matcher.inbox") == "late")
    assert resume.outcome == "cancelled"
    assert resume.event is None
    assert scalar(settings, "SELECT late_for FROM matcher.inbox") == wait.id


async def test_malformed_message_between_good_ones_is_quarantined(settings: Settings) -> None:
    first, second = event(correlation="corr-a"), event(correlation="corr-b")
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        register_wait(conn, _spec("corr-a", run="run-a"))
        register_wait(conn, _spec("corr-b", run="run-b"))
    key = b"same-partition"
    _, h1, v1 = to_record(first)
    _, h2, v2 = to_record(second)
    garbage = [("content-type", b"application/cloudevents+json")]
    async with running_daemon(settings):
        await produce_raw(
            settings, [(key, h1, v1), (key, garbage, b"{not json\xff"), (key, h2, v2)]
        )
        resumes = await read_resumes(settings, at_least=2)
    assert {r.run_id for r in resumes} == {"run-a", "run-b"}
    [bad] = rows(settings, "SELECT * FROM matcher.quarantine")
    assert bad["reason"] == "malformed"
    assert bytes(bad["raw_value"]) == b"{not json\xff"
    offsets = [
        r["kafka_offset"]
        for r in rows(settings, "SELECT kafka_offset FROM matcher.inbox ORDER BY kafka_offset")
    ]
    assert offsets[0] < bad["kafka_offset"] < offsets[1]


async def test_quarantine_keeps_attributes_exact_or_not_at_all(settings: Settings) -> None:
    """A summary column holds the attribute as sent, or nothing: never an escape standing
    in for a NUL (it would read like the four characters of a sender who sent them) nor a
    replacement character for bytes that are not UTF-8. The headers keep the bytes."""
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_id", b"evt-nul"),
        ("ce_source", b"billing"),
        ("ce_type", b"job\x00done"),
        ("ce_tenant", b"\xff\xfe"),
        ("ce_correlationid", b"c\\x00"),  # a backslash, then "x00"
    ]
    async with running_daemon(settings):
        await produce_raw(settings, [(b"k", headers, b"{}")])
        await eventually(lambda: bool(rows(settings, "SELECT id FROM matcher.quarantine")))
    [bad] = rows(settings, "SELECT * FROM matcher.quarantine")
    assert (bad["producer"], bad["event_id"]) == ("billing", "evt-nul")
    assert (bad["type"], bad["tenant"]) == (None, None)
    assert bad["correlation_id"] == "c\\x00"
    kept = {h.get("name"): h for h in bad["headers"]}
    assert base64.b64decode(kept["ce_type"]["base64"]) == b"job\x00done"
    assert base64.b64decode(kept["ce_tenant"]["base64"]) == b"\xff\xfe"


async def test_advance_is_once_per_resolution(settings: Settings) -> None:
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        register_wait(conn, _spec("corr-adv", run="run-adv"))
    async with running_daemon(settings):
        await produce(settings, [event(correlation="corr-adv")])
        [resume] = await read_resumes(settings, at_least=1)
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        assert advance(conn, resume) is True
        assert advance(conn, resume) is False
        assert advance(conn, resume) is False
    [run] = rows(settings, "SELECT * FROM matcher.runs")
    assert (run["position"], run["last_resolution_id"]) == (1, resume.resolution_id)


async def test_a_batch_interval_stores_a_steady_flow_a_few_events_at_a_time(
    settings: Settings,
) -> None:
    """With MATCHER_INGEST_BATCH_INTERVAL_MS, what arrives within the interval after a
    batch began is stored by the next transaction, together; without it, events 40 ms
    apart (many cycles) are a transaction each. A transaction's events share their
    received_at, the time it began. The first batch, after a quiet spell, goes at once."""
    paced = settings.model_copy(update={"ingest_batch_interval_ms": 1000})
    first, *rest = [event() for _ in range(5)]

    async def send(producer: AIOKafkaProducer, sent: CompletionEvent) -> None:
        key, headers, value = to_record(sent)
        await within(producer.send_and_wait(paced.events_topic, value, key=key, headers=headers))

    async with running_daemon(paced), started(events_producer(paced)) as producer:
        await send(producer, first)
        await eventually(
            lambda: scalar(paced, "SELECT count(*) FROM matcher.inbox") == 1,
            what="the first event stored",
        )
        for sent in rest:
            await send(producer, sent)
            await asyncio.sleep(0.04)  # the load's pace, not a wait for anything
        await eventually(
            lambda: scalar(paced, "SELECT count(*) FROM matcher.inbox") == 5,
            what="the rest stored",
        )
    transactions = scalar(
        paced,
        "SELECT count(DISTINCT received_at) FROM matcher.inbox WHERE event_id = ANY(%s)",
        [[e.id for e in rest]],
    )
    assert transactions == 1, f"the four events were stored by {transactions} transactions"
