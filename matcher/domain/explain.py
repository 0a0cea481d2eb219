"""Why is this run where it is? A pure verdict over facts gathered elsewhere (invariant 8).

For a resolved wait: ``resolved_by_event``, ``timed_out`` or ``cancelled``, each with the
late events that lost the race, and what became of its resume past the resume topic (not
published yet; published and not advanced, since when; advanced, when, by which
resolution). When the workers' handler failed on it, the verdict says so instead:
``worker_failing`` (attempts so far, the last error) or ``parked`` (it stopped trying:
``matcher resumes retry`` gives it back). For a waiting one, in order of precedence:

- ``backlog``: the sweeper is behind (the deadline passed, the wait still waits);
- ``mismatch``: events with this correlation id exist but differ (tenant, type, data that
  does not satisfy the wait's condition), or were refused (producer not allowed for the
  tenant, signature, schema, ...);
- ``backlog``: events are not read yet (consumer lag on a partition this wait's key can be
  on: where murmur2, CRC32 or FNV-1a puts it, the partitioners of the common clients);
- ``missing_signal``: nothing with this correlation id anywhere;
- ``waiting``: related events exist but all are accounted for (another wait took them),
  nothing is wrong, and the wait is within its deadline.

Every finding is also listed in ``reasons``, so a mismatch with a lagging partition says
both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from matcher.domain.events import QuarantinedRecord, RefusedDelivery, StoredEvent
from matcher.domain.refusals import refusal_evidence, refusals_for_the_wait
from matcher.domain.waits import Wait
from matcher.logs import quoted

# A resume older than this without being published is worth mentioning.
UNPUBLISHED_GRACE_S = 5.0

# The partitioners of the common Kafka clients, by what they hash a record's key with: an
# event keyed as matcher's producers key it (tenant, U+001F, correlation id) is on the
# partition one of these picks, whichever client sent it.
PARTITIONERS: dict[str, str] = {
    "murmur2": "murmur2 (the Java client's default; aiokafka's, kafka-python's, KafkaJS's)",
    "crc32": "CRC32 (librdkafka's default: confluent-kafka for Python, Go and .NET; kcat)",
    "fnv1a": "FNV-1a (Go Sarama's default)",
}


def rfc3339(moment: datetime, *, seconds: bool = False) -> str:
    """The one timestamp format of matcher's outputs (CLI, admin API, explain's reasons):
    RFC 3339 in UTC with a ``Z``, microseconds when there are any (as pydantic writes it),
    or whole seconds with ``seconds`` (tables)."""
    utc = moment.astimezone(UTC)
    spec = "seconds" if seconds or not utc.microsecond else "microseconds"
    return utc.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


class Verdict(StrEnum):
    RESOLVED_BY_EVENT = "resolved_by_event"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    MISSING_SIGNAL = "missing_signal"
    MISMATCH = "mismatch"
    BACKLOG = "backlog"
    WAITING = "waiting"
    WORKER_FAILING = "worker_failing"
    PARKED = "parked"


@dataclass(frozen=True)
class OutboxFacts:
    """A resolution's resume: when it was committed, and whether Kafka has acknowledged it
    (the relay keeps no time of publication: its mark is the queue row's delete)."""

    resolution_id: UUID
    created_at: datetime
    published: bool


@dataclass(frozen=True)
class WorkerFacts:
    """Past the resume topic: the run's position (matcher.runs) and the workers' failures
    on this wait's resolution (matcher.worker_failures); None where there is none."""

    run_position: int | None
    last_resolution_id: UUID | None
    advanced_at: datetime | None
    attempts: int | None
    last_error: str | None
    first_failed_at: datetime | None
    last_failed_at: datetime | None
    parked_at: datetime | None


@dataclass(frozen=True)
class ExplainFacts:
    now: datetime
    wait: Wait
    events: list[StoredEvent] = field(default_factory=list)  # same correlation id, any tenant
    quarantined: list[QuarantinedRecord] = field(default_factory=list)
    # Deliveries the ingress refused that claimed this correlation id (unverified).
    refused: list[RefusedDelivery] = field(default_factory=list)
    outbox: OutboxFacts | None = None
    # Where this wait's events land, by partitioner (a key of PARTITIONERS); empty when the
    # partition count is unknown.
    partitions: dict[str, int] = field(default_factory=dict)
    lag: dict[int, int] | None = None  # per partition; None: Kafka could not be asked
    # Why ``lag`` is None, for the reasons.
    lag_unknown_because: str = "Kafka could not be asked"
    # Since when the wait's key waits for the rematch pass; None: it does not.
    rematch_queued_since: datetime | None = None
    worker: WorkerFacts | None = None
    # The events (producer, event id) whose data does not satisfy the wait's condition.
    condition_misses: set[tuple[str, str]] = field(default_factory=set)


@dataclass
class Explanation:
    verdict: Verdict
    reasons: list[str]
    evidence: dict[str, Any]


def _event(e: StoredEvent) -> dict[str, Any]:
    return {
        "source": e.producer,
        "id": e.event_id,
        "tenant": e.tenant,
        "type": e.type,
        "status": e.status,
        "received_at": e.received_at,
        "topic": e.kafka_topic,
        "partition": e.kafka_partition,
        "offset": e.kafka_offset,
        "consumed_by": e.consumed_by,
        "late_for": e.late_for,
        "progress_for": e.progress_for,
    }


def _quarantine(q: QuarantinedRecord) -> dict[str, Any]:
    return {
        "quarantine_id": q.id,
        "reason": q.reason,
        "detail": q.detail,
        "source": q.producer,
        "id": q.event_id,
        "tenant": q.tenant,
        "type": q.type,
        "received_at": q.received_at,
        "partition": q.kafka_partition,
        "offset": q.kafka_offset,
    }


_QUARANTINE_WORDS = {
    "tenant_not_allowed": "producer {p} is not allowed to speak for tenant {t}",
    "type_not_allowed": "producer {p} is not allowed to send type {y}",
    "bad_signature": "its signature was rejected",
    "expired_timestamp": "its signature timestamp was outside the tolerance",
    "unknown_producer": "producer {p} is not registered",
    "schema_invalid": "its payload failed the JSON Schema of type {y}",
    "malformed": "it is not a valid completion event",
    "ambiguous": "it could be read more than one way (a header twice or spelled otherwise)",
    "limit_exceeded": "it was past a structural limit (nesting, headers or signatures)",
    "too_large": "it was too large",
    "undecodable": "the Kafka client could not decode it",
    "unmappable": "its body lacks what producer {p}'s mapping reads",
    "unsupported_media_type": "its content type is not one the ingress takes",
}


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else rfc3339(moment)


def _age(now: datetime, then: datetime) -> float:
    return round((now - then).total_seconds(), 3)


def explain(facts: ExplainFacts) -> Explanation:
    wait = facts.wait
    evidence: dict[str, Any] = {"wait": _wait_evidence(wait)}
    mine = {wait.id, *(c.id for c in wait.conditions or ())}  # a fan-in wait's conditions
    late = [e for e in facts.events if e.late_for in mine]
    if late:
        evidence["late_events"] = [_event(e) for e in late]
    if wait.state != "waiting":
        return _resolved(facts, evidence, late)
    found = _Findings(evidence)
    # In order of precedence: the first verdict found is the verdict.
    _sweeper_behind(facts, found)
    _rematch_pending(facts, found)
    _mismatches(facts, found)
    _lag_on_key_partitions(facts, found)
    _arrivals(facts, late, found)
    _heartbeat(facts, found)
    _fan_in(facts, found)
    if not found.verdicts:
        within = (
            f"within its deadline ({rfc3339(wait.deadline)})" if wait.deadline else "no deadline"
        )
        found.add(Verdict.WAITING, f"waiting, {within}; nothing is wrong")
    return Explanation(found.verdicts[0], found.reasons, evidence)


@dataclass
class _Findings:
    """What explain found about a waiting wait so far: verdicts in order of precedence,
    every reason (a verdict's and the ones that are only worth saying), the evidence."""

    evidence: dict[str, Any]
    reasons: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)

    def add(self, verdict: Verdict | None, reason: str) -> None:
        self.reasons.append(reason)
        if verdict is not None:
            self.verdicts.append(verdict)


