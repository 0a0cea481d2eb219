"""The system-wide numbers behind the gauges and the mismatch counter (matcher.daemon.stats
reads them at an interval)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from matcher.store.sql import query

DictCursor = psycopg.AsyncCursor[dict[str, Any]]


async def gauges(cur: DictCursor) -> dict[str, Any]:
    """One row: every gauge's current value by name (see stats.sql)."""
    await cur.execute(query("stats", "gauges"))
    row = await cur.fetchone()
    assert row is not None  # an aggregate: always one row
    return row


async def settled_edge(cur: DictCursor, settle_s: float) -> datetime:
    """The database's now() less ``settle_s``: arrivals before it are complete."""
    await cur.execute(query("stats", "settled_edge"), {"settle_s": settle_s})
    row = await cur.fetchone()
    assert row is not None
    edge: datetime = row["edge"]
    return edge


async def mismatched_arrivals(cur: DictCursor, since: datetime, until: datetime) -> int:
    """Events that arrived in [since, until) and still wait pending beside a near-miss."""
    await cur.execute(query("stats", "mismatched_arrivals"), {"since": since, "until": until})
    row = await cur.fetchone()
    assert row is not None
    return int(row["arrived"])
