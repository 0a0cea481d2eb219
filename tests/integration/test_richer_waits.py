"""Waits with a condition on the event's data, and waits with a heartbeat, against the real
daemon, broker and Postgres (docs/concepts/waits.md)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from matcher.admin.explain import explain_run
from matcher.config import Settings
from matcher.domain.explain import Explanation, Verdict
from matcher.domain.waits import Wait, WaitSpec
from matcher.sdk import register_wait
from tests.support.assertions import eventually
from tests.support.db import rows, scalar
from tests.support.kafka import produce, read_resumes
from tests.support.processes import run_cli, running_daemon
from tests.support.records import event

SUCCEEDED = '$.status == "succeeded"'


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """The sweeper every 50 ms: heartbeats come due within a test's patience."""
    return settings.model_copy(update={"sweep_interval_s": 0.05})


def _spec(correlation: str, run: str = "run-1", **extra: Any) -> WaitSpec:
    return WaitSpec.model_validate(
        {
            "tenant": "acme",
            "run_id": run,
            "position": 0,
            "event_types": ["job.completed"],
            "correlation_id": correlation,
            **extra,
        }
    )


def _register(settings: Settings, spec: WaitSpec) -> Wait:
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        return register_wait(conn, spec)


async def _explain(settings: Settings, run: str) -> Explanation:
    async with await psycopg.AsyncConnection.connect(
        settings.database_url.get_secret_value(), autocommit=True
    ) as conn:
        return await explain_run(settings, conn, run)


def _inbox(settings: Settings, event_id: str) -> dict[str, Any]:
    [row] = rows(
        settings,
        "SELECT status, consumed_by, late_for, progress_for FROM matcher.inbox WHERE event_id = %s",
        (event_id,),
    )
    return row


def _wait(settings: Settings, wait_id: object) -> dict[str, Any]:
    [row] = rows(settings, "SELECT * FROM matcher.waits WHERE id = %s", (wait_id,))
    return row


@pytest.mark.parametrize("early", [False, True], ids=["wait-first", "events-first"])
async def test_an_event_whose_data_fails_the_condition_stays_pending(
    settings: Settings, early: bool
) -> None:
    """Condition false, then condition true: the second event resolves the wait, the first
    is not consumed (it stays pending for other waits), whether the events came before
    the wait (the rematch pass decides) or after it (ingest decides)."""
    failed = event(correlation="c-cond", data={"status": "failed"})
    succeeded = event(correlation="c-cond", data={"status": "succeeded", "n": 1})
    async with running_daemon(settings):
        if early:
            await produce(settings, [failed, succeeded])
            await eventually(
                lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 2,
                what="both events stored",
            )
        wait = _register(settings, _spec("c-cond", condition=SUCCEEDED))
        assert wait.condition == '($."status" == "succeeded")'  # as Postgres prints it
        if not early:
            await produce(settings, [failed])
            await eventually(
                lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 1,
                what="the first event stored",
            )
            await produce(settings, [succeeded])
        await eventually(
            lambda: _wait(settings, wait.id)["state"] == "matched", what="the wait matched"
        )
        [resume] = await read_resumes(settings, at_least=1)
    assert resume.event is not None
    assert resume.event.id == succeeded.id
    assert resume.event.data == {"status": "succeeded", "n": 1}
    assert _inbox(settings, failed.id)["status"] == "pending"
    assert _inbox(settings, succeeded.id)["consumed_by"] == wait.id


