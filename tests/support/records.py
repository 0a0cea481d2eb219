"""Events and records built for tests, and the gate's verdict on them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from matcher.auth.gate import judge
from matcher.auth.policy import Policy
from matcher.auth.registry import Registry
from matcher.domain.events import CompletionEvent, Rejection
from matcher.domain.records import IngestRecord, RawRecord
from tests.support.kafka import to_record


def event(
    tenant: str = "acme",
    correlation: str | None = None,
    type_: str = "job.completed",
    *,
    source: str = "billing",
    event_id: str | None = None,
    job_id: str | None = None,
    data: Any = None,
) -> CompletionEvent:
    return CompletionEvent(
        id=event_id or str(uuid.uuid4()),
        source=source,
        type=type_,
        tenant=tenant,
        correlationid=correlation or str(uuid.uuid4()),
        jobid=job_id,
        data=data if data is not None else {"ok": True},
    )


class RawHeaderName(str):
    """A header name that is not UTF-8, for producing hostile records: aiokafka's
    pure-Python record batch builder writes a name as ``name.encode("utf-8")``, and this
    str answers that with the raw bytes."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawHeaderName:
        name = super().__new__(cls, raw.decode("latin-1"))
        name.raw = raw
        return name

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


UNSIGNED = Policy(require_signatures=False)


def parse_record(
    headers: Sequence[tuple[str | bytes, bytes | None]],
    key: bytes | None,
    value: bytes | None,
    *,
    policy: Policy = UNSIGNED,
    registry: Registry | None = None,
    arrived_at: datetime | None = None,
) -> CompletionEvent | Rejection:
    """The gate's verdict on (key, headers, value): unsigned records allowed by default."""
    return judge(raw(headers, key, value, arrived_at), registry or Registry(), policy)


def raw(
    headers: Sequence[tuple[str | bytes, bytes | None]],
    key: bytes | None,
    value: bytes | None,
    arrived_at: datetime | None = None,
) -> RawRecord:
    names = tuple((n.encode() if isinstance(n, str) else n, v) for n, v in headers)
    return RawRecord(key, names, value, arrived_at or datetime.now(UTC))


def ingest_record(e: CompletionEvent, offset: int, topic: str = "t") -> IngestRecord:
    """``e`` as ingest sees it after parsing: for tests that call ``store_batch`` directly."""
    key, headers, value = to_record(e)
    record = raw(headers, key, value)
    parsed = judge(record, Registry(), UNSIGNED)
    return IngestRecord(topic, 0, offset, key, value, record.headers, parsed, record.arrived_at)