def _wait_evidence(wait: Wait) -> dict[str, Any]:
    return {
        "id": wait.id,
        "tenant": wait.tenant,
        "run_id": wait.run_id,
        "position": wait.position,
        "event_types": wait.event_types,
        "correlation_id": wait.correlation_id,
        "external_job_id": wait.external_job_id,
        "deadline": wait.deadline,
        "state": wait.state,
        "created_at": wait.created_at,
        "resolved_at": wait.resolved_at,
        **({"condition": wait.condition} if wait.condition else {}),
        **(
            {
                "progress_types": wait.progress_types,
                "heartbeat_interval_s": wait.heartbeat_interval_s,
                "heartbeat_due": wait.heartbeat_due,
                "last_progress_at": wait.last_progress_at,
            }
            if wait.heartbeat_interval_s
            else {}
        ),
    }


def _sweeper_behind(facts: ExplainFacts, found: _Findings) -> None:
    deadline = facts.wait.deadline
    due = facts.wait.heartbeat_due
    if due is not None and due <= facts.now and (deadline is None or due < deadline):
        behind = _age(facts.now, due)
        found.evidence["sweeper_behind_s"] = behind
        found.add(
            Verdict.BACKLOG,
            f"its heartbeat came due {behind}s ago but the sweeper has not timed it out",
        )
    elif deadline is not None and deadline <= facts.now:
        behind = _age(facts.now, deadline)
        found.evidence["sweeper_behind_s"] = behind
        found.add(
            Verdict.BACKLOG,
            f"the deadline passed {behind}s ago but the sweeper has not timed it out",
        )


