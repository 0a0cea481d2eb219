"""Completion events as matcher understands them, after parsing and validation."""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

# Deep enough for any real job result, shallow enough that nothing downstream recurses far.
MAX_JSON_DEPTH = 64

# A lone surrogate comes only from a \\uD800-\\uDFFF escape in JSON: no UTF-8 decodes to one.
_UNSTORABLE_CHAR = re.compile("[\x00\ud800-\udfff]")


def _char_problem(char: str) -> str:
    if char == "\x00":
        return "a NUL character (\\u0000), which Postgres text cannot hold"
    return f"a lone surrogate (\\u{ord(char):04x}), which is not Unicode text"


# An identifier's bound in bytes: two of them and a timestamp make an index entry, which
# Postgres refuses past 2704 bytes (that would fail a whole batch).
MAX_IDENT_BYTES = 512


def _storable_text(value: str) -> str:
    # Refused here, where the reason can be given, rather than by Postgres for a whole batch.
    if value.isascii() and len(value) <= MAX_IDENT_BYTES and "\x00" not in value:
        return value  # the common case, decided without a regex or an encode
    found = _UNSTORABLE_CHAR.search(value)
    if found is not None:
        raise ValueError(f"must not contain {_char_problem(found.group())}")
    if len(value.encode()) > MAX_IDENT_BYTES:
        raise ValueError(f"must be at most {MAX_IDENT_BYTES} bytes (UTF-8)")
    return value


# The largest value of a bigint column (positions, quarantine ids): a larger number given
# to one is refused here, not by Postgres in the middle of a write.
BIGINT_MAX = 2**63 - 1

# Identifiers are free text, but bounded, never empty or whitespace-only, never NUL.
Ident = Annotated[
    str,
    StringConstraints(min_length=1, max_length=512, pattern=r"\S"),
    AfterValidator(_storable_text),
]


