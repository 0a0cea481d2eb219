"""What a batch of new events does to the waits of their keys. Pure: no I/O.

The rules (the same ones registration applies from the other side):
- an event and a wait match when tenant and correlation id are equal, the event's type
  is one of the wait's types, and the event's data satisfies the wait's condition if it
  has one (Postgres evaluates conditions: the event arrives with the waits that refuse it);
- duplicates, by (producer, event id), do nothing: not against stored events, not within
  the batch;
- events are taken in order of arrival; each resolves the oldest waiting wait it matches
  that no earlier event took; one event resolves at most one wait, one wait is resolved
  by at most one event;
- an event that matches no waiting wait but is of a progress type of one (waiting when
  the batch began) is *progress*, linked to the oldest such wait (whose heartbeat it
  moves on); it resolves nothing;
- an event that matches no waiting wait but matches (or is of a progress type of) a wait
  that timed out or was cancelled is *late*, linked to the most recently resolved such
  wait;
- anything else stays *pending* for a wait that may be registered later;
- a fan-in wait's condition matches as a wait does, while its wait still needs
  conditions (``needs``): an "any" wait met, its other conditions take nothing more;
- an event whose key is *deferred* stays pending here: the rematch loop decides it, with
  the same rules, once the key is free (its waits were busy, or not yet checked against
  the stored events).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from matcher.domain.waits import WaitState

Key = tuple[str, str]  # (tenant, correlation id)
EventKey = tuple[str, str]  # (producer, event id)


class InboxStatus(StrEnum):
    PENDING = "pending"
    CONSUMED = "consumed"
    LATE = "late"
    EXPIRED = "expired"
    PROGRESS = "progress"


@dataclass(frozen=True)
class NewEvent:
    """An event that passed validation, in arrival order within its batch."""

    producer: str
    event_id: str
    tenant: str
    type: str
    correlation_id: str
    # Carried through untouched for the adapter that stores the decision.
    payload: Any = field(default=None, compare=False, repr=False)
    # The waits whose condition this event's data does not satisfy.
    refused_by: frozenset[UUID] = field(default=frozenset(), compare=False)

    @property
    def key(self) -> Key:
        return (self.tenant, self.correlation_id)

    @property
    def event_key(self) -> EventKey:
        return (self.producer, self.event_id)


@dataclass(frozen=True)
class WaitView:
    """The part of a stored wait that matching looks at."""

    id: UUID
    tenant: str
    correlation_id: str
    event_types: frozenset[str]
    state: WaitState
    created_at: datetime
    resolved_at: datetime | None = None
    progress_types: frozenset[str] = frozenset()
    group_id: UUID | None = None  # a fan-in wait's condition: that wait

    @property
    def key(self) -> Key:
        return (self.tenant, self.correlation_id)

    def accepts(self, event: NewEvent) -> bool:
        return (
            event.key == self.key
            and event.type in self.event_types
            and self.id not in event.refused_by
        )

    def hears(self, event: NewEvent) -> bool:
        """Whether ``event`` reports progress on this wait."""
        return event.key == self.key and event.type in self.progress_types


@dataclass(frozen=True)
class Placement:
    """Where one new event goes: its inbox status and the wait it is linked to."""

    event: NewEvent
    status: InboxStatus
    wait_id: UUID | None = None  # consumed_by, late_for or progress_for, by status


@dataclass
class BatchDecision:
    placements: list[Placement] = field(default_factory=list)
    duplicates: list[NewEvent] = field(default_factory=list)

    @property
    def resolutions(self) -> list[Placement]:
        return [p for p in self.placements if p.status is InboxStatus.CONSUMED]

    @property
    def progress(self) -> list[Placement]:
        return [p for p in self.placements if p.status is InboxStatus.PROGRESS]


_RESOLVED_NOT_MATCHED = (WaitState.TIMED_OUT, WaitState.CANCELLED)


def decide_batch(
    events: Sequence[NewEvent],
    stored: Iterable[EventKey],
    waits: Iterable[WaitView],
    deferred: Collection[Key] = (),
    needs: Mapping[UUID, int] | None = None,
) -> BatchDecision:
    """Decide what each event of a batch does, given what is already stored.

    ``stored`` holds the (producer, event id) pairs of the batch already in the inbox;
    ``waits`` holds every wait (any state) on the batch's keys; events of ``deferred``
    keys are only stored (pending), their matching left for later; ``needs`` holds how
    many more conditions each fan-in wait (of the conditions among ``waits``) needs.
    """
    still_needed = dict(needs or {})
    seen: set[EventKey] = set(stored)
    waiting: dict[Key, list[WaitView]] = defaultdict(list)
    finished: dict[Key, list[WaitView]] = defaultdict(list)
    for wait in waits:
        if wait.state is WaitState.WAITING:
            waiting[wait.key].append(wait)
        elif wait.state in _RESOLVED_NOT_MATCHED:
            finished[wait.key].append(wait)
    for key_waits in waiting.values():
        key_waits.sort(key=lambda w: (w.created_at, str(w.id)))
    listening = {key: list(key_waits) for key, key_waits in waiting.items()}

    decision = BatchDecision()
    for event in events:
        if event.event_key in seen:
            decision.duplicates.append(event)
            continue
        seen.add(event.event_key)
        if event.key in deferred:
            decision.placements.append(Placement(event, InboxStatus.PENDING))
            continue
        candidates = waiting.get(event.key, [])
        taken = next(
            (
                w
                for w in candidates
                if w.accepts(event) and (w.group_id is None or still_needed.get(w.group_id, 0) > 0)
            ),
            None,
        )
        if taken is not None:
            candidates.remove(taken)
            if taken.group_id is not None:
                still_needed[taken.group_id] -= 1
            decision.placements.append(Placement(event, InboxStatus.CONSUMED, taken.id))
            continue
        # Progress goes to a wait that was waiting when the batch began, even if an
        # earlier event of the batch resolved it (ingest decides a key in one statement).
        heard = next((w for w in listening.get(event.key, []) if w.hears(event)), None)
        if heard is not None:
            decision.placements.append(Placement(event, InboxStatus.PROGRESS, heard.id))
            continue
        late_for = [w for w in finished.get(event.key, []) if w.accepts(event) or w.hears(event)]
        if late_for:
            latest = max(late_for, key=lambda w: (w.resolved_at or w.created_at, str(w.id)))
            decision.placements.append(Placement(event, InboxStatus.LATE, latest.id))
        else:
            decision.placements.append(Placement(event, InboxStatus.PENDING))
    return decision
