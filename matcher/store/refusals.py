"""The ingress's records of refused deliveries (``matcher.refusals``)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from matcher.store.sql import query


async def record_refusals(conn: psycopg.AsyncConnection[Any], refused: list[dict[str, Any]]) -> int:
    """Store ``refused`` (one transaction); how many rows were written."""
    cur = await conn.execute(query("refusals", "record"), {"refused": Jsonb(refused)})
    row = await cur.fetchone()
    return int(row[0]) if row else 0
