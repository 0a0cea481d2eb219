"""Waits: what a run expects, and the states a wait moves through."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from matcher.domain.events import BIGINT_MAX, Ident


class WaitState(StrEnum):
    WAITING = "waiting"
    MATCHED = "matched"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class Outcome(StrEnum):
    EVENT = "event"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


def _distinct_sorted(types: list[str]) -> list[str]:
    return sorted(set(types))


class WaitSpec(BaseModel):
    """What a run waits for: any of ``event_types`` with this tenant and correlation id."""

    model_config = ConfigDict(frozen=True)

    tenant: Ident
    run_id: Ident
    position: int = Field(
        ge=0, le=BIGINT_MAX, description="The run's position this wait belongs to."
    )
    event_types: Annotated[list[Ident], Field(min_length=1), AfterValidator(_distinct_sorted)]
    correlation_id: Ident
    deadline: datetime | None = Field(
        default=None,
        description=(
            "When the wait times out (timezone-aware); none: never. A time already past"
            " is accepted (a client's clock may run ahead of the server's): the wait times"
            " out at the sweeper's next pass, unless an event already stored matches it."
        ),
    )
    external_job_id: Ident | None = None
    id: UUID | None = Field(default=None, description="Chosen by matcher when not given.")


class Wait(BaseModel):
    """A stored wait, as read back."""

    model_config = ConfigDict(frozen=True)

    id: UUID
    tenant: str
    run_id: str
    position: int
    event_types: list[str]
    correlation_id: str
    external_job_id: str | None
    deadline: datetime | None
    state: WaitState
    created_at: datetime
    resolved_at: datetime | None
    resolution: str | None
    resolved_by_producer: str | None
    resolved_by_event_id: str | None
