"""Waits: what a run expects, and the states a wait moves through."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, TypedDict
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
MIN_CONDITIONS: Final = 2
MAX_CONDITIONS: Final = 32


class Rule(StrEnum):
    """How many of a fan-in wait's conditions resolve it."""

    ALL = "all"
    ANY = "any"
    AT_LEAST = "at_least"


class WaitCondition(BaseModel):
    """One condition of a fan-in wait: an event of these types with this correlation id
    (and, optionally, data that satisfies ``condition``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_types: Annotated[list[Ident], Field(min_length=1), AfterValidator(_distinct_sorted)]
    correlation_id: Ident
    condition: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CONDITION_CHARS,
        description="As WaitSpec.condition.",
    )


class WaitShape(TypedDict, total=False):
    """What a wait says beyond one event of some types (``WaitSpec``'s fields of that
    name), for helpers that register waits on a caller's behalf."""

    condition: str
    heartbeat_interval_s: float
    progress_types: list[str]
    conditions: list[WaitCondition | dict[str, Any]]
    rule: Rule | str
    at_least: int


class WaitSpec(BaseModel):
    """What a run waits for: any of ``event_types`` with this tenant and correlation id;
    or, with ``conditions``, several such events (all of them, any, or at least N)."""

    model_config = ConfigDict(frozen=True)

    tenant: Ident
    run_id: Ident
    position: int = Field(
        ge=0, le=BIGINT_MAX, description="The run's position this wait belongs to."
    )
    event_types: (
        Annotated[list[Ident], Field(min_length=1), AfterValidator(_distinct_sorted)] | None
    ) = Field(default=None, description="The accepted event types (none with conditions).")
    correlation_id: Ident | None = Field(
        default=None, description="The correlation id events carry (none with conditions)."
    )
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

    conditions: list[WaitCondition] | None = Field(
        default=None,
        min_length=MIN_CONDITIONS,
        max_length=MAX_CONDITIONS,
        description=(
            "Fan-in: the wait resolves when its rule is met by these conditions, each"
            " met by one event; instead of event_types and correlation_id."
        ),
    )
    rule: Rule | None = Field(
        default=None, description="With conditions: all (the default), any, or at_least."
    )
    at_least: int | None = Field(
        default=None, ge=1, description="With rule at_least: how many conditions."
    )

    @model_validator(mode="after")
    def _one_shape(self) -> WaitSpec:
        if self.conditions is None:
            if self.event_types is None or self.correlation_id is None:
                raise ValueError("a wait needs event_types and correlation_id, or conditions")
            if self.rule is not None or self.at_least is not None:
                raise ValueError("rule and at_least are for a wait with conditions")
            return self
        if self.event_types is not None or self.correlation_id is not None:
            raise ValueError("a wait with conditions takes no event_types or correlation_id")
        if self.condition is not None or self.heartbeat_interval_s is not None:
            raise ValueError("a wait with conditions has no condition or heartbeat of its own")
        if (self.rule is Rule.AT_LEAST) != (self.at_least is not None):
            raise ValueError("rule at_least needs at_least, and only it takes at_least")
        if self.at_least is not None and self.at_least > len(self.conditions):
            raise ValueError("at_least is more than the number of conditions")
        return self

    @model_validator(mode="after")
    def _heartbeat_whole(self) -> WaitSpec:
        if (self.heartbeat_interval_s is None) != (self.progress_types is None):
            raise ValueError("a heartbeat needs both heartbeat_interval_s and progress_types")
        if self.progress_types and set(self.progress_types) & set(self.event_types or ()):
            raise ValueError("a type cannot be both an event type and a progress type")
        return self


class ConditionEvent(BaseModel):
    """The event that met a fan-in condition."""

    source: str
    id: str
    received_at: datetime | None = None


class ConditionState(BaseModel):
    """A fan-in wait's condition as stored: ``waiting``, ``matched`` (by ``event``),
    ``not_needed`` (the rule was met without it), ``timed_out`` or ``cancelled``."""

    id: UUID
    index: int
    event_types: list[str]
    correlation_id: str
    condition: str | None = None
    state: str
    resolved_at: datetime | None = None
    event: ConditionEvent | None = None


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
    needed: int | None = None  # a fan-in wait: how many of its conditions resolve it
    conditions: list[ConditionState] | None = None
