"""What Postgres writes and spends per event: the WAL written (the WAL's insert position,
and its records read back with pg_walinspect) and the server's time on top-level
statements (pg_stat_statements), from right before a throughput phase's work starts to
after it ends, per event.

The WAL is the whole server's: a phase is measured while the benchmark does nothing else.
Its range is read back from the WAL itself, not from pg_stat_wal, whose counters each
backend adds when it flushes its statistics (a second late at most, or when it exits: a
backend of another database that exited during a phase added work done before it). Each
reading first waits for every other connection to the phase's database to be gone (the
daemon's last writes are then in the range). pg_stat_statements is read for the phase's
database only; the benchmark's own connections leave theirs out of it (``untracked``),
where its role may.
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
    "wal_fpi_bytes_per_event",
    "server_us_per_event",
)
PHASES = ("matcher", "pipe")  # r_matcher, and the pipe's floor r_pipe
# The targets for r_matcher's matched events, and for its throughput.
WAL_RECORDS_TARGET = 12.0
WAL_BYTES_TARGET = 1700.0
PIPE_SHARE_TARGET = 0.8

# The extensions read, each with a query that tells whether it can be used.
USABLE = {
    "pg_stat_statements": "SELECT count(*) >= 0 FROM pg_stat_statements",
    "pg_walinspect": (
        "SELECT has_function_privilege('pg_get_wal_stats(pg_lsn, pg_lsn, boolean)', 'EXECUTE')"
    ),
}
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
LSN_SQL = "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
# The records between two positions: how many, their sizes (as pg_stat_wal counts them:
# without page headers and alignment), and the full-page images' share of them.
RECORDS_SQL = (
    "SELECT coalesce(sum(count), 0), coalesce(sum(combined_size), 0), coalesce(sum(fpi_size), 0)"
    " FROM pg_get_wal_stats('0/0'::pg_lsn + %s::numeric, '0/0'::pg_lsn + %s::numeric)"
)
FLUSHED_SQL = "SELECT pg_current_wal_flush_lsn() - '0/0'::pg_lsn >= %s::numeric"
# How long a reading waits for the phase's other connections to go, and for the WAL to
# be flushed up to its end (pg_walinspect reads only flushed WAL).
GONE_TIMEOUT_S = 15.0
FLUSHED_TIMEOUT_S = 5.0
POLL_S = 0.05


@dataclass(frozen=True)
class Reading:
    """The server at one moment."""

    wal_lsn: int  # the WAL's insert position, in bytes
    server_ms: float | None  # None: pg_stat_statements is not readable here
    evictions: int = 0  # pg_stat_statements_info.dealloc


@dataclass(frozen=True)
class Records:
    """The WAL records between two readings (pg_walinspect)."""

    count: int
    size: int  # the records' own bytes, full-page images included
    fpi_size: int  # of which full-page images


def per_event(
    before: Reading, after: Reading, records: Records | None, events: int
) -> dict[str, float]:
    """What was written and spent from ``before`` to ``after`` over ``events``: the records
    (left out without pg_walinspect), the distance the WAL's position moved, and the
    server's time in microseconds (left out when either reading lacks it, or entries were
    evicted between them: a phase's statements may have been among them)."""
    if events <= 0:
        raise ValueError(f"a phase of {events} events")
    out = {"wal_lsn_bytes_per_event": (after.wal_lsn - before.wal_lsn) / events}
    if records is not None:
        out["wal_records_per_event"] = records.count / events
        out["wal_bytes_per_event"] = records.size / events
        out["wal_fpi_bytes_per_event"] = records.fpi_size / events
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


def enable(url: str) -> dict[str, bool]:
    """pg_stat_statements and pg_walinspect in the database at ``url`` (the template every
    phase's database is copied from): whether each could be created and used (the first
    needs the server to preload it; the second, a role that may read the WAL)."""
    usable = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name, check in USABLE.items():
            try:
                conn.execute(f"CREATE EXTENSION IF NOT EXISTS {name}")
                row = conn.execute(check).fetchone()
                usable[name] = row is not None and bool(row[0])
            except psycopg.Error:
                usable[name] = False
    return usable


def untracked(conn: psycopg.Connection[Any]) -> None:
    """Leave this (autocommit) connection's statements out of pg_stat_statements: the
    benchmark's own polling is no part of a phase's server time. Setting it needs a
    superuser; without one, they are counted."""
    with contextlib.suppress(psycopg.Error):
        conn.execute("SET pg_stat_statements.track = 'none'")


def measure(url: str, before: Reading, events: int) -> dict[str, float]:
    """The phase at ``url`` that began at ``before``, ended: its figures per event."""
    after = read(url)
    with psycopg.connect(url, autocommit=True) as conn:
        records = _records(conn, before.wal_lsn, after.wal_lsn)
    return per_event(before, after, records, events)


def read(url: str, before: bool = False) -> Reading:
    """The server's position, once the phase's database at ``url`` has no other
    connection; ``before`` a phase, its database's statements so far are forgotten first
    (FORGET_SQL)."""
    with psycopg.connect(url, autocommit=True) as conn:
        untracked(conn)
        _until(lambda: _scalar(conn, OTHERS_SQL) == 0, GONE_TIMEOUT_S)
        if before:
            with contextlib.suppress(psycopg.Error):
                conn.execute(FORGET_SQL)
        lsn = int(_scalar(conn, LSN_SQL))
        try:
            row = conn.execute(STATEMENTS_SQL).fetchone()
        except psycopg.Error:
            row = None
    if row is None:
        return Reading(lsn, None)
    return Reading(lsn, float(row[0]), int(row[1]))


def _records(conn: psycopg.Connection[Any], start: int, end: int) -> Records | None:
    """The records from ``start`` to ``end`` (None: pg_walinspect is not usable here)."""
    untracked(conn)
    _until(lambda: bool(_scalar(conn, FLUSHED_SQL, end)), FLUSHED_TIMEOUT_S)
    try:
        row = conn.execute(RECORDS_SQL, [start, end]).fetchone()
    except psycopg.Error:
        return None
    assert row is not None
    return Records(int(row[0]), int(row[1]), int(row[2]))


def _scalar(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, list(params) or None).fetchone()
    assert row is not None
    return row[0]


def _until(done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(POLL_S)