async def test_a_condition_that_cannot_be_evaluated_is_false_and_breaks_nothing(
    settings: Settings,
) -> None:
    """A condition that errors on some data (a division by zero, a non-boolean result, a
    string compared as a date) is false for that event; the rest of its batch is stored
    and matched as usual."""
    odd = [
        ("c-div", "$.n / $.zero == 1", {"n": 1, "zero": 0}),
        ("c-num", "$.n", {"n": 5}),
        ("c-date", '$.t.datetime() < "2020-01-01".datetime()', {"t": "not a date"}),
        ("c-bool", "$.ok", {"ok": True}),
    ]
    waits = {c: _register(settings, _spec(c, run=c, condition=p)) for c, p, _ in odd}
    plain = _register(settings, _spec("c-plain", run="plain"))
    sent = [event(correlation=c, data=d) for c, _, d in odd] + [event(correlation="c-plain")]
    async with running_daemon(settings):
        await produce(settings, sent)
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == len(sent),
            what="every event stored",
        )
        await eventually(
            lambda: _wait(settings, plain.id)["state"] == "matched", what="plain matched"
        )
        await eventually(
            lambda: _wait(settings, waits["c-bool"].id)["state"] == "matched",
            what="the boolean path matched",
        )
    for c in ("c-div", "c-num", "c-date"):
        assert _wait(settings, waits[c].id)["state"] == "waiting", c
    statuses = {r["correlation_id"]: r["status"] for r in rows(
        settings, "SELECT correlation_id, status FROM matcher.inbox")}  # fmt: skip
    assert statuses == {"c-div": "pending", "c-num": "pending", "c-date": "pending",
                        "c-bool": "consumed", "c-plain": "consumed"}  # fmt: skip


@pytest.mark.parametrize(
    ("condition", "words"),
    [
        ("$.status ==", "not an SQL/JSON path"),
        ('$.a like_regex "(a+)+$"', "must not use like_regex"),
        ("$.**.status == 1", "any-depth accessor"),
        ("$.a == $limit", "must not use variables"),
        ('$.a == $"limit"', "must not use variables"),
        ("$." + "a" * 1000, "at most 1000 characters"),
    ],
)
def test_a_malformed_condition_is_refused_at_registration(
    settings: Settings, condition: str, words: str
) -> None:
    """Refused before anything is stored, with the reason; by the SDK and by the SQL
    function alike (a string holding what looks like a variable is not one)."""
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        with pytest.raises(ValueError, match=words):
            register_wait(conn, _spec("c-bad", condition=condition))
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=words):
            conn.execute(
                "SELECT matcher.register_wait_v2('acme', 'r', 0, '{job.completed}', 'c-bad',"
                " condition => %s)",
                (condition,),
            )
        fine = register_wait(conn, _spec("c-ok", condition='$.note == "$limit **"'))
    assert fine.state == "waiting"
    assert scalar(settings, "SELECT count(*) FROM matcher.waits") == 1


def test_a_heartbeat_is_whole_and_apart_from_the_event_types(settings: Settings) -> None:
    with pytest.raises(ValueError, match="both heartbeat_interval_s and progress_types"):
        _spec("c", heartbeat_interval_s=5)
    with pytest.raises(ValueError, match="both an event type and a progress type"):
        _spec("c", heartbeat_interval_s=5, progress_types=["job.completed"])
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        _spec("c", heartbeat_interval_s=0.5, progress_types=["job.progress"])
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        for extra, words in [
            ("heartbeat_interval => '5 s'", "both heartbeat_interval and progress_types"),
            ("heartbeat_interval => '0.5 s', progress_types => '{p}'", "between 1 second"),
            ("heartbeat_interval => '5 s', progress_types => '{job.completed}'", "both an"),
        ]:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=words):
                conn.execute(
                    "SELECT matcher.register_wait_v2('acme', 'r', 0, '{job.completed}', 'c', "
                    + extra
                    + ")"
                )


async def test_progress_moves_the_heartbeat_on_and_never_resolves(settings: Settings) -> None:
    wait = _register(
        settings,
        _spec("c-hb", heartbeat_interval_s=600, progress_types=["job.progress"]),
    )
    assert wait.heartbeat_interval_s == 600
    assert wait.progress_types == ["job.progress"]
    first_due = _wait(settings, wait.id)["heartbeat_due"]
    progress = [event(correlation="c-hb", type_="job.progress", data={"pct": p}) for p in (10, 50)]
    async with running_daemon(settings):
        await produce(settings, progress)
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 2,
            what="the progress stored",
        )
        for p in progress:
            linked = {"status": "progress", "consumed_by": None, "late_for": None}
            assert _inbox(settings, p.id) == linked | {"progress_for": wait.id}
        stored = _wait(settings, wait.id)
        assert stored["state"] == "waiting"
        assert stored["heartbeat_due"] > first_due
        assert stored["last_progress_at"] is not None
        found = await _explain(settings, "run-1")
        assert found.verdict is Verdict.WAITING
        assert any("2 progress event(s), last progress at" in r for r in found.reasons)
        done = event(correlation="c-hb", data={"status": "done"})
        await produce(settings, [done])
        await eventually(
            lambda: _wait(settings, wait.id)["state"] == "matched", what="the completion"
        )
        [resume] = await read_resumes(settings, at_least=1)
    assert resume.outcome == "event"
    assert resume.timeout_reason is None


