"""The resume message: what the next worker reads to continue a run."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from matcher.domain.waits import Outcome

RESUME_TYPE = "matcher.resume"
RESUME_SOURCE = "matcher"


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


class ResumeData(BaseModel):
    """The ``data`` of a resume CloudEvent. ``resolution_id`` is unique per resolution."""

    model_config = ConfigDict(frozen=True)

    resolution_id: UUID
    tenant: str
    run_id: str
    position: int
    outcome: Outcome
    wait_id: UUID
    correlation_id: str
    event_types: list[str]
    event: ResumeEvent | None = None
    created_at: datetime
    resolved_at: datetime
    deadline: datetime | None = None


def resume_cloudevent(data: ResumeData) -> dict[str, Any]:
    """The structured-mode JSON CloudEvent carrying ``data``."""
    return {
        "specversion": "1.0",
        "id": str(data.resolution_id),
        "source": RESUME_SOURCE,
        "type": RESUME_TYPE,
        "subject": data.run_id,
        "time": data.resolved_at.isoformat(),
        "datacontenttype": "application/json",
        "tenant": data.tenant,
        "data": data.model_dump(mode="json"),
    }
