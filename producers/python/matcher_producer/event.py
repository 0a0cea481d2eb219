"""Completion events as CloudEvents 1.0 in the Kafka protocol binding."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True)
class CompletionEvent:
    source: str  # the producer, as registered with matcher
    type: str  # e.g. job.completed
    tenant: str
    correlation_id: str  # what the waiting run registered
    data: Any = None  # JSON-serialisable
    job_id: str | None = None  # the external job's id (several events may share it)
    id: str = field(default_factory=lambda: str(uuid.uuid4()))  # unique per source
    time: datetime = field(default_factory=lambda: datetime.now(UTC))

    def attributes(self) -> dict[str, str]:
        attrs = {
            "specversion": "1.0",
            "id": self.id,
            "source": self.source,
            "type": self.type,
            "tenant": self.tenant,
            "correlationid": self.correlation_id,
            "time": self.time.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        }
        if self.job_id is not None:
            attrs["jobid"] = self.job_id
        return attrs


@dataclass(frozen=True)
class KafkaRecord:
    key: bytes
    headers: list[tuple[str, bytes]]
    value: bytes


def encode(event: CompletionEvent, *, structured: bool = False) -> KafkaRecord:
    """The unsigned Kafka record. Key: tenant + correlation id, so one wait's events
    keep their order on one partition."""
    key = f"{event.tenant}\x1f{event.correlation_id}".encode()
    if structured:
        envelope: dict[str, Any] = {
            **event.attributes(),
            "datacontenttype": "application/json",
            "data": event.data,
        }
        return KafkaRecord(
            key,
            [("content-type", b"application/cloudevents+json")],
            json.dumps(envelope, separators=(",", ":")).encode(),
        )
    headers = [(f"ce_{name}", value.encode()) for name, value in event.attributes().items()]
    headers.append(("content-type", b"application/json"))
    return KafkaRecord(key, headers, json.dumps(event.data, separators=(",", ":")).encode())