def unstorable(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``value`` cannot be stored as jsonb, or None. (What jsonb stores reads back with
    the same meaning; numbers in its own form: 1e2 as 100, -0.0 as 0.)

    Iterative, so the depth bound is this one, not the interpreter's recursion limit.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            found = _UNSTORABLE_CHAR.search(item)
            if found is not None:
                return _char_problem(found.group())
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "a non-finite number (NaN or Infinity)"
        elif isinstance(item, dict | list):
            if depth > max_depth:
                return f"nesting deeper than {max_depth} levels"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif not isinstance(item, int | bool) and item is not None:
            return f"a value of type {type(item).__name__}"
    return None


# Validation context key: the data comes from matcher.auth.strict_json, checked already.
DATA_READ_STRICTLY = "data_read_strictly"


class CompletionEvent(BaseModel):
    """A CloudEvent 1.0 announcing that an external job reached a state.

    ``source`` names the producer, ``id`` is unique per producer (the dedupe key),
    ``tenant`` and ``correlationid`` say which wait it is for, ``jobid`` is the external
    job's id (informational: several events may share it).
    """

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    specversion: str = Field(default="1.0", pattern=r"^1\.0$")
    id: Ident
    source: Ident
    type: Ident
    tenant: Ident
    correlationid: Ident
    jobid: Ident | None = None
    time: datetime | None = None
    datacontenttype: str | None = None
    data: Any = None

    @field_validator("data")
    @classmethod
    def _data_fits_jsonb(cls, value: Any, info: ValidationInfo) -> Any:
        if info.context is not None and info.context.get(DATA_READ_STRICTLY):
            return value  # the gate's strict JSON reading checked it already
        # No depth bound here: the gate applies the configured one; this is only storability.
        problem = unstorable(value, max_depth=sys.maxsize)
        if problem is not None:
            raise ValueError(f"must not contain {problem}: it is not storable JSON")
        return value


class StoredEvent(BaseModel):
    """An inbox row: a completion event as matcher stored it, and what became of it. The
    one model of a stored event: the CLI, the admin API and ``explain`` all read this."""

    producer: str
    event_id: str
    tenant: str
    type: str
    correlation_id: str
    external_job_id: str | None
    occurred_at: datetime | None
    received_at: datetime
    kafka_topic: str | None
    kafka_partition: int | None
    kafka_offset: int | None
    data: Any
    status: str
    consumed_by: UUID | None
    late_for: UUID | None
    progress_for: UUID | None = None


class QuarantinedRecord(BaseModel):
    """A quarantine row: a record the gate refused, with the reason and what it claimed to
    be (only as far as it could be read). The one model of it, like ``StoredEvent``."""

    id: int
    received_at: datetime
    kafka_topic: str
    kafka_partition: int
    kafka_offset: int
    reason: str
    detail: str | None
    producer: str | None
    event_id: str | None
    tenant: str | None
    type: str | None
    correlation_id: str | None
    replayed_at: datetime | None
    replay_result: str | None


class RefusedDelivery(BaseModel):
    """A delivery the webhook ingress refused (matcher.refusals): what it claimed, never
    verified, kept so operators can find it by the correlation id it named."""

    id: int
    received_at: datetime
    via: str  # webhook or callback
    producer: str  # the URL's producer, _unknown, or callback
    reason: str
    detail: str
    http_status: int
    claimed_event_id: str | None
    claimed_type: str | None
    claimed_tenant: str | None
    claimed_correlation_id: str | None
    kind_count: int = 1  # in explain: how many refusals of this producer and reason there are


# Every reason a record is quarantined for, with what it means (the docs and the schemas
# list the same codes; a test holds them equal).
REASONS: dict[str, str] = {
    "malformed": "not a completion event matcher can read: not a CloudEvent at all, bad "
    "JSON, a number a double cannot hold exactly, a missing or invalid attribute, data that "
    "is not JSON, an unsupported content type",
    "ambiguous": "the record has more than one reading: a header the gate reads appears "
    "twice or under another spelling (case, width, spaces), a structured envelope key is "
    "another spelling of an attribute, or structured mode comes with ce_ headers",
    "unmappable": "a plain webhook whose signed body lacks what its producer's mapping "
    "reads (a missing field, or one that is not a string or an integer)",
    "limit_exceeded": "past a structural bound: JSON nesting, header count, or signatures "
    "per record",
    "too_large": "the value, or the key and headers together, exceed the byte limits",
    "undecodable": "the Kafka client could not decode the record (for example a header "
    "name that is not UTF-8); kept by its coordinates with the bytes that were recovered",
    "unknown_producer": "the event's source is not in the producers file",
    "bad_signature": "no valid signature of an active key of the producer",
    "expired_timestamp": "webhook-timestamp is outside the tolerance of the record's "
    "arrival at the broker",
    "tenant_not_allowed": "the producer may not send events for this tenant",
    "type_not_allowed": "the producer may not send events of this type",
    "schema_invalid": "the data does not satisfy the JSON Schema of its event type",
    "dropped": "a signed plain webhook that a drop rule of its producer recognises (the "
    "ingress acknowledges such a delivery and never forwards it: on the topic, the rule was "
    "added after the ingress forwarded it, or the record was written there directly)",
}


def seen_attributes(event: CompletionEvent) -> dict[str, str]:
    """An event's attributes as a rejection's ``seen`` holds them (an accepted event that
    is refused later: by the registry, or by the database)."""
    return {
        "producer": event.source,
        "event_id": event.id,
        "tenant": event.tenant,
        "type": event.type,
        "correlation_id": event.correlationid,
    }


def summary_storable(text: str) -> bool:
    """Whether Postgres text can hold ``text`` as it is (no NUL, no lone surrogate)."""
    return _UNSTORABLE_CHAR.search(text) is None


@dataclass(frozen=True)
class Rejection:
    """Why a record is not a valid completion event."""

    reason: str  # a key of REASONS
    detail: str
    # Attributes read despite the failure: producer, event_id, tenant, type, correlation_id;
    # each exactly as read (bounded), or left out when it is not text Postgres can hold
    # (summary_storable): an escaped form would read like the characters of the escape.
    seen: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Dropped(Rejection):
    """A verified delivery a drop rule of its producer recognises: the ingress answers 200
    and forwards nothing; ``rule`` is the rule's name (reason ``dropped``)."""

    rule: str = ""
