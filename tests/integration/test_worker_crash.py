"""The resume worker killed with SIGKILL at each point of its work, again and again, under a
load of 1,000 resumes, running the README's handler as written (its table and its
app.py, taken from the README's text): every run is advanced exactly once, and the
handler's own write (a row in ``steps``, with no unique key to hide a double) is there
exactly once.

The points (``matcher.faults``): ``worker.before_advance`` (a transaction begun, nothing
written), ``worker.in_handler`` (advanced and the handler's row written, not committed),
``worker.after_commit`` (committed, the offset not). ``MATCHER_TEST_WORKER_CRASHES`` sets
the kills per point (`make campaign` raises it), ``MATCHER_TEST_WORKER_RESUMES`` the load.
"""

from __future__ import annotations

import random
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from matcher.config import Settings
from tests.support.assertions import env_flag, eventually
from tests.support.db import db, register_waits, rows, scalar
from tests.support.kafka import produce
from tests.support.processes import running_daemon
from tests.support.records import event
from tests.support.worker import killed_at_its_point, worker_process

CRASHES = env_flag("MATCHER_TEST_WORKER_CRASHES", 3)
RESUMES = env_flag("MATCHER_TEST_WORKER_RESUMES", 1000)
pytestmark = pytest.mark.timeout(180 + 60 * CRASHES)


README = Path(__file__).resolve().parents[2] / "README.md"


def readme_worker() -> tuple[str, str]:
    """The README's worker, as written: its table (the sql block) and its app.py (the
    python block) of the section "Continuing the run, exactly once"."""
    text = README.read_text()
    section = text[text.index("## Continuing the run, exactly once") :]
    section = section[: section.index("\n## ", 1)]
    sql = re.search(r"```sql\n(.*?)```", section, re.DOTALL)
    app = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert sql is not None, "the README's worker section lost its sql block"
    assert app is not None, "the README's worker section lost its python block"
    return sql.group(1), app.group(1)


def _kill_at(point: str, rng: random.Random, batch: int) -> str:
    """The point and the visit of it to die at: within the first resumes of the load's
    share of this kill (the in-handler point is visited once per resume, the others once
    per transaction), so that every kill happens before the load is done."""
    per_visit = 1 if point == "worker.in_handler" else batch
    latest = max(1, RESUMES // (2 * CRASHES * per_visit))
    return f"{point}@{rng.randint(1, latest)}"


def _worker(
    settings: Settings, group: str, crash_at: str | None, cwd: Path, batch: int = 32
) -> subprocess.Popen[bytes]:
    return worker_process(
        settings, "app:handle", group, crash_at, cwd, MATCHER_WORKER_BATCH_MAX=str(batch)
    )


def _effects(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM steps"))


@pytest.mark.parametrize("point", ["worker.before_advance", "worker.in_handler",
                                   "worker.after_commit"])  # fmt: skip
async def test_a_worker_killed_anywhere_advances_each_run_once(
    settings: Settings, point: str, tmp_path: Path
) -> None:
    table, app = readme_worker()
    (tmp_path / "app.py").write_text(app)
    with db(settings) as conn:
        conn.execute(table.encode())  # the README's own SQL
    group = f"crash-worker-{uuid.uuid4().hex[:6]}"
    rng = random.Random(point)
    async with running_daemon(settings):
        correlations = register_waits(settings, RESUMES, prefix="wcrash")
        await produce(settings, [event(correlation=c) for c in correlations])
        await eventually(
            lambda: int(scalar(settings, "SELECT count(*) FROM matcher.resolutions "
                                         "WHERE published")) == RESUMES,
            timeout=120, what="every resume published",
        )  # fmt: skip
    kills = 0
    for kill in range(CRASHES):
        batch = 1 if kill % 2 else 32  # one resume per transaction, then batches, in turn
        worker = _worker(settings, group, _kill_at(point, rng, batch), tmp_path, batch)
        kills += await killed_at_its_point(worker, lambda: _effects(settings) >= RESUMES)
    assert kills == CRASHES, f"{kills} of {CRASHES} kills happened"
    last = _worker(settings, group, None, tmp_path)
    try:
        await eventually(lambda: _effects(settings) >= RESUMES, timeout=120,
                         what="every run handled after the crashes")  # fmt: skip
    finally:
        last.terminate()
        assert last.wait(60) == 0
    doubled = rows(settings, "SELECT run_id, count(*) AS n FROM steps "
                             "GROUP BY run_id HAVING count(*) <> 1")  # fmt: skip
    assert doubled == []
    assert _effects(settings) == RESUMES
    assert scalar(settings, "SELECT count(*) FROM matcher.runs") == RESUMES
    assert scalar(settings, "SELECT count(*) FROM matcher.runs WHERE version <> 1") == 0
