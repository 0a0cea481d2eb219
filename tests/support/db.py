"""Postgres for tests: ad-hoc queries with bounds, waits registered in bulk, and the
rematch pass run to the end."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from matcher.config import Settings
from matcher.domain.waits import WaitSpec
from matcher.sdk import register_wait
from matcher.store.rematch import rematch_once

# A test's own queries are blocking calls, often made from an async test whose daemon
# runs on the same event loop: one that waited for a lock the daemon holds would wait for
# ever (the daemon cannot commit while the loop is blocked), and a signal-based test
# timeout cannot interrupt it. Past these it fails instead.
TEST_QUERY_BOUNDS = "-c lock_timeout=30s -c statement_timeout=120s"


@contextlib.contextmanager
def db(settings: Settings) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(
        settings.database_url.get_secret_value(), autocommit=True, row_factory=dict_row,
        connect_timeout=10, options=TEST_QUERY_BOUNDS,
    ) as conn:  # fmt: skip
        yield conn


def rows(settings: Settings, sql: str, params: Any = None) -> list[dict[str, Any]]:
    with db(settings) as conn:
        return conn.execute(sql.encode(), params).fetchall()  # test-only ad-hoc SQL


def scalar(settings: Settings, sql: str, params: Any = None) -> Any:
    found = rows(settings, sql, params)
    return next(iter(found[0].values())) if found else None


def inbox_count(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM matcher.inbox"))


async def rematch_all(settings: Settings) -> int:
    """Run the rematch pass until the queue is empty, as a daemon would (for tests that
    register waits with no daemon running); return how many waits it resolved."""
    url = settings.database_url.get_secret_value()
    matched = 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while (result := await rematch_once(conn)).keys:
            matched += result.matched
    return matched


def backdate_events(settings: Settings, column: str, values: list[str], seconds: float) -> None:
    """Move the stored events whose ``column`` is one of ``values`` back in time by
    ``seconds`` (into that day's partition), with their claimed ids in matcher.event_ids,
    which record the same arrival."""
    with db(settings) as conn:
        conn.execute(
            pgsql.SQL(
                "UPDATE matcher.inbox SET received_at = now() - make_interval(secs => %s),"
                " status_at = now() - make_interval(secs => %s) WHERE {} = ANY(%s)"
            ).format(pgsql.Identifier(column)),
            [seconds, seconds, values],
        )
        conn.execute(
            pgsql.SQL(
                "UPDATE matcher.event_ids AS e SET received_at = i.received_at"
                " FROM matcher.inbox AS i WHERE i.{} = ANY(%s)"
                " AND (e.producer, e.event_id) = (i.producer, i.event_id)"
            ).format(pgsql.Identifier(column)),
            [values],
        )


def ensure_inbox_days(settings: Settings, days_back: int) -> None:
    """Create the inbox's day partitions back to ``days_back`` days ago, for tests that
    backdate events (the daemon only creates today's and the coming days)."""
    with db(settings) as conn:
        conn.execute(
            "SELECT matcher.ensure_inbox_partitions(now() - make_interval(days => %s), now())",
            [days_back],
        )


def register_waits(
    settings: Settings,
    count: int,
    *,
    deadline_s: float | None = None,
    prefix: str = "crash",
    correlations: Sequence[str] = (),
) -> list[str]:
    """Register ``count`` waits (one run each, positions 0-2) for job.completed, with the
    given correlation ids or new ones; return their correlation ids."""
    correlations = list(correlations) or [f"{prefix}-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    deadline = datetime.now(UTC) + timedelta(seconds=deadline_s) if deadline_s else None
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        for n, correlation in enumerate(correlations):
            register_wait(
                conn,
                WaitSpec(
                    tenant="acme",
                    run_id=f"run-{correlation}",
                    position=n % 3,
                    event_types=["job.completed"],
                    correlation_id=correlation,
                    deadline=deadline,
                ),
            )
    return correlations


def published(settings: Settings) -> int:
    """Outbox rows the relay has published."""
    return int(scalar(settings, "SELECT count(*) FROM matcher.resolutions WHERE published"))


def all_published(settings: Settings, total: int) -> bool:
    return published(settings) == total


def outcome_counts(settings: Settings) -> dict[str, int]:
    return {
        r["state"]: r["n"]
        for r in rows(settings, "SELECT state, count(*) AS n FROM matcher.waits GROUP BY state")
    }
