"""Handlers for the resume worker's tests, importable as ``tests.support.handlers:<name>``
(the `matcher worker --handler` of the crash tests). Each writes the application's own
state in the transaction that advances the run: one row in ``app_effects`` per resume it
handled, which the tests count (no unique key: a second row would be a double)."""

from __future__ import annotations

from typing import Any

import psycopg

from matcher.domain.resume import ResumeData
from matcher.sdk.worker import Retry

APP_TABLES = """
CREATE TABLE IF NOT EXISTS app_effects (
    run_id text NOT NULL, resolution_id uuid NOT NULL, at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS app_switches (name text PRIMARY KEY, value text NOT NULL);
"""


def create_app_tables(conn: psycopg.Connection[Any]) -> None:
    conn.execute(APP_TABLES)


async def record(tx: psycopg.AsyncConnection[Any], resume: ResumeData) -> None:
    """The run's next step: one row, in the advance's transaction."""
    await tx.execute(
        "INSERT INTO app_effects (run_id, resolution_id) VALUES (%s, %s)",
        [resume.run_id, resume.resolution_id],
    )


def record_sync(tx: psycopg.Connection[Any], resume: ResumeData) -> None:
    """``record`` as a sync handler (run in a worker thread)."""
    tx.execute(
        "INSERT INTO app_effects (run_id, resolution_id) VALUES (%s, %s)",
        [resume.run_id, resume.resolution_id],
    )


async def _switch(tx: psycopg.AsyncConnection[Any], name: str) -> str | None:
    cursor = await tx.execute("SELECT value FROM app_switches WHERE name = %s", [name])
    row = await cursor.fetchone()
    return None if row is None else str(row[0])


async def switched(tx: psycopg.AsyncConnection[Any], resume: ResumeData) -> None:
    """``record``, unless a switch says otherwise for this run: ``fail:<run>`` (raise),
    ``wait:<run>`` (not ready: Retry), ``fail_once:<run>`` (raise, and clear the switch in
    its own transaction so the next attempt succeeds)."""
    if await _switch(tx, f"fail:{resume.run_id}") is not None:
        raise RuntimeError(f"the application refuses run {resume.run_id}")
    if await _switch(tx, f"wait:{resume.run_id}") is not None:
        raise Retry(after=0.2, reason="the run's state is not written yet")
    await record(tx, resume)
