"""What Postgres writes and spends per event: the WAL (pg_stat_wal and the WAL's insert
position) and the server's time on top-level statements (pg_stat_statements), read right
before a throughput phase's work starts and after it ends, as deltas per event.

pg_stat_wal and the WAL's position are the whole server's: a phase is measured while the
benchmark does nothing else. A backend's counters reach pg_stat_wal when it flushes its
statistics (at most about a second late, and when it exits), so a reading first waits for
every other connection to the phase's database to be gone, then for pg_stat_wal to stand
still. pg_stat_statements is read for the phase's database only; the benchmark's own
connections leave theirs out of it (``untracked``), where its role may.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

# The figures of each measured phase, per event.
FIGURES = (
    "wal_records_per_event",
    "wal_bytes_per_event",
    "wal_lsn_bytes_per_event",
    "wal_fpi_per_event",
    "server_us_per_event",
)
PHASES = ("matcher", "pipe")  # r_matcher, and the pipe's floor r_pipe
# The targets for r_matcher's matched events, and for its throughput.
WAL_RECORDS_TARGET = 12.0
WAL_BYTES_TARGET = 1700.0
PIPE_SHARE_TARGET = 0.8

WAL_SQL = (
    "SELECT wal_records, wal_fpi, wal_bytes, pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
    " FROM pg_stat_wal"
)
THIS_DB = "(SELECT oid FROM pg_database WHERE datname = current_database())"
STATEMENTS_SQL = (
    "SELECT coalesce(sum(total_exec_time + total_plan_time), 0),"
    " (SELECT dealloc FROM pg_stat_statements_info)"
    f" FROM pg_stat_statements WHERE toplevel AND dbid = {THIS_DB}"
)
# Before a phase: its database's entries so far, and those of the databases dropped since
# (no one can read them), go, so that the table's 5,000 entries (by default) are not
# full and none of the phase's is evicted while it runs.
FORGET_SQL = (
    "SELECT pg_stat_statements_reset(0, dbid, 0) FROM (SELECT DISTINCT dbid"
    f" FROM pg_stat_statements WHERE dbid = {THIS_DB}"
    " OR dbid NOT IN (SELECT oid FROM pg_database)) AS gone"
)
OTHERS_SQL = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)
# How long a reading waits for the phase's other connections to go, and for pg_stat_wal
# to stand still (the exited backends' last counters flushed).
GONE_TIMEOUT_S = 15.0
STILL_TIMEOUT_S = 3.0
POLL_S = 0.05


@dataclass(frozen=True)
class Reading:
    """The server's counters at one moment."""

    wal_records: int
    wal_fpi: int
    wal_bytes: int  # pg_stat_wal's: the records' own sizes
    wal_lsn: int  # the insert position in bytes: page headers and alignment too
    server_ms: float | None  # None: pg_stat_statements is not readable here
    evictions: int = 0  # pg_stat_statements_info.dealloc


def per_event(before: Reading, after: Reading, events: int) -> dict[str, float]:
    """The deltas from ``before`` to ``after`` over ``events``; the server's time in
    microseconds, left out when either reading lacks it or entries were evicted between
    them (a phase's statements may have been among them)."""
    if events <= 0:
        raise ValueError(f"a phase of {events} events")
    out = {
        "wal_records_per_event": (after.wal_records - before.wal_records) / events,
        "wal_bytes_per_event": (after.wal_bytes - before.wal_bytes) / events,
        "wal_lsn_bytes_per_event": (after.wal_lsn - before.wal_lsn) / events,
        "wal_fpi_per_event": (after.wal_fpi - before.wal_fpi) / events,
    }
    if (
        before.server_ms is not None
        and after.server_ms is not None
        and before.evictions == after.evictions
    ):
        out["server_us_per_event"] = 1000 * (after.server_ms - before.server_ms) / events
    return out


def record(runs: dict[str, list[float]], phase: str, figures: dict[str, float]) -> None:
    """One repetition's figures of ``phase``, as runs ``write_path_<phase>_<figure>``."""
    for name, value in figures.items():
        runs.setdefault(f"write_path_{phase}_{name}", []).append(value)


def summary(
    runs: dict[str, list[float]], median: Callable[[list[float]], float]
) -> dict[str, dict[str, float | None]]:
    """Per phase, the ``median`` of each figure's repetitions; None where not measured."""
    return {
        phase: {
            name: median(values) if (values := runs.get(f"write_path_{phase}_{name}")) else None
            for name in FIGURES
        }
        for phase in PHASES
    }


def targets(
    write_path: dict[str, dict[str, float | None]], matcher_over_pipe: float | None
) -> dict[str, bool]:
    """The issue's targets; a target whose figure was not measured is unmet."""

    def at_most(value: float | None, target: float) -> bool:
        return value is not None and value <= target

    matcher = write_path["matcher"]
    return {
        f"WAL records per matched event <= {WAL_RECORDS_TARGET:.0f}": at_most(
            matcher["wal_records_per_event"], WAL_RECORDS_TARGET
        ),
        f"WAL bytes per matched event <= {WAL_BYTES_TARGET:,.0f}": at_most(
            matcher["wal_bytes_per_event"], WAL_BYTES_TARGET
        ),
        f"r_matcher >= {PIPE_SHARE_TARGET} x r_pipe": (
            matcher_over_pipe is not None and matcher_over_pipe >= PIPE_SHARE_TARGET
        ),
    }


def enable(url: str) -> bool:
    """pg_stat_statements in the database at ``url`` (the template every phase's database
    is copied from): whether it could be created (it needs the server to preload it)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute(STATEMENTS_SQL).fetchone()
    except psycopg.Error:
        return False
    return True


def untracked(conn: psycopg.Connection[Any]) -> None:
    """Leave this (autocommit) connection's statements out of pg_stat_statements: the
    benchmark's own polling is no part of a phase's server time. Setting it needs a
    superuser; without one, they are counted."""
    with contextlib.suppress(psycopg.Error):
        conn.execute("SET pg_stat_statements.track = 'none'")


def read(url: str, before: bool = False) -> Reading:
    """The counters, once the phase's database at ``url`` has no other connection and
    pg_stat_wal stands still; ``before`` a phase, its database's statements so far are
    forgotten first (FORGET_SQL)."""
    with psycopg.connect(url, autocommit=True) as conn:
        untracked(conn)
        _until(lambda: _scalar(conn, OTHERS_SQL) == 0, GONE_TIMEOUT_S)
        if before:
            with contextlib.suppress(psycopg.Error):
                conn.execute(FORGET_SQL)
        records, fpi, wal_bytes, lsn = _still_wal(conn)
        try:
            row = conn.execute(STATEMENTS_SQL).fetchone()
        except psycopg.Error:
            row = None
    if row is None:
        return Reading(records, fpi, wal_bytes, lsn, None)
    return Reading(records, fpi, wal_bytes, lsn, float(row[0]), int(row[1]))


def _scalar(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def _wal(conn: psycopg.Connection[Any]) -> tuple[int, int, int, int]:
    conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute(WAL_SQL).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]), int(row[3])


def _still_wal(conn: psycopg.Connection[Any]) -> tuple[int, int, int, int]:
    """pg_stat_wal once two readings a poll apart agree (or the timeout's last one)."""
    last = _wal(conn)
    deadline = time.monotonic() + STILL_TIMEOUT_S
    while time.monotonic() < deadline:
        time.sleep(POLL_S)
        now = _wal(conn)
        if now[:3] == last[:3]:
            return now
        last = now
    return last


def _until(done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(POLL_S)
