"""Completion events as matcher understands them, after parsing and validation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)


def _no_nul(value: str) -> str:
    # Postgres text cannot hold NUL; refuse it here rather than fail the whole batch later.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


# Identifiers are free text, but bounded, never empty or whitespace-only, never NUL.
Ident = Annotated[
    str,
    StringConstraints(min_length=1, max_length=512, pattern=r"\S"),
    AfterValidator(_no_nul),
]


def _unstorable(value: Any) -> str | None:
    """Why Postgres jsonb would refuse ``value``, or None."""
    if isinstance(value, str):
        return "NUL characters (\\u0000)" if "\x00" in value else None
    if isinstance(value, float):
        return None if math.isfinite(value) else "a non-finite number (NaN or Infinity)"
    if isinstance(value, dict):
        items: list[Any] = [*value.keys(), *value.values()]
        return next((r for r in map(_unstorable, items) if r), None)
    if isinstance(value, list):
        return next((r for r in map(_unstorable, value) if r), None)
    return None


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
    def _data_fits_jsonb(cls, value: Any) -> Any:
        problem = _unstorable(value)
        if problem is not None:
            raise ValueError(f"must not contain {problem}: it is not storable JSON")
        return value


@dataclass(frozen=True)
class Rejection:
    """Why a Kafka record is not a valid completion event."""

    reason: str  # a reason code, e.g. "malformed"
    detail: str
    # Attributes read despite the failure: producer, event_id, tenant, type, correlation_id.
    seen: dict[str, str] = field(default_factory=dict)
