"""The LangGraph resumer (``matcher worker --handler tests.support.graphs:resumer``) killed
with SIGKILL at each point of its work, again and again, while it resumes a load of
graphs: every thread is resumed exactly once (one resume value in its checkpoints, the
graph finished), its node's database write is there once, and its job was submitted once.

The points: ``langgraph.after_advance`` (the run advanced in the worker's transaction,
the graph not yet resumed), ``langgraph.after_invoke`` (the graph resumed and its
checkpoints and the node's row written, none committed) and ``worker.after_commit``
(committed, the offset not). ``MATCHER_TEST_LANGGRAPH_CRASHES`` sets the kills per point,
``MATCHER_TEST_LANGGRAPH_THREADS`` the load.
"""

from __future__ import annotations

import random
import subprocess
import uuid
from pathlib import Path

import pytest

from matcher.config import Settings
from matcher.integrations.langgraph import Waits
from tests.support import graphs
from tests.support.assertions import env_flag, eventually
from tests.support.db import rows, scalar
from tests.support.kafka import produce
from tests.support.processes import running_daemon
from tests.support.records import event
from tests.support.worker import killed_at_its_point, worker_process

CRASHES = env_flag("MATCHER_TEST_LANGGRAPH_CRASHES", 3)
THREADS = env_flag("MATCHER_TEST_LANGGRAPH_THREADS", 60)
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240 + 60 * CRASHES)


def _resumer(settings: Settings, group: str, crash_at: str | None) -> subprocess.Popen[bytes]:
    return worker_process(
        settings, "tests.support.graphs:resumer", group, crash_at, ROOT,
        MATCHER_WORKER_RUN_PREFIX="langgraph:",
    )  # fmt: skip


def _finished(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM lg_effects"))


@pytest.mark.parametrize(
    "point", ["langgraph.after_advance", "langgraph.after_invoke", "worker.after_commit"]
)
async def test_a_resumer_killed_anywhere_resumes_each_graph_once(
    settings: Settings, point: str
) -> None:
    url = settings.database_url.get_secret_value()
    graphs.setup(url)
    builder = graphs.job_graph(Waits(graphs.TENANT, url), url)
    threads = [f"crash-{n}-{uuid.uuid4().hex[:6]}" for n in range(THREADS)]
    for thread in threads:
        await graphs.start(builder, url, thread, {"log": []})
    jobs = rows(settings, "SELECT correlation_id FROM lg_jobs")
    assert len(jobs) == THREADS
    async with running_daemon(settings):
        await produce(settings, [event(correlation=j["correlation_id"]) for j in jobs])
        await eventually(
            lambda: int(scalar(settings, "SELECT count(*) FROM matcher.resolutions "
                                         "WHERE published")) == THREADS,
            timeout=120, what="every resume published",
        )  # fmt: skip
    group = f"crash-lg-{uuid.uuid4().hex[:6]}"
    rng = random.Random(point)
    kills = 0
    for _ in range(CRASHES):
        # Within the first resumes of this kill's share of the load (one visit per resume
        # at the resumer's points, one per transaction after the commit).
        visit = rng.randint(1, max(1, THREADS // (2 * CRASHES * 8)))
        resumer = _resumer(settings, group, f"{point}@{visit}")
        kills += await killed_at_its_point(resumer, lambda: _finished(settings) >= THREADS, 90)
    assert kills == CRASHES, f"{kills} of {CRASHES} kills happened"
    last = _resumer(settings, group, None)
    try:
        await eventually(lambda: _finished(settings) >= THREADS, timeout=120,
                         what="every graph resumed after the crashes")  # fmt: skip
    finally:
        last.terminate()
        assert last.wait(60) == 0
    doubled = rows(settings, "SELECT thread, count(*) AS n FROM lg_effects "
                             "GROUP BY thread HAVING count(*) <> 1")  # fmt: skip
    assert doubled == []
    assert _finished(settings) == THREADS
    resumed = rows(settings, "SELECT thread_id, count(*) AS n FROM checkpoint_writes "
                             "WHERE channel = '__resume__' GROUP BY thread_id")  # fmt: skip
    assert {r["thread_id"]: r["n"] for r in resumed} == dict.fromkeys(threads, 1)
    assert scalar(settings, "SELECT count(*) FROM lg_jobs") == THREADS  # submitted once
    for thread in rng.sample(threads, 5):
        state = await graphs.state_of(builder, url, thread)
        assert state.values["log"] == ["launch:event", "done"]
        assert not state.next