async def test_silence_times_the_wait_out_by_its_heartbeat(fast: Settings) -> None:
    far = datetime.now(UTC) + timedelta(hours=1)
    wait = _register(
        fast,
        _spec("c-silent", deadline=far, heartbeat_interval_s=1, progress_types=["job.progress"]),
    )
    async with running_daemon(fast):
        await eventually(
            lambda: _wait(fast, wait.id)["state"] == "timed_out", what="the heartbeat missed"
        )
        [resume] = await read_resumes(fast, at_least=1)
        assert _wait(fast, wait.id)["resolution"] == "heartbeat"
        # A progress event after it is late, linked to the wait.
        after = event(correlation="c-silent", type_="job.progress")
        await produce(fast, [after])
        await eventually(
            lambda: scalar(fast, "SELECT count(*) FROM matcher.inbox") == 1, what="stored"
        )
    found = await _explain(fast, "run-1")
    assert found.verdict is Verdict.TIMED_OUT
    assert "its heartbeat was missed" in found.reasons[0]
    assert resume.outcome == "timeout"
    assert resume.timeout_reason == "heartbeat"
    assert resume.deadline is not None
    assert abs(resume.deadline - far) < timedelta(milliseconds=1)
    assert _inbox(fast, after.id)["late_for"] == wait.id


async def test_a_progress_event_before_its_wait_is_linked_and_moves_nothing(
    settings: Settings,
) -> None:
    early = event(correlation="c-early-hb", type_="job.progress")
    async with running_daemon(settings):
        await produce(settings, [early])
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 1, what="stored"
        )
        wait = _register(
            settings,
            _spec("c-early-hb", heartbeat_interval_s=60, progress_types=["job.progress"]),
        )
        due = _wait(settings, wait.id)["heartbeat_due"]
        await eventually(
            lambda: _inbox(settings, early.id)["status"] == "progress",
            what="the early progress linked",
        )
    assert _inbox(settings, early.id)["progress_for"] == wait.id
    stored = _wait(settings, wait.id)
    assert stored["state"] == "waiting"
    assert stored["heartbeat_due"] == due  # received before the wait: nothing moved


RACES = 24


def _one_outcome_each(settings: Settings, wait_ids: list[Any]) -> dict[Any, str]:
    found = rows(
        settings,
        "SELECT w.id, w.state, w.resolution, count(o.resolution_id) AS resolutions"
        " FROM matcher.waits AS w LEFT JOIN matcher.resolutions AS o ON o.wait_id = w.id"
        " WHERE w.id = ANY(%s) GROUP BY w.id",
        (wait_ids,),
    )
    assert all(r["resolutions"] == 1 for r in found), found
    assert len(found) == len(wait_ids)
    return {r["id"]: r["resolution"] for r in found}


async def test_a_heartbeat_racing_the_deadline_gives_one_outcome(fast: Settings) -> None:
    """Deadline and heartbeat come due within a millisecond of each other: each wait times
    out once, by whichever the sweeper sees first."""
    soon = datetime.now(UTC) + timedelta(seconds=2)
    specs = [
        _spec(f"c-race-{i}", run=f"r{i}", deadline=soon + timedelta(microseconds=500 * (i % 3 - 1)),
              heartbeat_interval_s=2, progress_types=["job.progress"])
        for i in range(RACES)
    ]  # fmt: skip
    with psycopg.connect(fast.database_url.get_secret_value()) as conn:
        waits = [register_wait(conn, s) for s in specs]  # one transaction: one now()
    ids = [w.id for w in waits]
    async with running_daemon(fast):
        await eventually(
            lambda: scalar(fast, "SELECT count(*) FROM matcher.resolutions") == RACES,
            what="every wait resolved",
        )
        resumes = await read_resumes(fast, at_least=RACES)
    resolutions = _one_outcome_each(fast, ids)
    assert set(resolutions.values()) <= {"deadline", "heartbeat"}
    by_wait = {r.wait_id: r for r in resumes}
    for wait_id, resolution in resolutions.items():
        assert by_wait[wait_id].outcome == "timeout"
        expected = "heartbeat" if resolution == "heartbeat" else None
        assert by_wait[wait_id].timeout_reason == expected


