"""Waits: what a run expects, and the states a wait moves through."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Final
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

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


# Bounds that matcher.register_wait_v2 applies too.
MAX_CONDITION_CHARS: Final = 1000
MIN_HEARTBEAT_S: Final = 1.0
MAX_HEARTBEAT_S: Final = 366 * 86400.0


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
    condition: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CONDITION_CHARS,
        description=(
            "An SQL/JSON path predicate on the event's data, evaluated by Postgres"
            " (jsonb_path_match): an event whose data does not satisfy it is not consumed"
            ' by this wait. E.g. `$.status == "succeeded"`. No variables, like_regex or'
            " .**; a result other than one boolean is false."
        ),
    )
    heartbeat_interval_s: float | None = Field(
        default=None,
        ge=MIN_HEARTBEAT_S,
        le=MAX_HEARTBEAT_S,
        description=(
            "With progress_types: the wait times out (timeout_reason heartbeat) when no"
            " progress event arrives for this many seconds; the deadline still caps it."
        ),
    )
    progress_types: (
        Annotated[list[Ident], Field(min_length=1), AfterValidator(_distinct_sorted)] | None
    ) = Field(
        default=None,
        description=(
            "Event types that report progress on this wait (never resolve it): each moves"
            " its heartbeat on. None of them may be one of event_types."
        ),
    )

    @model_validator(mode="after")
    def _heartbeat_whole(self) -> WaitSpec:
        if (self.heartbeat_interval_s is None) != (self.progress_types is None):
            raise ValueError("a heartbeat needs both heartbeat_interval_s and progress_types")
        if self.progress_types and set(self.progress_types) & set(self.event_types):
            raise ValueError("a type cannot be both an event type and a progress type")
        return self


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
    condition: str | None = None
    progress_types: list[str] | None = None
    heartbeat_interval_s: float | None = None
    heartbeat_due: datetime | None = None
    last_progress_at: datetime | None = None
