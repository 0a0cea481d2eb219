"""A wait's timeline: registered, every related event and quarantined record with what
became of it, the resolution, the resume, and the run advancing; and the links to the
records the wait's key brought (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from matcher.admin.console.render import url
from matcher.domain.events import QuarantinedRecord, StoredEvent
from matcher.domain.explain import ExplainFacts
from matcher.domain.refusals import refusals_for_the_wait
from matcher.domain.waits import Wait
from matcher.logs import quoted
from matcher.store.browsing import RunRecord

_PRODUCER_REASONS = {"tenant_not_allowed", "type_not_allowed", "unknown_producer"}


@dataclass(frozen=True)
class Entry:
    at: datetime | None
    what: str  # a short code: registered, matched, mismatched_tenant, quarantined, late, ...
    text: str
    where: str = ""  # Kafka topic/partition/offset
    producer: str = ""
    event_id: str = ""
    href: str = ""  # where the record it speaks of is shown


@dataclass(frozen=True)
class Related:
    """A record the wait's key brought, linked to where the console shows it."""

    kind: str  # "event", "quarantined", "refused"
    text: str
    href: str


def _where(topic: str | None, partition: int | None, offset: int | None) -> str:
    if topic is None and partition is None:
        return ""
    return f"{topic}/{partition}/{offset}"


def event_status(wait: Wait, e: StoredEvent) -> str:
    """What this event is to this wait."""
    if e.consumed_by == wait.id:
        return "matched"
    if e.late_for == wait.id:
        return "late"
    if e.consumed_by is not None or e.late_for is not None:
        return "taken_by_another_wait"
    if e.tenant != wait.tenant:
        return "mismatched_tenant"
    if e.type not in wait.event_types:
        return "mismatched_type"
    return "matching" if e.status == "pending" else e.status


def _event(wait: Wait, e: StoredEvent) -> Entry:
    status = event_status(wait, e)
    text = f"event of type {quoted(e.type)}, tenant {quoted(e.tenant)} (inbox status {e.status})"
    where = _where(e.kafka_topic, e.kafka_partition, e.kafka_offset)
    return Entry(e.received_at, status, text, where, e.producer, e.event_id)


def _quarantined(q: QuarantinedRecord) -> Entry:
    what = "mismatched_producer" if q.reason in _PRODUCER_REASONS else "quarantined"
    text = f"quarantined #{q.id} ({q.reason}): {q.detail or ''}"
    if q.replayed_at is not None:
        text += f" (replayed: {q.replay_result})"
    where = _where(q.kafka_topic, q.kafka_partition, q.kafka_offset)
    return Entry(
        q.received_at, what, text, where, q.producer or "", q.event_id or "", _record_link(q)
    )


def _record_link(q: QuarantinedRecord) -> str:
    """The quarantine page filtered to the record's correlation id, the record targeted
    (highlighted)."""
    return url("/console/quarantine", correlation_id=q.correlation_id) + f"#q-{q.id}"


def related(facts: ExplainFacts) -> list[Related]:
    """The stored events and quarantined records of the wait's correlation id, each with
    a link to its page: the records explain's reasons speak of ("quarantined (#10, ...)")."""
    found: list[Related] = []
    if facts.events:
        count = len(facts.events)
        found.append(
            Related(
                "event",
                f"{count} stored event{'s' if count != 1 else ''} with correlation id "
                f"{facts.wait.correlation_id}",
                url("/console/events", correlation_id=facts.wait.correlation_id),
            )
        )
    for q in facts.quarantined:
        text = f"quarantined #{q.id} ({q.reason})"
        if q.replayed_at is not None:
            text += f", replayed: {q.replay_result}"
        found.append(Related("quarantined", text, _record_link(q)))
    for r in refusals_for_the_wait(facts.refused, facts.wait.tenant):
        text = (
            f"refused by the ingress #{r.id} ({r.reason}, HTTP {r.http_status}; unverified claim)"
        )
        href = url("/console/refusals", correlation_id=r.claimed_correlation_id) + f"#r-{r.id}"
        found.append(Related("refused", text, href))
    return found


def _resolution(wait: Wait) -> list[Entry]:
    if wait.resolved_at is None:
        return []
    if wait.resolution == "event":
        text = f"resolved by event {wait.resolved_by_producer}/{wait.resolved_by_event_id}"
    elif wait.resolution == "deadline":
        text = "timed out at its deadline"
    else:
        text = "cancelled"
    return [Entry(wait.resolved_at, f"resolved_{wait.resolution}", text)]


def _resume_and_progress(wait: Wait, record: RunRecord) -> list[Entry]:
    entries: list[Entry] = []
    resume = record.resume
    if resume is not None:
        published = "published" if resume["published"] else "not published yet"
        entries.append(
            Entry(resume["created_at"], "resume_queued", f"resume committed; {published}")
        )
    progress = record.progress
    if progress is not None and (
        progress["position"] > wait.position
        or (resume is not None and progress["last_resolution_id"] == resume["resolution_id"])
    ):
        entries.append(
            Entry(
                progress["updated_at"],
                "advanced",
                f"the run advanced to position {progress['position']} ({progress['status']})",
            )
        )
    return entries


def timeline(facts: ExplainFacts, record: RunRecord) -> list[Entry]:
    wait = facts.wait
    entries = [Entry(wait.created_at, "registered", f"wait registered for {wait.event_types}")]
    entries += [_event(wait, e) for e in facts.events]
    entries += [_quarantined(q) for q in facts.quarantined]
    entries += _resolution(wait)
    entries += _resume_and_progress(wait, record)
    first = wait.created_at
    return sorted(entries, key=lambda e: (e.at or first, e.what != "registered"))
