"""The list views of waits, events and quarantine, as the CLI and the admin API page them
(queries/views.sql; the filters are built once, in matcher.admin.filters)."""

from __future__ import annotations

from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row

from matcher.store.sql import query

View = Literal["waits", "events", "quarantine", "refusals"]


def view_rows(
    conn: psycopg.Connection[Any], name: View, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """One page of a view's rows, newest first (``params``: its filters, limit, offset)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("views", name), params).fetchall()


async def view_rows_async(
    conn: psycopg.AsyncConnection[Any], name: View, params: dict[str, Any]
) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("views", name), params)
        return await cur.fetchall()
