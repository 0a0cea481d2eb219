"""The filters of the lists of waits, events and quarantined records: one definition, used
by the admin API (as query parameters) and by the CLI (``matcher waits list`` and the
others), so both accept and refuse the same values with the same words."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, StringConstraints, WithJsonSchema

from matcher.domain.events import REASONS
from matcher.domain.matching import InboxStatus
from matcher.domain.waits import WaitState

MAX_LIMIT = 1000
MAX_OFFSET = 1_000_000

# Identifiers as stored: bounded, and never NUL (which Postgres text cannot hold).
IDENT_PATTERN = "^[^\\x00]*$"
FilterIdent = Annotated[str, StringConstraints(max_length=512, pattern=IDENT_PATTERN)]


def _known_reason(value: str) -> str:
    if value not in REASONS:
        raise ValueError(f"must be one of {', '.join(REASONS)}")
    return value


Reason = Annotated[
    str,
    AfterValidator(_known_reason),
    WithJsonSchema({"type": "string", "enum": list(REASONS)}),
]


class Page(BaseModel):
    limit: int = Field(100, ge=1, le=MAX_LIMIT, description="Page size.")
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description="Items to skip.")

    def params(self) -> dict[str, Any]:
        """The named parameters of the view's query (one row more than the page, which
        tells whether another page exists)."""
        values = self.model_dump(mode="json")
        values["limit"] = self.limit + 1
        return values


class WaitFilters(Page):
    tenant: FilterIdent | None = None
    state: WaitState | None = None
    run_id: FilterIdent | None = None
    correlation_id: FilterIdent | None = None
    external_job_id: FilterIdent | None = None


class EventFilters(Page):
    tenant: FilterIdent | None = None
    correlation_id: FilterIdent | None = None
    status: InboxStatus | None = None
    external_job_id: FilterIdent | None = None


class QuarantineFilters(Page):
    reason: Reason | None = None
    correlation_id: FilterIdent | None = None


RefusalReason = Annotated[str, StringConstraints(pattern="^[a-z_]{1,64}$")]


class RefusalFilters(Page):
    reason: RefusalReason | None = None
    producer: FilterIdent | None = None
    correlation_id: FilterIdent | None = Field(
        None, description="The correlation id the refused delivery claimed (unverified)."
    )


class RunFilters(BaseModel):
    """The run ``explain`` looks at."""

    run_id: FilterIdent
    tenant: FilterIdent | None = None


def page(rows: list[Any], filters: Page) -> tuple[list[Any], int | None]:
    """The rows of the page, and the offset of the next one (None: this is the last)."""
    more = len(rows) > filters.limit
    return rows[: filters.limit], (filters.offset + filters.limit if more else None)
