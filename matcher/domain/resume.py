"""The resume message: what the next worker reads to continue a run."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any, Final, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, PrivateAttr

from matcher.domain.trace_context import valid
from matcher.domain.waits import Outcome

RESUME_TYPE: Final = "matcher.resume"
RESUME_SOURCE: Final = "matcher"


class ResumeEvent(BaseModel):
    """The event that resolved the wait, with where it was read from."""

    model_config = ConfigDict(frozen=True)

    source: str
    id: str
    type: str
    data: Any = None
    external_job_id: str | None = None
    occurred_at: datetime | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    received_at: datetime


class FanInEvent(ResumeEvent):
    """An event that met a condition of a fan-in wait: which one, and its correlation id."""

    condition: int
    correlation_id: str


class ResumeData(BaseModel):
    """The ``data`` of a resume CloudEvent. ``resolution_id`` is unique per resolution."""

    model_config = ConfigDict(frozen=True)

    # The message this was read from (set by read_resume), and its SHA-256: the worker
    # API verifies and advances by the message, and the digest identifies the resume as
    # published even once its event has left the inbox.
    _message: str | None = PrivateAttr(default=None)
    _message_sha256: bytes | None = PrivateAttr(default=None)
    _traceparent: str | None = PrivateAttr(default=None)

    @property
    def message(self) -> str | None:
        return self._message

    @property
    def message_sha256(self) -> bytes | None:
        return self._message_sha256

    @property
    def traceparent(self) -> str | None:
        """The W3C trace context of the event that resolved the wait (from the message's
        envelope), when it came with one: the parent of the worker's span."""
        return self._traceparent

    def __eq__(self, other: object) -> bool:
        # Equal resumes are equal whatever message (if any) they were read from.
        if not isinstance(other, ResumeData):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash((self.resolution_id, self.wait_id))

    resolution_id: UUID
    tenant: str
    run_id: str
    position: int
    outcome: Outcome
    wait_id: UUID
    correlation_id: str
    event_types: list[str]
    event: ResumeEvent | None = None
    # Set only when the wait timed out because its heartbeat came due (a deadline's
    # timeout leaves both out: its resume is as it always was).
    timeout_reason: Literal["heartbeat"] | None = None
    last_progress_at: datetime | None = None
    # A fan-in wait's: how many conditions it needed, and every event that met one, in
    # order of arrival (on a timeout, those that had arrived).
    needed: int | None = None
    events: list[FanInEvent] | None = None
    created_at: datetime
    resolved_at: datetime
    deadline: datetime | None = None


# Fields of a resume's data that only some resumes have (compatible extensions): absent,
# not null, when a resume has none, so that every other resume is as it always was.
EXTENSIONS: Final = ("timeout_reason", "last_progress_at", "needed", "events")


class NotAResume(ValueError):
    """A message of the resume topic that is not a resume (not JSON, not a
    matcher.resume CloudEvent, or its data not a resume's)."""


def read_resume(value: bytes | str) -> ResumeData:
    """The resume carried by one message of the resume topic (a JSON CloudEvent), holding
    the message it was read from."""
    raw = value.encode() if isinstance(value, str) else value
    try:
        text = raw.decode("utf-8")
        envelope = json.loads(text)
    except ValueError as exc:
        raise NotAResume(f"not UTF-8 JSON: {exc}") from exc
    if not isinstance(envelope, dict) or envelope.get("type") != RESUME_TYPE:
        raise NotAResume(f"not a {RESUME_TYPE} CloudEvent")
    try:
        resume = ResumeData.model_validate(envelope.get("data"))
    except ValueError as exc:
        raise NotAResume(f"its data is not a resume: {str(exc).splitlines()[0]}") from exc
    resume._message = text
    resume._message_sha256 = hashlib.sha256(raw).digest()
    traceparent = envelope.get("traceparent")
    if isinstance(traceparent, str) and valid(traceparent):
        resume._traceparent = traceparent
    return resume


class ResumeCloudEvent(BaseModel):
    """A message of the resume topic: a structured-mode JSON CloudEvent, key = run id."""

    model_config = ConfigDict(frozen=True)

    specversion: Literal["1.0"] = "1.0"
    id: str  # the resolution id
    source: Literal["matcher"] = RESUME_SOURCE
    type: Literal["matcher.resume"] = RESUME_TYPE
    subject: str  # the run id
    time: datetime  # when the wait was resolved
    datacontenttype: Literal["application/json"] = "application/json"
    tenant: str
    # The event's W3C trace context (the CloudEvents distributed-tracing extension): in
    # the message only when the event came with one.
    traceparent: str | None = None
    data: ResumeData


def resume_message(data: ResumeData, traceparent: str | None = None) -> bytes:
    """The structured-mode JSON CloudEvent carrying ``data``, as the bytes to publish.

    The relay does not call this: its claim query builds the same JSON in Postgres, and
    ``tests/integration/test_resume_message.py`` holds the two equal, with this as the
    reference.
    """
    exclude: dict[str, Any] = {} if traceparent else {"traceparent": True}
    absent = {name for name in EXTENSIONS if getattr(data, name) is None}
    if absent:
        exclude["data"] = absent
    return (
        ResumeCloudEvent(
            id=str(data.resolution_id),
            subject=data.run_id,
            time=data.resolved_at,
            tenant=data.tenant,
            traceparent=traceparent,
            data=data,
        )
        .model_dump_json(exclude=exclude or None)
        .encode()
    )
