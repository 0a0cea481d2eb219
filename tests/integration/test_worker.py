"""The resume worker against the real daemon, broker and Postgres: each run advanced once
and its handler's write committed once; retries that block nobody else; failures parked,
explained and given back; hostile messages skipped; the database sweep when the topic
cannot help; shutdown and rebalances mid-load."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client import REGISTRY

from matcher.config import Settings
from matcher.domain.resume import ResumeData
from matcher.kafka.topics import delete_topics, ensure_topics
from matcher.sdk import committed_resume, get_wait
from matcher.sdk.worker import metrics
from tests.support.assertions import eventually
from tests.support.db import db, register_waits, rows, scalar
from tests.support.handlers import create_app_tables, record, record_sync, switched
from tests.support.kafka import produce, read_resume_messages, started, within
from tests.support.processes import run_cli, running_daemon
from tests.support.records import event
from tests.support.worker import running_worker, worker_settings

pytestmark = pytest.mark.timeout(240)


def _app(settings: Settings) -> None:
    with db(settings) as conn:
        create_app_tables(conn)


def _effects(settings: Settings) -> dict[str, int]:
    found = rows(settings, "SELECT run_id, count(*) AS n FROM app_effects GROUP BY run_id")
    return {r["run_id"]: r["n"] for r in found}


def _advanced(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM matcher.runs"))


def _switch(settings: Settings, name: str, on: bool) -> None:
    with db(settings) as conn:
        if on:
            conn.execute(
                "INSERT INTO app_switches VALUES (%s, 'on') ON CONFLICT DO NOTHING", [name]
            )
        else:
            conn.execute("DELETE FROM app_switches WHERE name = %s", [name])


async def _resolve(settings: Settings, count: int, prefix: str) -> list[str]:
    """``count`` waits resolved by their events (the daemon must run); their run ids."""
    correlations = register_waits(settings, count, prefix=prefix)
    await produce(settings, [event(correlation=c) for c in correlations])
    return [f"run-{c}" for c in correlations]


async def test_each_run_advances_once_and_its_write_commits_with_it(settings: Settings) -> None:
    _app(settings)
    async with running_daemon(settings):
        runs = await _resolve(settings, 200, "once")
        async with running_worker(worker_settings(settings), record) as worker:
            await eventually(lambda: len(_effects(settings)) == 200, timeout=90,
                             what="every run handled")  # fmt: skip
            # Redeliveries of every resume (a relay after a crash): duplicates, no effect.
            duplicates = metrics.RESUMES.labels("duplicate", "topic")._value.get()
            messages = await read_resume_messages(settings, at_least=200)
            async with started(AIOKafkaProducer(**settings.kafka_client_options())) as producer:
                for message in messages:
                    await within(producer.send_and_wait(settings.resume_topic, message))
            await eventually(
                lambda: metrics.RESUMES.labels("duplicate", "topic")._value.get()
                - duplicates >= 200,
                timeout=60, what="the redeliveries seen",
            )  # fmt: skip
            assert worker.handled == 200
    assert _effects(settings) == dict.fromkeys(runs, 1)
    assert _advanced(settings) == 200
    explained = run_cli(settings, "explain", runs[0], "--json")
    body = json.loads(explained.stdout)
    assert body["verdict"] == "resolved_by_event"
    assert any("the run advanced past position" in r for r in body["reasons"])


def _batches() -> tuple[float, float]:
    """How many transactions the workers of this process ran, and how many of them held
    one resume only."""
    count = REGISTRY.get_sample_value("matcher_worker_batch_size_count") or 0.0
    alone = REGISTRY.get_sample_value("matcher_worker_batch_size_bucket", {"le": "1.0"}) or 0.0
    return count, alone


async def test_a_failing_handler_in_a_batch_costs_its_neighbours_nothing(
    settings: Settings,
) -> None:
    """A backlog handled in batches, three of whose runs' handlers always fail: the batch
    they fall in is rolled back and its resumes attempted alone, so the three are parked
    and every other run is handled once."""
    _app(settings)
    async with running_daemon(settings):
        runs = await _resolve(settings, 300, "batch")
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.resolutions "
                                     "WHERE published") == 300,
            timeout=60, what="the backlog published",
        )  # fmt: skip
    failing = set(runs[::100])
    for run in failing:
        _switch(settings, f"fail:{run}", True)
    count, alone = _batches()
    quick = worker_settings(settings, worker_max_attempts=2)
    async with running_worker(quick, switched):
        await eventually(
            lambda: len(_effects(settings)) == 297
            and scalar(settings, "SELECT count(*) FROM matcher.worker_failures "
                                 "WHERE parked_at IS NOT NULL") == 3,
            timeout=90, what="the others handled, the three parked",
        )  # fmt: skip
    after, after_alone = _batches()
    assert (after - count) - (after_alone - alone) > 0, "no transaction held several resumes"
    assert _effects(settings) == {run: 1 for run in runs if run not in failing}
    parked = rows(settings, "SELECT run_id FROM matcher.worker_failures")
    assert {r["run_id"] for r in parked} == failing


async def test_a_sync_handler_runs_in_the_same_transaction(settings: Settings) -> None:
    _app(settings)
    async with running_daemon(settings):
        runs = await _resolve(settings, 20, "sync")
        async with running_worker(worker_settings(settings), record_sync):
            await eventually(lambda: len(_effects(settings)) == 20, timeout=60, what="handled")
    assert _effects(settings) == dict.fromkeys(runs, 1)


async def test_a_handler_that_fails_then_succeeds_is_tried_again(settings: Settings) -> None:
    _app(settings)
    async with running_daemon(settings):
        [run] = await _resolve(settings, 1, "flaky")
        _switch(settings, f"fail:{run}", True)
        async with running_worker(worker_settings(settings, worker_max_attempts=50), switched):
            await eventually(
                lambda: bool(rows(settings, "SELECT 1 FROM matcher.worker_failures")),
                timeout=30, what="a failure recorded",
            )  # fmt: skip
            explained = json.loads(run_cli(settings, "explain", run, "--json").stdout)
            assert explained["verdict"] == "worker_failing"
            _switch(settings, f"fail:{run}", False)
            await eventually(lambda: _effects(settings) == {run: 1}, timeout=30, what="handled")
    assert scalar(settings, "SELECT count(*) FROM matcher.worker_failures") == 0


async def test_a_handler_that_always_fails_is_parked_then_retried_after_the_fix(
    settings: Settings,
) -> None:
    _app(settings)
    async with running_daemon(settings):
        [run] = await _resolve(settings, 1, "parked")
        _switch(settings, f"fail:{run}", True)
        quick = worker_settings(settings, worker_max_attempts=3, worker_sweep_after_s=0)
        async with running_worker(quick, switched):
            await eventually(
                lambda: scalar(settings, "SELECT count(*) FROM matcher.worker_failures "
                                         "WHERE parked_at IS NOT NULL") == 1,
                timeout=30, what="parked",
            )  # fmt: skip
            explained = json.loads(run_cli(settings, "explain", run, "--json").stdout)
            assert explained["verdict"] == "parked"
            assert any("the application refuses run" in r for r in explained["reasons"])
            assert _effects(settings) == {}
            _switch(settings, f"fail:{run}", False)  # the fix
            wait_id = explained["evidence"]["wait"]["id"]
            retried = run_cli(settings, "resumes", "retry", "--wait", wait_id, "--json")
            assert retried.returncode == 0, retried.stderr
            assert json.loads(retried.stdout) == {"retried": 1}
            await eventually(lambda: _effects(settings) == {run: 1}, timeout=30,
                             what="the retried resume handled by the sweep")  # fmt: skip
    assert json.loads(run_cli(settings, "explain", run, "--json").stdout)["verdict"] == (
        "resolved_by_event"
    )


async def test_a_run_not_ready_delays_no_other_run(settings: Settings) -> None:
    """One run is not ready (its handler raises Retry) for 30 s; 1,000 others are handled
    meanwhile, none waiting for it."""
    _app(settings)
    async with running_daemon(settings):
        runs = await _resolve(settings, 1001, "ready")
        slow = runs[0]
        _switch(settings, f"wait:{slow}", True)
        began = time.monotonic()
        async with running_worker(worker_settings(settings), switched):
            await eventually(lambda: len(_effects(settings)) == 1000, timeout=120,
                             what="the others handled")  # fmt: skip
            assert time.monotonic() - began < 30, "the others waited for the run not ready"
            # It stays not ready for 30 s in all, tried again and again meanwhile.
            await eventually(lambda: time.monotonic() - began >= 30, timeout=40,
                             what="30 s not ready")  # fmt: skip
            assert slow not in _effects(settings)
            _switch(settings, f"wait:{slow}", False)
            await eventually(lambda: len(_effects(settings)) == 1001, timeout=30,
                             what="the slow run handled once ready")  # fmt: skip
    assert _effects(settings) == dict.fromkeys(runs, 1)


async def test_poison_and_forged_messages_are_skipped(settings: Settings) -> None:
    _app(settings)
    async with running_daemon(settings):
        runs = await _resolve(settings, 5, "poison")
        [genuine, *_] = await read_resume_messages(settings, at_least=5)
        forged = json.loads(genuine)
        forged["data"]["run_id"] = "run-forged"  # addressed to another run
        hostile = [b"\xff\xfe not json", b"{}", b'{"type": "matcher.resume", "data": {}}',
                   json.dumps(forged).encode()]  # fmt: skip
        async with started(AIOKafkaProducer(**settings.kafka_client_options())) as producer:
            for value in hostile:
                await within(producer.send_and_wait(settings.resume_topic, value, key=b"x"))
        async with running_worker(worker_settings(settings), record):
            await eventually(lambda: len(_effects(settings)) == 5, timeout=60, what="handled")
            await eventually(
                lambda: metrics.RESUMES.labels("unverified", "topic")._value.get() >= 1,
                timeout=30, what="the forged one refused",
            )  # fmt: skip
    assert set(_effects(settings)) == set(runs)
    assert "run-forged" not in _effects(settings)


async def test_a_deleted_resume_topic_strands_no_run(settings: Settings) -> None:
    """The resume topic is deleted before any worker read it: the sweep of the database
    hands every resolution to the handler all the same."""
    _app(settings)
    async with running_daemon(settings):
        runs = await _resolve(settings, 30, "gone")
        await eventually(lambda: int(scalar(settings, "SELECT count(*) FROM matcher.resolutions "
                                                      "WHERE published")) == 30,
                         timeout=60, what="published")  # fmt: skip
    await delete_topics(settings.kafka_client_options(), [settings.resume_topic])
    await ensure_topics(settings.kafka_client_options(), [settings.resume_topic], partitions=1)
    quick = worker_settings(settings, worker_sweep_after_s=0)
    async with running_worker(quick, record):
        await eventually(lambda: len(_effects(settings)) == 30, timeout=60,
                         what="every run handled from the database")  # fmt: skip
    assert _effects(settings) == dict.fromkeys(runs, 1)


async def test_a_shutdown_mid_batch_loses_and_doubles_nothing(settings: Settings) -> None:
    _app(settings)

    async def slow(tx: psycopg.AsyncConnection[Any], resume: ResumeData) -> None:
        await asyncio.sleep(0.05)
        await record(tx, resume)

    async with running_daemon(settings):
        runs = await _resolve(settings, 300, "shutdown")
        async with running_worker(worker_settings(settings, worker_concurrency=4), slow) as w:
            await eventually(lambda: len(_effects(settings)) >= 20, timeout=60, what="started")
            group = w._settings.worker_group
        assert len(_effects(settings)) < 300  # stopped mid-batch
        again = worker_settings(settings).model_copy(update={"worker_group": group})
        async with running_worker(again, record):
            await eventually(lambda: len(_effects(settings)) == 300, timeout=90, what="rest")
    assert _effects(settings) == dict.fromkeys(runs, 1)


async def test_two_workers_and_a_rebalance_mid_load(settings: Settings) -> None:
    _app(settings)
    async with running_daemon(settings):
        first = worker_settings(settings)
        second = first.model_copy()
        runs = await _resolve(settings, 400, "rebalance")
        async with running_worker(first, record):
            await eventually(lambda: len(_effects(settings)) >= 50, timeout=60, what="going")
            async with running_worker(second, record):  # joins: partitions move
                await eventually(lambda: len(_effects(settings)) >= 200, timeout=90,
                                 what="both going")  # fmt: skip
            # The second leaves mid-load: its partitions come back to the first.
            more = await _resolve(settings, 100, "rebalance-late")
            await eventually(lambda: len(_effects(settings)) == 500, timeout=120, what="all")
    assert _effects(settings) == dict.fromkeys([*runs, *more], 1)


def test_the_committed_resume_of_a_wait_comes_from_the_database(settings: Settings) -> None:
    correlations = register_waits(settings, 1, prefix="committed")
    url = settings.database_url.get_secret_value()
    with psycopg.connect(url, autocommit=True) as conn:
        wait_id = conn.execute("SELECT id FROM matcher.waits").fetchone()[0]  # type: ignore[index]
        assert committed_resume(conn, wait_id) is None
        conn.execute("SELECT matcher.cancel_wait_v1(%s)", [wait_id])
        resume = committed_resume(conn, wait_id)
        assert resume is not None
        assert resume.outcome == "cancelled"
        assert resume.correlation_id == correlations[0]
        wait = get_wait(conn, wait_id)
        assert wait is not None
        assert wait.state == "cancelled"
        assert resume.message is not None
        assert str(uuid.UUID(json.loads(resume.message)["id"])) == str(resume.resolution_id)
