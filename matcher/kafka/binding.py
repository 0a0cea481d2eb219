"""Kafka records as the gate reads them: header names as bytes, and the arrival time.

A record's arrival is the broker's ``LogAppendTime`` when the topic keeps that (``matcher
migrate`` creates event topics so): set by the broker, it cannot be chosen by a producer,
and it does not move when matcher reads late (after an outage, behind lag). A
``CreateTime`` timestamp is the producer's claim, worth nothing against replay, so for
such a record the time matcher reads it stands in (and a backlog longer than the
signature tolerance then expires valid events: the daemon warns at start).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from matcher.domain.records import Header, RawRecord

LOG_APPEND_TIME = 1  # the record batch attribute bit, as aiokafka reports it


class KafkaMessage(Protocol):
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str | bytes, bytes | None]]: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def timestamp_type(self) -> int: ...


def arrival(message: KafkaMessage, read_at: datetime) -> datetime:
    """When ``message`` reached the broker, as far as can be trusted (see the module)."""
    if message.timestamp_type == LOG_APPEND_TIME and message.timestamp >= 0:
        return datetime.fromtimestamp(message.timestamp / 1000, UTC)
    return read_at


# Header names repeat from record to record: their bytes are remembered (up to a bound,
# the names being the sender's choice).
_NAME_BYTES: dict[str, bytes] = {}
_NAME_BYTES_MAX = 4096


def _name_bytes(name: str | bytes) -> bytes:
    if isinstance(name, bytes):
        return name
    found = _NAME_BYTES.get(name)
    if found is None:
        found = name.encode()  # aiokafka decoded it (it refuses names that are not UTF-8)
        if len(_NAME_BYTES) < _NAME_BYTES_MAX:
            _NAME_BYTES[name] = found
    return found


def header_bytes(headers: Sequence[tuple[str | bytes, bytes | None]]) -> tuple[Header, ...]:
    return tuple([(_name_bytes(name), value) for name, value in headers])


def raw_record(message: KafkaMessage, read_at: datetime) -> RawRecord:
    return RawRecord(
        key=message.key,
        headers=header_bytes(message.headers or ()),
        value=message.value,
        arrived_at=arrival(message, read_at),
    )
