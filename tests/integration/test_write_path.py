"""The write path's promises about Postgres' own work (migration 0026): a resolution is a
HOT update of its wait (no index entry written), the open waits and the resume queue hold
only what is still to do, and the relay's claim deletes what it publishes."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from matcher.store.sql import query

pytestmark = pytest.mark.timeout(120)

WAITS = 120


def _register(conn: psycopg.Connection[Any], count: int) -> list[tuple[str, str]]:
    keys = [("t1", f"c-{uuid.uuid4().hex}") for _ in range(count)]
    for n, (tenant, correlation) in enumerate(keys):
        conn.execute(
            "SELECT matcher.register_wait_v2(%s, %s, 0, ARRAY['done'], %s,"
            " deadline => now() + interval '1 hour')",
            [tenant, f"run-{n}-{correlation}", correlation],
        )
    # Their keys were queued for the rematch pass's first look: taken out, so that their
    # events are decided by ingest itself.
    conn.execute("DELETE FROM matcher.match_queue")
    return keys


def _params(keys: list[tuple[str, str]], event_ids: list[str] | None = None) -> dict[str, Any]:
    """matcher.ingest_events' arguments for events of these keys."""
    count = len(keys)
    return {
        "producer": ["p"] * count,
        "event_id": event_ids or [f"e-{uuid.uuid4().hex}" for _ in keys],
        "tenant": [t for t, _ in keys],
        "type": ["done"] * count,
        "correlation_id": [c for _, c in keys],
        "external_job_id": [None] * count,
        "occurred_at": [None] * count,
        "topic": ["events"] * count,
        "partition": [0] * count,
        "offset": list(range(count)),
        "data": [Jsonb({"ok": True})] * count,
        "trace_parent": [None] * count,
    }


def _ingest(conn: psycopg.Connection[Any], keys: list[tuple[str, str]]) -> Any:
    with conn.transaction():
        return conn.execute(query("ingest", "ingest_events"), _params(keys)).fetchone()


def _updates(url: str) -> tuple[int, int]:
    """matcher.waits' (updates, HOT updates) as the statistics hold them now."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET stats_fetch_consistency = none")
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relid = 'matcher.waits'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_resolutions_are_hot_updates(db_url: str) -> None:
    """Resolved one at a time (each transaction's dead versions pruned by the next), every
    resolution is HOT; a batch resolving a page's worth of waits at once needs room for
    all their new versions on the page, which the fillfactor leaves for most of them."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        keys = _register(conn, WAITS)
        conn.execute("SELECT pg_stat_force_next_flush()")
    start = _updates(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        for _, correlation in keys[WAITS // 2 :]:
            wait_id = conn.execute(
                "SELECT id FROM matcher.waits WHERE correlation_id = %s", [correlation]
            ).fetchone()
            assert wait_id is not None
            conn.execute("SELECT matcher.cancel_wait_v1(%s)", [wait_id[0]])
        conn.execute("SELECT pg_stat_force_next_flush()")
    one_by_one = _updates(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        counts = _ingest(conn, keys[: WAITS // 2])
        assert counts is not None
        assert counts[2] == WAITS // 2, f"all matched: {counts}"
        conn.execute("SELECT pg_stat_force_next_flush()")
    batched = _updates(db_url)
    updated, hot = one_by_one[0] - start[0], one_by_one[1] - start[1]
    assert updated == WAITS // 2, f"one update per resolution: {updated}"
    assert hot == updated, f"{updated - hot} of {updated} single resolutions were not HOT"
    updated, hot = batched[0] - one_by_one[0], batched[1] - one_by_one[1]
    assert updated == WAITS // 2, f"one update per resolution: {updated}"
    assert hot >= 0.75 * updated, f"{updated - hot} of {updated} batched resolutions not HOT"
    with psycopg.connect(db_url, autocommit=True) as conn:
        open_rows = conn.execute("SELECT count(*) FROM matcher.open_waits").fetchone()
        queued = conn.execute("SELECT count(*) FROM matcher.resume_queue").fetchone()
        facts = conn.execute(
            "SELECT count(DISTINCT resolution_id), count(*) FILTER (WHERE outcome = 'event'),"
            " count(*) FILTER (WHERE outcome = 'cancelled') FROM matcher.waits"
        ).fetchone()
    assert open_rows == (0,), "a resolved wait keeps no open row"
    assert queued == (WAITS,), "each resolution queues its resume once"
    assert facts == (WAITS, WAITS // 2, WAITS // 2), f"the resolution facts: {facts}"


def test_no_waits_index_names_a_column_a_resolution_changes(db_url: str) -> None:
    """What makes the update HOT, stated where a new index would break it."""
    changed = {
        "state", "resolved_at", "resolution", "resolved_by_producer", "resolved_by_event_id",
        "resolved_by_received_at", "resolution_id", "outcome", "version", "resume_sha256",
    }  # fmt: skip
    with psycopg.connect(db_url, autocommit=True) as conn:
        indexes = conn.execute(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index"
            " WHERE indrelid = 'matcher.waits'::regclass"
        ).fetchall()
        fillfactor = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'matcher.waits'::regclass"
        ).fetchone()
    offending = [
        name
        for name, definition in indexes
        if any(f"({c}" in definition or f" {c}" in definition.split(" USING ")[1] for c in changed)
    ]
    assert offending == [], f"indexes naming a resolved column: {offending}"
    assert fillfactor is not None
    assert "fillfactor=50" in (fillfactor[0] or [])


def test_an_id_claimed_by_a_concurrent_batch_is_retried_then_a_duplicate(db_url: str) -> None:
    """The id claim has no ON CONFLICT: a batch claiming an id another batch claimed and
    has not committed waits for it, then fails as a serialization failure (which the
    daemon retries), and the retry finds a duplicate. Keys differ, so no key lock orders
    the two batches; only the id does."""
    event_id = f"e-{uuid.uuid4().hex}"
    with (
        psycopg.connect(db_url, autocommit=True) as first,
        psycopg.connect(db_url, autocommit=True) as second,
    ):
        first.execute("BEGIN")
        first.execute(query("ingest", "ingest_events"), _params([("t1", "k-1")], [event_id]))
        second.execute("SET lock_timeout = '20s'")
        failure: list[BaseException] = []

        def claim() -> None:
            try:
                with second.transaction():
                    second.execute(
                        query("ingest", "ingest_events"), _params([("t1", "k-2")], [event_id])
                    )
            except psycopg.Error as exc:
                failure.append(exc)

        racing = threading.Thread(target=claim)
        racing.start()
        _until_waiting(db_url, second.info.backend_pid)
        first.execute("COMMIT")
        racing.join(timeout=30)
        assert not racing.is_alive()
        assert len(failure) == 1
        assert isinstance(failure[0], psycopg.errors.SerializationFailure), failure
        with second.transaction():
            row = second.execute(
                query("ingest", "ingest_events"), _params([("t1", "k-2")], [event_id])
            ).fetchone()
    assert row is not None
    assert (row[0], row[1]) == (0, 1), f"the retry sees a duplicate: {row}"


def _until_waiting(url: str, pid: int) -> None:
    """Until backend ``pid`` waits for a lock (bounded)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(2000):
            row = conn.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchone()
            if row is not None and row[0] == "Lock":
                return
            conn.execute("SELECT pg_sleep(0.01)")
    raise AssertionError("the second batch never waited for the first")
