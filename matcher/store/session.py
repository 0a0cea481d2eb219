"""Statements about the connection itself rather than matcher's rows: readiness, LISTEN."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import sql

from matcher.store.sql import query


async def ping(conn: psycopg.AsyncConnection[Any]) -> None:
    """Raises unless the server answers."""
    await conn.execute(query("session", "ping"))


async def listen(conn: psycopg.AsyncConnection[Any], channels: Iterable[str]) -> None:
    """LISTEN on each channel (quoted as identifiers: the names come from code, but a
    channel name is still never spliced into SQL as text)."""
    for channel in channels:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