def _rematch_pending(facts: ExplainFacts, found: _Findings) -> None:
    if facts.rematch_queued_since is None:
        return
    wait = facts.wait
    queued = max(0.0, _age(facts.now, facts.rematch_queued_since))
    found.evidence["rematch_queued_s"] = queued
    matching = [
        e
        for e in facts.events
        if e.status == "pending" and e.tenant == wait.tenant and e.type in wait.event_types
    ]
    if matching:  # only then is the pass what the wait is waiting for
        found.add(
            Verdict.BACKLOG,
            f"{len(matching)} stored event(s) match, but the wait has not been checked "
            f"against stored events yet: queued for the daemon's rematch pass {queued}s ago",
        )


def _mismatches(facts: ExplainFacts, found: _Findings) -> None:
    mismatches = [*_event_mismatches(facts, found), *_quarantined(facts, found)]
    _refused(facts, found)
    if mismatches:
        found.evidence["mismatches"] = mismatches
        found.verdicts.append(Verdict.MISMATCH)


def _event_mismatches(facts: ExplainFacts, found: _Findings) -> list[dict[str, Any]]:
    wait = facts.wait
    mismatches: list[dict[str, Any]] = []
    for e in facts.events:
        if e.consumed_by is not None or e.late_for is not None or e.progress_for is not None:
            continue  # accounted for by some wait
        if e.tenant != wait.tenant:
            found.add(
                None,
                f"event {e.producer}/{e.event_id} has this correlation id but tenant "
                f"{quoted(e.tenant)}, not {quoted(wait.tenant)}",
            )
            mismatches.append({**_event(e), "differs": "tenant"})
        elif e.type not in wait.event_types:
            found.add(
                None,
                f"event {e.producer}/{e.event_id} has type {quoted(e.type)}; the wait accepts "
                f"{', '.join(wait.event_types)}",
            )
            mismatches.append({**_event(e), "differs": "type"})
        elif (e.producer, e.event_id) in facts.condition_misses:
            found.add(
                None,
                f"event {e.producer}/{e.event_id} has the type, but its data does not satisfy "
                f"the wait's condition {quoted(wait.condition or '')}",
            )
            mismatches.append({**_event(e), "differs": "condition", "data": e.data})
    return mismatches


def _fan_in(facts: ExplainFacts, found: _Findings) -> None:
    wait = facts.wait
    if wait.needed is None or not wait.conditions:
        return
    met = [c for c in wait.conditions if c.state == "matched"]
    open_ = [c for c in wait.conditions if c.state == "waiting"]
    rule = (
        "all"
        if wait.needed == len(wait.conditions)
        else "any"
        if wait.needed == 1
        else f"at least {wait.needed}"
    )
    waiting_for = "; ".join(
        f"{', '.join(c.event_types)} on {quoted(c.correlation_id)}" for c in open_
    )
    found.evidence["conditions"] = [c.model_dump() for c in wait.conditions]
    found.add(
        None,
        f"{len(met)} of {len(wait.conditions)} conditions met ({rule} needed): waiting for "
        f"{waiting_for} since {rfc3339(wait.created_at)}",
    )


def _heartbeat(facts: ExplainFacts, found: _Findings) -> None:
    wait = facts.wait
    if wait.heartbeat_due is None:
        return
    progress = [e for e in facts.events if e.progress_for == wait.id]
    last = f"last progress at {_when(wait.last_progress_at)}" if progress else "no progress yet"
    found.add(
        None,
        f"heartbeat every {wait.heartbeat_interval_s:g}s on "
        f"{', '.join(wait.progress_types or [])}: {len(progress)} progress event(s), {last}; "
        f"times out at {rfc3339(wait.heartbeat_due)} without one",
    )


