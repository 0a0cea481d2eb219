"""Records as the gate and the loops hand them on: a transport's record, and the same
record judged (an accepted event or a rejection), with where it was read.

Plain data, shared by the gate (``matcher.auth``), the Kafka side, the store and the
daemon's loops: the types of the data path live below all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from matcher.domain.events import CompletionEvent, Rejection

Header = tuple[bytes, bytes | None]  # a name and a value as received, both bytes


@dataclass(frozen=True)
class RawRecord:
    """A record as its transport delivered it, and when it reached that transport.

    ``arrived_at`` is the broker's append time for Kafka (``LogAppendTime`` topics), the
    request's arrival for HTTP: the honest time to judge a signature's freshness against.
    """

    key: bytes | None
    headers: tuple[Header, ...]
    value: bytes | None
    arrived_at: datetime


@dataclass(frozen=True)
class IngestRecord:
    """One record of a batch, where it was read, and what the gate made of it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    parsed: CompletionEvent | Rejection
    arrived_at: datetime | None = None  # what freshness was judged against
