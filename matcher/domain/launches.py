"""Launch intents: the record of an external job about to be started, and what a
reconciler may answer about one whose outcome nobody recorded."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from matcher.domain.events import BIGINT_MAX, Ident


class LaunchState(StrEnum):
    INTENT = "intent"  # recorded; the external call may or may not have happened
    SUBMITTED = "submitted"  # the worker recorded the job id
    RECONCILED = "reconciled"  # a reconciler found the job
    FAILED = "failed"  # a reconciler found no job: it was never started


class LaunchSpec(BaseModel):
    """What a worker records before calling the external system."""

    model_config = ConfigDict(frozen=True)

    tenant: Ident
    run_id: Ident
    position: int = Field(ge=0, le=BIGINT_MAX)
    event_types: list[Ident] = Field(min_length=1)
    deadline: datetime | None = None
    idempotency_key: Ident | None = Field(
        default=None,
        description="Given to the external system; default: tenant:run_id:position.",
    )
    correlation_id: Ident | None = Field(
        default=None, description="Minted now (a UUID) when not given."
    )

    def key(self) -> str:
        return self.idempotency_key or f"{self.tenant}:{self.run_id}:{self.position}"


class Launch(BaseModel):
    """A launch intent and its wait, as stored (``record_launch``)."""

    model_config = ConfigDict(frozen=True)

    id: UUID
    tenant: str
    run_id: str
    position: int
    idempotency_key: str
    correlation_id: str
    wait_id: UUID
    external_job_id: str | None
    state: LaunchState
    created_at: datetime
    updated_at: datetime
    reconcile_attempts: int


@dataclass(frozen=True)
class Found:
    """The external system has the job: here is its id."""

    external_job_id: str


@dataclass(frozen=True)
class NotFound:
    """The external system never got the job (safe to launch again)."""


@dataclass(frozen=True)
class Unknown:
    """Cannot tell now (the external system is down, say); ask again later."""

    reason: str = ""


Answer = Found | NotFound | Unknown
