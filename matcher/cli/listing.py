"""The one shape of every list verb (``waits list``, ``events list``, ``quarantine
list``): options checked by the admin API's filter model, a page of a list view
(matcher/store/queries/views.sql), then a JSON array or a table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from matcher.admin.filters import page
from matcher.cli.output import print_json, table
from matcher.cli.settings import connect, parse_filters, settings_for
from matcher.store.views import View, view_rows

Item = TypeVar("Item", bound=BaseModel)

# The options whose names differ from their filter's field.
FILTER_OPTIONS = {
    "run_id": "--run",
    "correlation_id": "--correlation",
    "external_job_id": "--job-id",
}


@dataclass(frozen=True)
class Listing(Generic[Item]):
    view: View
    model: type[Item]
    columns: Sequence[str]
    row: Callable[[Item], Sequence[object]]


def show(listing: Listing[Item], filters_model: type[Any], as_json: bool, **values: Any) -> None:
    """The page the options ask for, as ``--json`` or a table."""
    filters = parse_filters(filters_model, FILTER_OPTIONS, **values)
    with connect(settings_for(kafka=False)) as conn:
        rows = view_rows(conn, listing.view, filters.params())
    items = [listing.model.model_validate(r) for r in page(rows, filters)[0]]
    if as_json:
        print_json(items)
    else:
        table(listing.columns, [listing.row(item) for item in items])
