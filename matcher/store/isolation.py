"""The daemon's transactions run at READ COMMITTED, whatever the database's default.

The matching argument (a key's advisory lock, then statements that see everything
committed before them) needs each statement's snapshot to be taken after the lock was
granted. Under REPEATABLE READ the snapshot is the transaction's first, taken before the
lock: an event committed meanwhile would be invisible to the rematch pass, and two
batches could both find an event id new. matcher's tables may share an application's
database whose default is REPEATABLE READ, so the level is named, not assumed: in the
BEGIN of a pipelined transaction (matcher.store.pipelined: the relay, the rematch pass),
as the session's default for the implicit ones (``session_read_committed``: ingest), and
on the connection for psycopg's own (``read_committed``).
"""

from __future__ import annotations

import weakref
from typing import Any

import psycopg
from psycopg import IsolationLevel
from psycopg.pq import TransactionStatus

from matcher.store.sql import query


async def read_committed(conn: psycopg.AsyncConnection[Any]) -> None:
    """Make the connection's next transactions READ COMMITTED (no round trip: psycopg
    puts the level in its BEGIN). A connection inside a transaction must already be."""
    if conn.isolation_level is not IsolationLevel.READ_COMMITTED:
        if conn.info.transaction_status is not TransactionStatus.IDLE:
            raise RuntimeError("matcher's statements need a READ COMMITTED transaction")
        await conn.set_isolation_level(IsolationLevel.READ_COMMITTED)


# Connections whose session default is READ COMMITTED: set once per connection.
_SESSIONS_READ_COMMITTED: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()


async def session_read_committed(conn: psycopg.AsyncConnection[Any]) -> None:
    """Make READ COMMITTED the session's default too, for the implicit transactions of
    autocommit statements (which have no BEGIN to carry the level). One round trip, the
    first time a connection is seen; matcher.ingest_events refuses any other level, so a
    session reset behind our back fails loudly rather than matching under a stale
    snapshot."""
    if conn in _SESSIONS_READ_COMMITTED:
        return
    if conn.info.transaction_status is not TransactionStatus.IDLE:
        raise RuntimeError("the session's isolation level can only be set between transactions")
    autocommit = conn.autocommit
    await conn.set_autocommit(True)
    try:
        await conn.execute(query("session", "read_committed"))
    finally:
        await conn.set_autocommit(autocommit)
    _SESSIONS_READ_COMMITTED.add(conn)
