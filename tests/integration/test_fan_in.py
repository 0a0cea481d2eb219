"""Fan-in waits (all, any, at least N of several conditions) against the real daemon,
broker and Postgres (docs/concepts/waits.md)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import psycopg
import pytest

from matcher.admin.explain import explain_run
from matcher.config import Settings
from matcher.domain.explain import Verdict
from matcher.domain.resume import ResumeData
from matcher.domain.waits import Wait, WaitSpec
from matcher.sdk import cancel_wait, issue_callback, register_wait
from matcher.store.ingest import store_batch
from tests.support.assertions import eventually
from tests.support.db import rows, scalar
from tests.support.kafka import produce, read_resumes
from tests.support.processes import run_cli, running_daemon
from tests.support.records import event, ingest_record

DONE = ["job.completed"]


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return settings.model_copy(update={"sweep_interval_s": 0.05})


def _fan_in(run: str, correlations: list[str], rule: str = "all", **extra: Any) -> WaitSpec:
    return WaitSpec.model_validate(
        {
            "tenant": "acme",
            "run_id": run,
            "position": 0,
            "conditions": [{"event_types": DONE, "correlation_id": c} for c in correlations],
            "rule": rule,
            **extra,
        }
    )


def _register(settings: Settings, *specs: WaitSpec) -> list[Wait]:
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        return [register_wait(conn, s) for s in specs]


def _state(settings: Settings, wait_id: object) -> str:
    return str(scalar(settings, "SELECT state FROM matcher.waits WHERE id = %s", (wait_id,)))


def _inbox(settings: Settings, event_id: str) -> dict[str, Any]:
    [row] = rows(
        settings,
        "SELECT i.status, c.group_id AS consumed_for, l.group_id AS late_for"
        " FROM matcher.inbox AS i"
        " LEFT JOIN matcher.waits AS c ON c.id = i.consumed_by"
        " LEFT JOIN matcher.waits AS l ON l.id = i.late_for WHERE i.event_id = %s",
        (event_id,),
    )
    return row


def _stored(settings: Settings, n: int) -> bool:
    return bool(scalar(settings, "SELECT count(*) FROM matcher.inbox") == n)


async def test_all_of_resolves_with_every_event_in_order_and_explain_shows_progress(
    settings: Settings,
) -> None:
    [wait] = _register(settings, _fan_in("r-all", ["job-a", "job-b", "job-c"]))
    assert (wait.needed, [c.correlation_id for c in wait.conditions or []]) == (
        3,
        ["job-a", "job-b", "job-c"],
    )
    sent = [event(correlation=c, data={"job": c}) for c in ("job-b", "job-a", "job-c")]
    async with running_daemon(settings):
        for n, e in enumerate(sent[:2], start=1):
            await produce(settings, [e])
            await eventually(partial(_stored, settings, n), what=f"event {n} stored")
        async with await psycopg.AsyncConnection.connect(
            settings.database_url.get_secret_value(), autocommit=True
        ) as conn:
            found = await explain_run(settings, conn, "r-all")
        assert found.verdict is Verdict.WAITING
        assert any(
            r.startswith("2 of 3 conditions met (all needed): waiting for job.completed on "
                         "'job-c' since") for r in found.reasons
        ), found.reasons  # fmt: skip
        assert _state(settings, wait.id) == "waiting"
        await produce(settings, [sent[2]])
        [resume] = await read_resumes(settings, at_least=1)
    assert resume.outcome == "event"
    assert resume.needed == 3
    assert [e.id for e in resume.events or []] == [e.id for e in sent]  # order of arrival
    assert [e.correlation_id for e in resume.events or []] == ["job-b", "job-a", "job-c"]
    assert resume.event is not None
    assert resume.event.id == sent[2].id  # the one that completed it
    assert resume.events is not None
    assert resume.events[0].data == {"job": "job-b"}


async def test_any_of_two_events_together_one_consumes_the_other_stays_pending(
    settings: Settings,
) -> None:
    """Both events are sent at once (through the daemon) and, separately, stored in one
    ingest batch: either way one meets a condition and the other stays pending (it is not
    late: the wait did not miss it, it did not need it)."""
    [wait] = _register(settings, _fan_in("r-any", ["ap-1", "ap-2"], rule="any"))
    both = [event(correlation="ap-1"), event(correlation="ap-2")]
    async with running_daemon(settings):
        await produce(settings, both)
        [resume] = await read_resumes(settings, at_least=1)
        await eventually(lambda: _stored(settings, 2), what="both stored")
    statuses = sorted(_inbox(settings, e.id)["status"] for e in both)
    assert statuses == ["consumed", "pending"]
    assert resume.needed == 1
    assert len(resume.events or []) == 1
    conditions = {c["state"] for c in rows(settings, "SELECT state FROM matcher.waits"
                                           " WHERE group_id = %s", (wait.id,))}  # fmt: skip
    assert conditions == {"matched"}  # one met, the other closed ('group': not needed)
    # One batch, for certain: the same, decided by the rematch pass it is left to.
    [other] = _register(settings, _fan_in("r-any-2", ["ap-3", "ap-4"], rule="any"))
    batch = [event(correlation="ap-3"), event(correlation="ap-4")]
    async with (
        await psycopg.AsyncConnection.connect(settings.database_url.get_secret_value()) as conn,
        running_daemon(settings),
    ):
        await eventually(  # the registration's own look at the keys done first
            lambda: scalar(settings, "SELECT count(*) FROM matcher.match_queue") == 0,
            what="the registration's rematch pass",
        )
        result = await store_batch(conn, [ingest_record(e, n) for n, e in enumerate(batch)])
        assert (result.accepted, result.matched) == (2, 0)  # left to the rematch pass
        await eventually(lambda: _state(settings, other.id) == "matched", what="any met")
    assert sorted(_inbox(settings, e.id)["status"] for e in batch) == ["consumed", "pending"]


async def test_at_least_two_of_three_with_early_events(settings: Settings) -> None:
    early = [event(correlation="n-1"), event(correlation="n-3")]
    async with running_daemon(settings):
        await produce(settings, early)
        await eventually(lambda: _stored(settings, 2), what="the early events stored")
        [wait] = _register(
            settings, _fan_in("r-n", ["n-1", "n-2", "n-3"], rule="at_least", at_least=2)
        )
        [resume] = await read_resumes(settings, at_least=1)
        after = event(correlation="n-2")
        await produce(settings, [after])
        await eventually(lambda: _stored(settings, 3), what="the late third stored")
    assert resume.wait_id == wait.id
    assert sorted(e.id for e in resume.events or []) == sorted(e.id for e in early)
    assert _inbox(settings, after.id)["status"] == "pending"  # not needed: not late either


async def test_two_fan_in_waits_sharing_a_correlation_id_take_events_oldest_first(
    settings: Settings,
) -> None:
    """Conditions are matched as waits are: an event goes to the oldest waiting condition
    of its key that accepts it, whichever wait it belongs to; the next event to the next."""
    [first] = _register(settings, _fan_in("r-old", ["shared", "own-1"]))
    [second] = _register(settings, _fan_in("r-new", ["shared", "own-2"]))
    one, two = event(correlation="shared"), event(correlation="shared")
    async with running_daemon(settings):
        await produce(settings, [one])
        await eventually(lambda: _stored(settings, 1), what="stored")
        await produce(settings, [two])
        await eventually(lambda: _stored(settings, 2), what="stored")
        await eventually(
            lambda: _inbox(settings, two.id)["status"] == "consumed", what="the second taken"
        )
    assert _inbox(settings, one.id)["consumed_for"] == first.id
    assert _inbox(settings, two.id)["consumed_for"] == second.id
    assert (_state(settings, first.id), _state(settings, second.id)) == ("waiting", "waiting")


async def test_a_deadline_resolves_with_the_events_that_had_arrived(fast: Settings) -> None:
    [wait] = _register(
        fast, _fan_in("r-part", ["p-1", "p-2"], deadline=datetime.now(UTC) + timedelta(seconds=2))
    )
    got = event(correlation="p-1")
    async with running_daemon(fast):
        await produce(fast, [got])
        [resume] = await read_resumes(fast, at_least=1)
        late = event(correlation="p-2")
        await produce(fast, [late])
        await eventually(lambda: _stored(fast, 2), what="the late event stored")
    assert resume.outcome == "timeout"
    assert [e.id for e in resume.events or []] == [got.id]
    assert _inbox(fast, late.id) == {"status": "late", "consumed_for": None, "late_for": wait.id}
    async with await psycopg.AsyncConnection.connect(
        fast.database_url.get_secret_value(), autocommit=True
    ) as conn:
        found = await explain_run(fast, conn, "r-part")
    assert found.verdict is Verdict.TIMED_OUT
    assert [e["id"] for e in found.evidence["late_events"]] == [late.id]


async def test_a_cancelled_fan_in_wait_closes_its_conditions(settings: Settings) -> None:
    [wait] = _register(settings, _fan_in("r-cancel", ["k-1", "k-2"]))
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        assert cancel_wait(conn, wait.id)
    states = rows(settings, "SELECT state, resolution FROM matcher.waits WHERE group_id = %s",
                  (wait.id,))  # fmt: skip
    assert states == [{"state": "cancelled", "resolution": "cancel"}] * 2
    assert scalar(settings, "SELECT count(*) FROM matcher.resolutions") == 1  # the wait's only


RACES = 16


async def test_all_of_with_the_deadline_racing_the_last_event(fast: Settings) -> None:
    """Each wait has its first event early and its last sent as its deadline passes: each
    ends exactly once, matched with both events or timed out with the first (the last
    then late, linked to its condition)."""
    deadline = datetime.now(UTC) + timedelta(seconds=3)
    # Deadlines spread around the moment the last events are sent, 5 ms apart.
    specs = [_fan_in(f"r-race-{i}", [f"a-{i}", f"b-{i}"],
                     deadline=deadline + timedelta(milliseconds=5 * (i - RACES // 2)))
             for i in range(RACES)]  # fmt: skip
    waits = _register(fast, *specs)
    firsts = [event(correlation=f"a-{i}") for i in range(RACES)]
    lasts = [event(correlation=f"b-{i}") for i in range(RACES)]
    async with running_daemon(fast):
        await produce(fast, firsts)
        await eventually(lambda: _stored(fast, RACES), what="the first events stored")
        await asyncio.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()))
        await produce(fast, lasts)  # aimed at the deadline: some before, some after
        resumes = await read_resumes(fast, at_least=RACES)
        await eventually(lambda: _stored(fast, 2 * RACES), what="every event stored")
    by_wait: dict[Any, list[ResumeData]] = {}
    for r in resumes:
        by_wait.setdefault(r.wait_id, []).append(r)
    outbox = rows(fast, "SELECT wait_id, count(*) AS n FROM matcher.resolutions GROUP BY wait_id")
    assert {r["wait_id"]: r["n"] for r in outbox} == {w.id: 1 for w in waits}
    for wait, first, last in zip(waits, firsts, lasts, strict=True):
        resume = by_wait[wait.id][0]
        ids = [e.id for e in resume.events or []]
        if resume.outcome == "event":
            assert ids == [first.id, last.id]
            assert _inbox(fast, last.id)["status"] == "consumed"
        else:
            assert resume.outcome == "timeout"
            assert ids == [first.id]
            assert _inbox(fast, last.id) == {"status": "late", "consumed_for": None,
                                             "late_for": wait.id}  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"rule": "at_least", "at_least": 3}, "at_least is more than the number of conditions"),
        ({"rule": "at_least"}, "rule at_least needs at_least"),
        ({"event_types": DONE}, "takes no event_types or correlation_id"),
        ({"heartbeat_interval_s": 5, "progress_types": ["p"]}, "no condition or heartbeat"),
    ],
)
def test_a_malformed_fan_in_wait_is_refused(
    settings: Settings, extra: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        _fan_in("r-bad", ["x-1", "x-2"], **extra)


def test_the_sql_function_refuses_what_the_sdk_refuses(settings: Settings) -> None:
    cases = [
        ("'[{\"event_types\": [\"a\"], \"correlation_id\": \"c\"}]'", "2 to 32 conditions"),
        ("'[{\"event_types\": [\"a\"], \"correlation_id\": \"c\"}, {\"event_types\": [1],"
         " \"correlation_id\": \"d\"}]'", "event_types must be strings"),
        ("'[{\"event_types\": [\"a\"], \"correlation_id\": \"c\", \"extra\": 1},"
         " {\"event_types\": [\"a\"], \"correlation_id\": \"d\"}]'", "each condition is"),
        ("'[{\"event_types\": [\"a\"], \"correlation_id\": \"c\", \"condition\": \"$.x ==\"},"
         " {\"event_types\": [\"a\"], \"correlation_id\": \"d\"}]'", "not an SQL/JSON path"),
    ]  # fmt: skip
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        for conditions, words in cases:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=words):
                conn.execute(
                    "SELECT matcher.register_wait_v2('acme', 'r', 0, conditions => "
                    + conditions
                    + ")"
                )
    assert scalar(settings, "SELECT count(*) FROM matcher.waits") == 0


def test_the_cli_registers_a_fan_in_wait(settings: Settings) -> None:
    base = ["waits", "add", "--tenant", "acme", "--run", "r-cli", "--position", "0"]
    done = run_cli(settings, *base, "--fan-in", "job.completed,job.failed=job-a",
                   "--fan-in", "job.completed=job-b", "--rule", "any", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait = json.loads(done.stdout)
    assert wait["needed"] == 1
    assert [(c["event_types"], c["correlation_id"]) for c in wait["conditions"]] == [
        (["job.completed", "job.failed"], "job-a"),
        (["job.completed"], "job-b"),
    ]
    for extra, words in [
        (["--fan-in", "job-a"], "matcher: --fan-in 'job-a': write TYPES=CORRELATION"),
        (["--fan-in", "x=a", "--fan-in", "x=b", "--rule", "at_least"], "matcher: rule at_least"),
        (["--fan-in", "x=a", "--fan-in", "x=b", "--type", "x"], "matcher: a wait with conditions"),
        ([], "matcher: a wait needs event_types and correlation_id, or conditions"),
    ]:
        refused = run_cli(settings, *base, *extra)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith(words), refused.stderr
    assert scalar(settings, "SELECT count(*) FROM matcher.waits WHERE group_id IS NULL") == 1


def test_a_fan_in_wait_and_its_conditions_take_no_callback(settings: Settings) -> None:
    [wait] = _register(settings, _fan_in("r-cb", ["cb-1", "cb-2"]))
    assert wait.conditions is not None
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        for wait_id in (wait.id, wait.conditions[0].id):
            with pytest.raises(ValueError, match="takes no callback"):
                issue_callback(conn, wait_id)
