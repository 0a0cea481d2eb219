"""Scale-out: several ``matcher run`` daemons in one consumer group share the work safely.

The daemons split the events topic's partitions between them, but everything else is
shared: their sweepers race for the same overdue waits and their relays for the same
outbox rows (both claim with FOR UPDATE SKIP LOCKED), and an event can race its own
wait's deadline. Whatever the interleaving (and whatever a SIGKILL interrupts), each wait
is resolved once, each event is stored once, and each run advances once.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
from aiokafka import AIOKafkaProducer

from matcher.config import Settings
from matcher.domain.events import CompletionEvent
from matcher.domain.resume import ResumeData
from matcher.domain.waits import WaitSpec
from matcher.sdk import advance, register_wait
from tests.support.assertions import env_flag, eventually
from tests.support.db import rows, scalar
from tests.support.kafka import read_resumes, started, to_record, within
from tests.support.processes import DaemonProcess, process_env
from tests.support.records import event

TENANT = "acme"
# A small relay batch makes "at most one in-flight batch was published twice" a sharp
# bound rather than one larger than the whole test's output.
RELAY_BATCH = 100
# An event sent this many seconds from its wait's deadline: some arrive first, some after
# the sweeper, some while it is sweeping (ingest takes tens to hundreds of ms here).
RACE_OFFSETS_S = (-0.6, -0.4, -0.25, -0.15, -0.1, -0.05, 0.0, 0.05, 0.1)


@dataclass
class Plan:
    """The waits of a test, and when each one's event (if any) goes to Kafka."""

    by_event: list[str] = field(default_factory=list)  # correlation ids
    timing_out: list[str] = field(default_factory=list)
    racing: list[str] = field(default_factory=list)  # an event close to the deadline
    # The one event produced for a correlation id.
    events: dict[str, CompletionEvent] = field(default_factory=dict)
    # (seconds after the load starts, events to send then)
    schedule: list[tuple[float, list[CompletionEvent]]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.by_event) + len(self.timing_out) + len(self.racing)


def _correlations(count: int, kind: str) -> list[str]:
    return [f"scale-{kind}-{uuid.uuid4().hex[:10]}" for _ in range(count)]


def _register(settings: Settings, waits: Sequence[tuple[str, datetime | None]]) -> None:
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        for n, (correlation, deadline) in enumerate(waits):
            register_wait(
                conn,
                WaitSpec(
                    tenant=TENANT,
                    run_id=f"run-{correlation}",
                    position=n % 3,
                    event_types=["job.completed"],
                    correlation_id=correlation,
                    deadline=deadline,
                ),
            )


