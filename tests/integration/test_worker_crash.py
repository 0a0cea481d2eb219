"""The resume worker killed with SIGKILL at each point of its work, again and again, under a
load of 1,000 resumes: every run is advanced exactly once, and the handler's own write
(a row in app_effects, with no unique key to hide a double) is there exactly once.

The points (``matcher.faults``): ``worker.before_advance`` (a transaction begun, nothing
written), ``worker.in_handler`` (advanced and the handler's row written, not committed),
``worker.after_commit`` (committed, the offset not). ``MATCHER_TEST_WORKER_CRASHES`` sets
the kills per point (`make campaign` raises it), ``MATCHER_TEST_WORKER_RESUMES`` the load.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
import uuid

import pytest

from matcher.config import Settings
from tests.support.assertions import env_flag, eventually
from tests.support.db import db, register_waits, rows, scalar
from tests.support.handlers import create_app_tables
from tests.support.kafka import produce
from tests.support.processes import process_env, running_daemon
from tests.support.records import event

CRASHES = env_flag("MATCHER_TEST_WORKER_CRASHES", 3)
RESUMES = env_flag("MATCHER_TEST_WORKER_RESUMES", 1000)
pytestmark = pytest.mark.timeout(180 + 60 * CRASHES)


def _worker(settings: Settings, group: str, crash_at: str | None) -> subprocess.Popen[bytes]:
    env = process_env(
        settings,
        MATCHER_WORKER_GROUP=group,
        MATCHER_WORKER_SWEEP_INTERVAL_S="1",
        MATCHER_WORKER_COMMIT_INTERVAL_MS="100",
        MATCHER_WORKER_BACKOFF_S="0.05",
    )
    if crash_at is not None:
        env["MATCHER_TEST_CRASH_AT"] = crash_at
    return subprocess.Popen(
        [sys.executable, "-m", "matcher", "worker", "--handler", "tests.support.handlers:record"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _effects(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM app_effects"))


@pytest.mark.parametrize("point", ["worker.before_advance", "worker.in_handler",
                                   "worker.after_commit"])  # fmt: skip
async def test_a_worker_killed_anywhere_advances_each_run_once(
    settings: Settings, point: str
) -> None:
    with db(settings) as conn:
        create_app_tables(conn)
    group = f"crash-worker-{uuid.uuid4().hex[:6]}"
    rng = random.Random(point)
    async with running_daemon(settings):
        correlations = register_waits(settings, RESUMES, prefix="wcrash")
        await produce(settings, [event(correlation=c) for c in correlations])
        await eventually(
            lambda: int(scalar(settings, "SELECT count(*) FROM matcher.outbox "
                                         "WHERE published_at IS NOT NULL")) == RESUMES,
            timeout=120, what="every resume published",
        )  # fmt: skip
    kills = 0
    for _ in range(CRASHES):
        if _effects(settings) >= RESUMES:
            break
        worker = _worker(settings, group, f"{point}@{rng.randint(1, max(1, RESUMES // 4))}")
        deadline = time.monotonic() + 60
        while worker.poll() is None and _effects(settings) < RESUMES:
            assert time.monotonic() < deadline, "the worker neither crashed nor finished"
            await asyncio.sleep(0.05)  # polling a process: a condition with a deadline
        if worker.poll() is None:
            worker.terminate()
            worker.wait(30)
        else:
            assert worker.returncode == -9, worker.returncode  # killed at the point
            kills += 1
    assert kills >= 1
    last = _worker(settings, group, None)
    try:
        await eventually(lambda: _effects(settings) >= RESUMES, timeout=120,
                         what="every run handled after the crashes")  # fmt: skip
    finally:
        last.terminate()
        assert last.wait(60) == 0
    doubled = rows(settings, "SELECT run_id, count(*) AS n FROM app_effects "
                             "GROUP BY run_id HAVING count(*) <> 1")  # fmt: skip
    assert doubled == []
    assert _effects(settings) == RESUMES
    assert scalar(settings, "SELECT count(*) FROM matcher.runs") == RESUMES
    assert scalar(settings, "SELECT count(*) FROM matcher.runs WHERE version <> 1") == 0