def _quarantined(facts: ExplainFacts, found: _Findings) -> list[dict[str, Any]]:
    mismatches: list[dict[str, Any]] = []
    for q in facts.quarantined:
        if q.replayed_at is not None:
            continue
        words = _QUARANTINE_WORDS.get(q.reason, q.reason).format(
            p=quoted(q.producer), t=quoted(q.tenant), y=quoted(q.type)
        )
        found.add(
            None,
            f"a message with this correlation id (partition {q.kafka_partition}, offset "
            f"{q.kafka_offset}) was quarantined (#{q.id}, {q.reason}): {words}",
        )
        mismatches.append({**_quarantine(q), "differs": q.reason})
    return mismatches


def _refused(facts: ExplainFacts, found: _Findings) -> None:
    """The ingress's refusals claiming this correlation id: reasons and evidence, never a
    verdict. What they claim is unverified (anyone can post a bad signature with a body
    naming any correlation id), so they can only say why nothing has arrived."""
    refused = refusals_for_the_wait(facts.refused, facts.wait.tenant)
    if not refused:
        return
    found.evidence["refusals"] = [refusal_evidence(r) for r in refused]
    if facts.events or facts.quarantined:
        for r in refused:
            found.add(None, _refusal_words(r))


def _refusal_words(r: RefusedDelivery) -> str:
    words = _QUARANTINE_WORDS.get(r.reason, r.reason).format(
        p=quoted(r.producer), t=quoted(r.claimed_tenant), y=quoted(r.claimed_type)
    )
    more = f" ({r.kind_count} such refusals)" if r.kind_count > 1 else ""
    return (
        f"a {r.via} delivery claiming this correlation id was refused by the ingress "
        f"(refusal #{r.id}, {r.reason}, HTTP {r.http_status}, at {rfc3339(r.received_at)})"
        f"{more}: {words}; {r.detail} (unverified)"
    )


def _lag_on_key_partitions(facts: ExplainFacts, found: _Findings) -> None:
    lag = facts.lag
    if lag is None:
        found.add(None, f"consumer lag unknown: {facts.lag_unknown_because}")
    else:
        found.evidence["consumer_lag"] = {str(p): n for p, n in sorted(lag.items())}
    if not facts.partitions:
        return
    by_partition: dict[int, list[str]] = {}
    for partitioner, partition in facts.partitions.items():
        by_partition.setdefault(partition, []).append(partitioner)
    found.evidence["key_partitions"] = [
        {
            "partition": partition,
            "partitioners": names,
            "lag": None if lag is None else lag.get(partition, 0),
        }
        for partition, names in sorted(by_partition.items())
    ]
    for partition, names in sorted(by_partition.items()):
        behind = 0 if lag is None else lag.get(partition, 0)
        if behind > 0:
            which = " and ".join(PARTITIONERS.get(n, n) for n in names)
            verb = "puts" if len(names) == 1 else "put"
            found.add(
                Verdict.BACKLOG,
                f"consumer lag on partition {partition}, where {which} {verb} this "
                f"wait's key: {behind} message(s) not yet read",
            )


def _arrivals(facts: ExplainFacts, late: list[StoredEvent], found: _Findings) -> None:
    related = [e for e in facts.events if e not in late]
    if not facts.events and not facts.quarantined:
        ids = sorted(
            {facts.wait.correlation_id, *(c.correlation_id for c in facts.wait.conditions or ())}
        )
        refused = refusals_for_the_wait(facts.refused, facts.wait.tenant)
        found.add(
            Verdict.MISSING_SIGNAL,
            f"nothing with correlation id {' or '.join(quoted(i) for i in ids)} has arrived"
            + (": only deliveries the ingress refused claimed it" if refused else ""),
        )
        for r in refused:  # why nothing has: the hint, and the verdict stays
            found.add(None, _refusal_words(r))
    elif related:
        found.evidence["related_events"] = [_event(e) for e in related]