async def test_a_heartbeat_racing_a_completion_gives_one_outcome(fast: Settings) -> None:
    """The completion is sent as the heartbeat comes due: each wait is either matched (the
    event consumed) or timed out by its heartbeat (the event late, linked to it), never
    both, never neither."""
    with psycopg.connect(fast.database_url.get_secret_value()) as conn:
        waits = [
            register_wait(conn, _spec(f"c-hbc-{i}", run=f"r{i}", heartbeat_interval_s=1,
                                      progress_types=["job.progress"]))
            for i in range(RACES)
        ]  # fmt: skip
    due = min(_wait(fast, w.id)["heartbeat_due"] for w in waits)
    completions = [event(correlation=f"c-hbc-{i}") for i in range(RACES)]
    async with running_daemon(fast):
        wait_s = (due - datetime.now(UTC)).total_seconds()
        await asyncio.sleep(max(0.0, wait_s - 0.05))  # aim the sends at the due time
        await produce(fast, completions)
        await eventually(
            lambda: scalar(fast, "SELECT count(*) FROM matcher.resolutions") == RACES,
            what="every wait resolved",
        )
        await eventually(
            lambda: scalar(fast, "SELECT count(*) FROM matcher.inbox") == RACES, what="stored"
        )
    resolutions = _one_outcome_each(fast, [w.id for w in waits])
    for wait, sent in zip(waits, completions, strict=True):
        stored, resolution = _inbox(fast, sent.id), resolutions[wait.id]
        if resolution == "event":
            assert stored["status"] == "consumed"
            assert stored["consumed_by"] == wait.id
        else:
            assert resolution == "heartbeat"
            assert stored["status"] == "late"
            assert stored["late_for"] == wait.id


async def test_explain_names_an_event_that_failed_the_condition(settings: Settings) -> None:
    _register(settings, _spec("c-why", run="r-why", condition=SUCCEEDED))
    failed = event(correlation="c-why", data={"status": "failed"})
    async with running_daemon(settings):
        await produce(settings, [failed])
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 1, what="stored"
        )
    found = await _explain(settings, "r-why")
    assert found.verdict is Verdict.MISMATCH
    [mismatch] = found.evidence["mismatches"]
    assert mismatch["differs"] == "condition"
    assert mismatch["id"] == failed.id
    assert mismatch["data"] == {"status": "failed"}
    assert any("does not satisfy the wait's condition" in r for r in found.reasons)


def test_the_cli_registers_a_condition_and_a_heartbeat_and_refuses_bad_ones(
    settings: Settings,
) -> None:
    base = ["waits", "add", "--tenant", "acme", "--run", "r-cli", "--position", "0",
            "--type", "job.completed", "--correlation", "c-cli"]  # fmt: skip
    done = run_cli(settings, *base, "--condition", SUCCEEDED, "--heartbeat", "30",
                   "--progress-type", "job.progress", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait = json.loads(done.stdout)
    assert wait["condition"] == '($."status" == "succeeded")'
    assert (wait["heartbeat_interval_s"], wait["progress_types"]) == (30, ["job.progress"])
    for extra, words in [
        (["--condition", '$.a like_regex "x"'], "matcher: condition must not use like_regex"),
        (["--heartbeat", "30"], "matcher: a heartbeat needs both"),
        (["--heartbeat", "0.1", "--progress-type", "p"], "matcher: --heartbeat 0.1: "),
    ]:
        refused = run_cli(settings, *base, *extra)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith(words), refused.stderr
        assert "Traceback" not in refused.stderr
    assert scalar(settings, "SELECT count(*) FROM matcher.waits") == 1
