"""Waiting on conditions with a deadline (never on sleeps), and the exactly-once check
every load test ends with."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

import psycopg

from matcher.config import Settings
from matcher.sdk import advance
from tests.support.db import rows, scalar
from tests.support.kafka import read_resumes


async def eventually(
    check: Callable[[], bool], *, timeout: float = 30, interval: float = 0.1, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what or check}")
        await asyncio.sleep(interval)


async def check_exactly_once(settings: Settings, total: int) -> None:
    """``total`` waits resolved, each resume (duplicates included) advances its run exactly
    once, and a resume resolved by an event names the event that resolved the wait."""
    resumes = await read_resumes(settings, at_least=total)
    waits = {
        str(r["id"]): r
        for r in rows(settings, "SELECT * FROM matcher.waits WHERE state <> 'waiting'")
    }
    assert len(waits) == total
    advanced: dict[str, int] = {}
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        for resume in resumes:  # duplicates included: the relay is at-least-once
            wait = waits[str(resume.wait_id)]
            if resume.outcome == "event":
                assert resume.event is not None
                assert (resume.event.source, resume.event.id) == (
                    wait["resolved_by_producer"],
                    wait["resolved_by_event_id"],
                )
            if advance(conn, resume):
                advanced[str(resume.wait_id)] = advanced.get(str(resume.wait_id), 0) + 1
    assert advanced == dict.fromkeys(waits, 1)
    assert scalar(settings, "SELECT count(*) FROM matcher.resolutions") == total
    assert scalar(settings, "SELECT count(*) FROM matcher.inbox WHERE status = 'pending'") == 0


def dump(value: Any) -> str:
    return json.dumps(value, default=str, indent=1)


def env_flag(name: str, default: int) -> int:
    """Iteration counts that the long campaign target raises."""
    return int(os.environ.get(name, default))