def _plan(
    settings: Settings, *, by_event: int, timing_out: int, racing: int, seconds: float
) -> tuple[Plan, float]:
    """Register the waits and schedule their events over ``seconds``; return the plan and
    the monotonic time the load starts at (deadlines count from it)."""
    plan = Plan(
        by_event=_correlations(by_event, "event"),
        timing_out=_correlations(timing_out, "timeout"),
        racing=_correlations(racing, "race"),
    )
    _register(settings, [(c, None) for c in plan.by_event])
    # Deadlines are registered last and counted from a start just ahead, so that none is
    # already past when the load begins: about 1.6 ms a registration here when idle, so
    # 8 ms leaves room for a busy machine.
    lead = 1.0 + (timing_out + racing) * 0.008
    start_wall = datetime.now(UTC) + timedelta(seconds=lead)
    start = time.monotonic() + lead

    def at(offset: float) -> datetime:
        return start_wall + timedelta(seconds=offset)

    # Timeouts in groups sharing one deadline, so all sweepers find the same rows due.
    groups = max(1, timing_out // 25)
    timeouts: list[tuple[str, datetime | None]] = [
        (c, at(1.0 + seconds * (n % groups) / groups)) for n, c in enumerate(plan.timing_out)
    ]
    races: list[tuple[str, datetime | None]] = []
    for n, correlation in enumerate(plan.racing):
        deadline_s = 1.5 + (seconds - 1.5) * n / max(1, racing)
        races.append((correlation, at(deadline_s)))
        produced = event(tenant=TENANT, correlation=correlation)
        plan.events[correlation] = produced
        offset = RACE_OFFSETS_S[n % len(RACE_OFFSETS_S)]
        plan.schedule.append((max(0.0, deadline_s + offset), [produced]))
    _register(settings, timeouts + races)
    assert time.monotonic() < start, "registration overran the lead; deadlines are early"

    chunk = 20
    chunks = max(1, (by_event + chunk - 1) // chunk)
    for n in range(chunks):
        sending = [
            event(tenant=TENANT, correlation=c) for c in plan.by_event[n * chunk : (n + 1) * chunk]
        ]
        plan.events.update((e.correlationid, e) for e in sending)
        plan.schedule.append((seconds * n / chunks, sending))
    plan.schedule.sort(key=lambda entry: entry[0])
    return plan, start


class Producing:
    """Sends a plan's events on schedule through one producer; counts what was acked."""

    def __init__(self, settings: Settings, plan: Plan, start: float) -> None:
        self.sent = 0
        self.total = sum(len(events) for _, events in plan.schedule)
        self._settings = settings
        self._plan = plan
        self._start = start

    async def run(self) -> None:
        producer = AIOKafkaProducer(
            **self._settings.kafka_client_options(),
            enable_idempotence=True,
            acks="all",
            linger_ms=5,
        )
        async with started(producer):
            for offset, events in self._plan.schedule:
                delay = self._start + offset - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                futures = []
                for e in events:
                    key, headers, value = to_record(e)
                    futures.append(
                        await within(
                            producer.send(
                                self._settings.events_topic, value, key=key, headers=headers
                            )
                        )
                    )
                await within(asyncio.gather(*futures))
                self.sent += len(events)


@contextlib.contextmanager
def _daemons(settings: Settings, count: int) -> Iterator[list[DaemonProcess]]:
    """``count`` daemons started together (more may be appended); any still running
    when the block ends is killed, so a failing test leaves no process behind."""
    env = process_env(settings, MATCHER_RELAY_BATCH_MAX=str(settings.relay_batch_max))
    daemons = [DaemonProcess(env) for _ in range(count)]
    try:
        for daemon in daemons:
            daemon.wait_ready()
        yield daemons
    finally:
        for daemon in daemons:
            if daemon.process.poll() is None:
                daemon.kill()


def _settled(settings: Settings, total: int) -> bool:
    counts = rows(
        settings,
        "SELECT count(*) AS resolved, count(*) FILTER (WHERE published) AS published"
        " FROM matcher.resolutions",
    )[0]
    waiting = scalar(settings, "SELECT count(*) FROM matcher.waits WHERE state = 'waiting'")
    return bool(counts["resolved"] == total and counts["published"] == total and waiting == 0)


_ASSIGNED = re.compile(r"partitions assigned partitions=(\S*)")
_ADMIN = re.compile(r"admin API listening address=(\S+)")
# A warning's message, without the logger's name and the key=value context after it.
_WARNING = re.compile(r" WARNING +\S+: (.*?)(?: \w+=.*)?$")


def _last_assignment(daemon: DaemonProcess) -> set[int]:
    """The partitions of this daemon's latest assignment, from its log (aiokafka's
    rebalances are eager: each assignment replaces the one before in full)."""
    found = _ASSIGNED.findall(daemon.output)
    if not found or not found[-1]:
        return set()
    return {int(name.rsplit(":", 1)[1]) for name in found[-1].split(",")}


async def _covers_all_partitions(settings: Settings, daemons: Sequence[DaemonProcess]) -> bool:
    """Every partition held by exactly one daemon, per /readyz (counts) and the logs (which
    partitions), and no daemon idle."""
    held: list[int | None] = []
    async with httpx.AsyncClient(timeout=5) as client:
        for daemon in daemons:
            address = _ADMIN.search(daemon.output)
            if address is None:
                return False
            answer = await client.get(f"{address.group(1)}/readyz")
            held.append(answer.json()["assigned_partitions"])
    sets = [_last_assignment(d) for d in daemons]
    union = set().union(*sets)
    return (
        sum(n or 0 for n in held) == settings.topic_partitions
        and all(held)
        and [len(s) for s in sets] == held
        and sum(len(s) for s in sets) == len(union)  # disjoint
        and union == set(range(settings.topic_partitions))
    )


def _check_resolutions(
    settings: Settings, plan: Plan, resumes: list[ResumeData], *, max_duplicated: int
) -> dict[str, int]:
    """Everything the scale-out promises, checked against the database and the resume
    topic. Returns the race outcomes, for the record."""
    waits = {r["correlation_id"]: r for r in rows(settings, "SELECT * FROM matcher.waits")}
    assert len(waits) == plan.total
    for correlation in plan.by_event:
        assert waits[correlation]["state"] == "matched", waits[correlation]
    for correlation in plan.timing_out:
        assert waits[correlation]["state"] == "timed_out", waits[correlation]
    for correlation in plan.racing:
        assert waits[correlation]["state"] in ("matched", "timed_out"), waits[correlation]

    # One outbox row per wait, its outcome the wait's state.
    outbox = rows(settings, "SELECT resolution_id, wait_id, outcome FROM matcher.resolutions")
    per_wait = Counter(str(r["wait_id"]) for r in outbox)
    assert per_wait == Counter({str(w["id"]): 1 for w in waits.values()})
    assert len({r["resolution_id"] for r in outbox}) == len(outbox)
    by_wait_id = {str(w["id"]): w for w in waits.values()}
    outcome_of_state = {"matched": "event", "timed_out": "timeout"}
    for row in outbox:
        assert row["outcome"] == outcome_of_state[by_wait_id[str(row["wait_id"])]["state"]]

    # Every produced event stored once; none left pending (each had a wait), and each
    # consumed by, or late for, the wait of its correlation id as that wait's state says.
    inbox = rows(
        settings,
        "SELECT producer, event_id, correlation_id, status, consumed_by, late_for"
        " FROM matcher.inbox",
    )
    stored = Counter((r["producer"], r["event_id"]) for r in inbox)
    assert stored == Counter({(e.source, e.id): 1 for e in plan.events.values()})
    stranded = scalar(
        settings,
        "SELECT count(*) FROM matcher.inbox AS i JOIN matcher.waits AS w"
        " ON w.tenant = i.tenant AND w.correlation_id = i.correlation_id"
        " WHERE i.status = 'pending' AND w.state = 'waiting'",
    )
    assert stranded == 0
    for row in inbox:
        wait = waits[row["correlation_id"]]
        if wait["state"] == "matched":
            assert (row["status"], row["consumed_by"]) == ("consumed", wait["id"]), row
            assert (wait["resolved_by_producer"], wait["resolved_by_event_id"]) == (
                row["producer"],
                row["event_id"],
            )
        else:
            assert (row["status"], row["late_for"]) == ("late", wait["id"]), row

    # The topic: every resolution published, a resolution's copies identical, and copies
    # beyond the first only where a crash allows them.
    copies = Counter(r.resolution_id for r in resumes)
    assert set(copies) == {r["resolution_id"] for r in outbox}
    duplicated = {rid: n for rid, n in copies.items() if n > 1}
    assert len(duplicated) <= max_duplicated, f"{len(duplicated)} resolutions published twice"
    first: dict[uuid.UUID, ResumeData] = {}
    for resume in resumes:
        assert first.setdefault(resume.resolution_id, resume) == resume

    # Resumes name the event that resolved the wait, and each run advances exactly once.
    advanced: Counter[str] = Counter()
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        for resume in resumes:
            wait = by_wait_id[str(resume.wait_id)]
            assert resume.outcome == outcome_of_state[wait["state"]]
            if resume.outcome == "event":
                assert resume.event is not None
                produced = plan.events[wait["correlation_id"]]
                assert (resume.event.source, resume.event.id) == (produced.source, produced.id)
            if advance(conn, resume):
                advanced[resume.run_id] += 1
    assert advanced == Counter({w["run_id"]: 1 for w in waits.values()})
    return dict(Counter(str(waits[c]["state"]) for c in plan.racing))


def _suspicious(daemons: Sequence[DaemonProcess]) -> list[str]:
    """Lines worth a look in the daemons' output: errors, tracebacks, failed loops."""
    marks = (" ERROR ", "Traceback", "loop failed", "did not stop in time")
    # aiokafka logs a commit refused by a rebalance at ERROR; ingest expects it (the batch
    # is redelivered and recognised), so it is not a fault of the daemon's.
    expected = "OffsetCommit failed for group"
    return [
        line
        for d in daemons
        for line in d.lines
        if any(m in line for m in marks) and expected not in line
    ]


def _events_summary(daemons: Sequence[DaemonProcess]) -> dict[str, Any]:
    out = "".join(d.output for d in daemons)
    return {
        "rebalances": out.count("partitions assigned"),
        "commits_refused": out.count("offset commit refused"),
        "batch_retries": out.count("batch failed"),
        # The message of each warning, without its key=value context.
        "warnings": Counter(
            m.group(1) for d in daemons for line in d.lines if (m := _WARNING.search(line))
        ),
    }


async def test_three_daemons_one_killed_one_started_mid_load(settings: Settings) -> None:
    settings = settings.model_copy(update={"relay_batch_max": RELAY_BATCH})
    total = env_flag("MATCHER_TEST_LOAD_EVENTS", 1000)
    seconds = max(8.0, total / 100)  # about 100 events a second: the kill lands mid-load
    with _daemons(settings, 3) as daemons:
        plan, start = _plan(
            settings,
            by_event=total * 7 // 10,
            timing_out=total * 2 // 10,
            racing=total // 10,
            seconds=seconds,
        )
        producing = Producing(settings, plan, start)
        load = asyncio.create_task(producing.run())
        await eventually(
            lambda: (
                producing.sent >= producing.total * 0.4
                and (scalar(settings, "SELECT count(*) FROM matcher.resolutions") or 0) > 0
            ),
            timeout=seconds + 30,
            what="40% of the events sent",
        )
        assert not load.done(), "the kill came too late to land mid-load"
        # Its partitions stay unread until the group's session timeout notices.
        daemons[0].kill()
        daemons.append(DaemonProcess(daemons[0].env))
        await asyncio.to_thread(daemons[-1].wait_ready)
        await load
        await eventually(
            lambda: _settled(settings, plan.total),
            timeout=max(60.0, total / 20),
            what="every wait resolved and published",
        )
        survivors = daemons[1:]
        # eventually() takes synchronous checks; /readyz is asked asynchronously.
        deadline = time.monotonic() + 30
        while not await _covers_all_partitions(settings, survivors):
            assert time.monotonic() < deadline, "partitions not covered:\n" + "\n".join(
                str(sorted(_last_assignment(d))) for d in survivors
            )
            await asyncio.sleep(0.2)
        for daemon in survivors:
            assert await asyncio.to_thread(daemon.terminate) == 0, daemon.output

    resumes = await read_resumes(settings, at_least=plan.total)
    races = _check_resolutions(settings, plan, resumes, max_duplicated=settings.relay_batch_max)
    duplicated = sum(1 for n in Counter(r.resolution_id for r in resumes).values() if n > 1)
    # For the record (pytest -s): how the races went, and what the daemons went through.
    print(f"races {races}; {duplicated} published twice;", _events_summary(daemons))
    # The killed daemon's output ends mid-line; the others must have run cleanly.
    assert not _suspicious(daemons[1:]), "".join(_suspicious(daemons[1:]))


async def test_relays_and_sweepers_of_several_daemons_do_not_double_publish(
    settings: Settings,
) -> None:
    settings = settings.model_copy(update={"relay_batch_max": RELAY_BATCH})
    total = env_flag("MATCHER_TEST_LOAD_EVENTS", 1000)
    seconds = max(5.0, total / 200)
    with _daemons(settings, 3) as daemons:
        plan, start = _plan(
            settings, by_event=total // 2, timing_out=total // 2, racing=0, seconds=seconds
        )
        await Producing(settings, plan, start).run()
        await eventually(
            lambda: _settled(settings, plan.total),
            timeout=max(60.0, total / 20),
            what="every wait resolved and published",
        )
        for daemon in daemons:
            assert await asyncio.to_thread(daemon.terminate) == 0, daemon.output

    resumes = await read_resumes(settings, at_least=plan.total)
    # Nobody crashed, so not even at-least-once may show: each resolution exactly once.
    _check_resolutions(settings, plan, resumes, max_duplicated=0)
    assert len(resumes) == plan.total
    published = [
        int(n) for d in daemons for n in re.findall(r"relay stopped published=(\d+)", d.output)
    ]
    print("published per relay", published, _events_summary(daemons))
    # Otherwise one relay did all the work and nothing was tested.
    assert sum(n > 0 for n in published) >= 2, published
    assert not _suspicious(daemons), "".join(_suspicious(daemons))