def _resolved(
    facts: ExplainFacts, evidence: dict[str, Any], late: list[StoredEvent]
) -> Explanation:
    wait = facts.wait
    reasons: list[str] = []
    if wait.state == "matched":
        verdict = Verdict.RESOLVED_BY_EVENT
        winner = next(
            (
                e
                for e in facts.events
                if (e.producer, e.event_id)
                == (wait.resolved_by_producer, wait.resolved_by_event_id)
            ),
            None,
        )
        where = ""
        if winner is not None and winner.kafka_partition is None:  # a callback's: no Kafka
            where = f" (received {rfc3339(winner.received_at)})"
        elif winner is not None:
            where = (
                f" (partition {winner.kafka_partition}, offset {winner.kafka_offset}, received "
                f"{rfc3339(winner.received_at)})"
            )
        reasons.append(
            f"resolved by event {wait.resolved_by_producer}/{wait.resolved_by_event_id}{where}"
        )
        evidence["event"] = (
            _event(winner)
            if winner
            else {"source": wait.resolved_by_producer, "id": wait.resolved_by_event_id}
        )
    elif wait.state == "timed_out" and wait.resolution == "heartbeat":
        verdict = Verdict.TIMED_OUT
        reasons.append(
            f"timed out at {_when(wait.resolved_at)}: its heartbeat was missed (no progress "
            f"for {wait.heartbeat_interval_s:g}s; last progress at "
            f"{_when(wait.last_progress_at)}; deadline {_when(wait.deadline)})"
        )
    elif wait.state == "timed_out":
        verdict = Verdict.TIMED_OUT
        reasons.append(f"timed out at {_when(wait.resolved_at)} (deadline {_when(wait.deadline)})")
    else:
        verdict = Verdict.CANCELLED
        reasons.append(f"cancelled at {_when(wait.resolved_at)}")
    for e in late:
        reasons.append(
            f"event {e.producer}/{e.event_id} came late ({rfc3339(e.received_at)}) and was "
            "kept for investigation"
        )
    verdict = _past_the_topic(facts, evidence, reasons) or verdict
    return Explanation(verdict, reasons, evidence)


def _past_the_topic(
    facts: ExplainFacts, evidence: dict[str, Any], reasons: list[str]
) -> Verdict | None:
    """What became of a resolved wait's resume: published or not, advanced or not, or a
    worker's handler failing on it (then the verdict)."""
    outbox = facts.outbox
    if outbox is None:
        return None
    resume: dict[str, Any] = {
        "resolution_id": outbox.resolution_id,
        "published": outbox.published,
    }
    evidence["resume"] = resume
    if not outbox.published:
        age = _age(facts.now, outbox.created_at)
        if age >= UNPUBLISHED_GRACE_S:
            reasons.append(
                f"its resume has not been published for {age}s (relay behind or Kafka unavailable)"
            )
            resume["unpublished_for_s"] = age
    worker = facts.worker
    if worker is None:
        return None
    wait = facts.wait
    if worker.run_position is not None and worker.run_position > wait.position:
        consumed = " (this resolution)" if worker.last_resolution_id == outbox.resolution_id else ""
        reasons.append(
            f"the run advanced past position {wait.position}"
            + (f" at {rfc3339(worker.advanced_at)}" if worker.advanced_at else "")
            + f": now at {worker.run_position}, by resolution {worker.last_resolution_id}"
            + consumed
        )
        resume["advanced"] = {
            "at": worker.advanced_at,
            "run_position": worker.run_position,
            "resolution_id": worker.last_resolution_id,
        }
        return None
    return _worker_failures(facts, worker, outbox, resume, reasons)


def _worker_failures(
    facts: ExplainFacts,
    worker: WorkerFacts,
    outbox: OutboxFacts,
    resume: dict[str, Any],
    reasons: list[str],
) -> Verdict | None:
    if worker.attempts is None:
        if outbox.published:
            waited = _age(facts.now, outbox.created_at)
            reasons.append(
                f"published, not advanced by a worker yet ({waited}s since it was committed "
                f"at {rfc3339(outbox.created_at)})"
            )
            resume["not_advanced_for_s"] = waited
        return None
    resume["worker"] = {
        "attempts": worker.attempts,
        "last_error": worker.last_error,
        "first_failed_at": worker.first_failed_at,
        "last_failed_at": worker.last_failed_at,
        "parked_at": worker.parked_at,
    }
    error = quoted((worker.last_error or "")[:300])
    if worker.parked_at is not None:
        reasons.append(
            f"parked at {rfc3339(worker.parked_at)} after {worker.attempts} failed "
            f"attempt(s) of the workers' handler (last error: {error}); after fixing it, "
            f"`matcher resumes retry --wait {facts.wait.id}` gives it back"
        )
        return Verdict.PARKED
    reasons.append(
        f"the workers' handler failed {worker.attempts} time(s) on its resume (last at "
        f"{_when(worker.last_failed_at)}: {error}); it is tried again"
    )
    return Verdict.WORKER_FAILING
