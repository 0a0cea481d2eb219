"""The TypeScript SDK (sdks/typescript) against real Kafka, Postgres and the daemon.

The package is installed (``npm ci``) and built once per session; its node:test suites run
with this test's database and topics in their environment: the shared signature vectors, a
round trip from the TypeScript producer through the daemon to the TypeScript worker
(advanced exactly once), a forged resume refused (MR001) and a tampered event quarantined.
The crash test kills the TypeScript worker with SIGKILL at the Python worker's crash points
(``worker.before_advance``, ``worker.in_handler``, ``worker.after_commit``), as
test_worker_crash.py does: every run advanced once, the handler's row written once.
``MATCHER_TEST_TS_WORKER_CRASHES`` sets the kills per point, ``MATCHER_TEST_TS_WORKER_RESUMES``
the load.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from matcher.config import Settings
from tests.support.assertions import env_flag, eventually
from tests.support.db import db, register_waits, rows, scalar
from tests.support.ingress import wait_for
from tests.support.kafka import produce, read_resumes
from tests.support.processes import IngressProcess, running_daemon
from tests.support.producers import K1
from tests.support.records import event
from tests.support.services import settings_env
from tests.support.webhooks import STANDARD_SECRET
from tests.support.worker import killed_at_its_point

SDK = Path(__file__).resolve().parents[2] / "sdks" / "typescript"
CRASHES = env_flag("MATCHER_TEST_TS_WORKER_CRASHES", 3)
RESUMES = env_flag("MATCHER_TEST_TS_WORKER_RESUMES", 300)
NPM_CI_TIMEOUT_S = 300
BUILD_TIMEOUT_S = 180


def _npm(*args: str, timeout: float) -> None:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(
            "the TypeScript SDK's tests need Node.js 20+ and npm on the PATH", pytrace=False
        )
    try:
        done = subprocess.run(
            [npm, *args], cwd=SDK, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        reason = f"took over {timeout:.0f}s"
        pytest.fail(
            f"npm {' '.join(args)} {reason} (is the npm registry reachable?)", pytrace=False
        )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        pytest.fail(
            f"npm {' '.join(args)} failed (is the npm registry reachable?): {last}", pytrace=False
        )


@pytest.fixture(scope="session")
def typescript_sdk() -> Path:
    """The SDK installed as its lock file says (unless it already is) and built."""
    installed = SDK / "node_modules" / ".package-lock.json"
    lock = SDK / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        _npm("ci", "--no-audit", "--no-fund", timeout=NPM_CI_TIMEOUT_S)
    _npm("run", "build", timeout=BUILD_TIMEOUT_S)
    return SDK


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    return settings_env(settings) | extra


async def _node_test(settings: Settings, suite: str, timeout: float, **extra: str) -> None:
    """``node --test`` on a compiled suite, its output shown when it fails."""
    process = await asyncio.create_subprocess_exec(
        "node", "--test", "--test-reporter=spec", f"--test-timeout={int(timeout * 1000)}", suite,
        cwd=SDK, env=_env(settings, **extra),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout + 30)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"node --test {suite} ran over {timeout + 30:.0f}s") from None
    assert process.returncode == 0, output.decode(errors="replace")


@pytest.mark.timeout(600)
async def test_the_shared_signature_vectors(typescript_sdk: Path, settings: Settings) -> None:
    await _node_test(settings, "dist/test/unit/", timeout=60)


@pytest.mark.timeout(600)
async def test_typescript_producer_daemon_and_worker(
    typescript_sdk: Path, secure: Settings
) -> None:
    async with running_daemon(secure):
        await _node_test(
            secure, "dist/test/integration/roundtrip.test.js", timeout=180,
            MATCHER_TEST_SIGNING_KEY=K1,
        )  # fmt: skip


def _kill_at(point: str, rng: random.Random) -> str:
    """The point and the visit of it to die at, within the first resumes of this kill's
    share of the load (one resume per transaction: every point is visited once a resume)."""
    return f"{point}@{rng.randint(1, max(1, RESUMES // (2 * CRASHES)))}"


def _worker(settings: Settings, group: str, crash_at: str | None) -> subprocess.Popen[bytes]:
    env = _env(
        settings,
        MATCHER_WORKER_GROUP=group,
        MATCHER_WORKER_SWEEP_INTERVAL_S="1",
        MATCHER_WORKER_COMMIT_INTERVAL_MS="100",
        MATCHER_WORKER_BACKOFF_S="0.05",
    )
    if crash_at is not None:
        env["MATCHER_TEST_CRASH_AT"] = crash_at
    return subprocess.Popen(
        ["node", "dist/test/integration/crash-worker.js"], cwd=SDK, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _effects(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM steps"))


@pytest.mark.parametrize("point", ["worker.before_advance", "worker.in_handler",
                                   "worker.after_commit"])  # fmt: skip
@pytest.mark.timeout(240)
async def test_a_typescript_worker_killed_anywhere_advances_each_run_once(
    typescript_sdk: Path, settings: Settings, point: str
) -> None:
    with db(settings) as conn:  # no unique key: a resume handled twice shows as two rows
        conn.execute("CREATE TABLE steps (run_id text NOT NULL, resolution_id uuid NOT NULL)")
    group = f"ts-crash-{uuid.uuid4().hex[:6]}"
    rng = random.Random(point)
    async with running_daemon(settings):
        correlations = register_waits(settings, RESUMES, prefix="tscrash")
        await produce(settings, [event(correlation=c) for c in correlations])
        await eventually(
            lambda: int(scalar(settings, "SELECT count(*) FROM matcher.resolutions "
                                         "WHERE published")) == RESUMES,
            timeout=120, what="every resume published",
        )  # fmt: skip
    kills = 0
    for _ in range(CRASHES):
        worker = _worker(settings, group, _kill_at(point, rng))
        kills += await killed_at_its_point(worker, lambda: _effects(settings) >= RESUMES)
    assert kills == CRASHES, f"{kills} of {CRASHES} kills happened"
    last = _worker(settings, group, None)
    try:
        await eventually(lambda: _effects(settings) >= RESUMES, timeout=120,
                         what="every run handled after the crashes")  # fmt: skip
    finally:
        last.terminate()
        assert last.wait(60) == 0  # SIGTERM: a graceful stop
    doubled = rows(settings, "SELECT run_id, count(*) AS n FROM steps "
                             "GROUP BY run_id HAVING count(*) <> 1")  # fmt: skip
    assert doubled == []
    assert _effects(settings) == RESUMES
    assert scalar(settings, "SELECT count(*) FROM matcher.runs") == RESUMES
    assert scalar(settings, "SELECT count(*) FROM matcher.runs WHERE version <> 1") == 0


def test_node_is_the_one_the_package_asks_for() -> None:
    """The package's engines and the machine agree (Node 20 or newer)."""
    node = shutil.which("node")
    assert node is not None, "the TypeScript SDK's tests need Node.js 20+ on the PATH"
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True,
                             timeout=30).stdout  # fmt: skip
    assert int(version.lstrip("v").split(".")[0]) >= 20, version
    assert os.access(SDK / "package-lock.json", os.R_OK)


@pytest.mark.timeout(600)
async def test_the_typescript_producer_posts_to_the_webhook_ingress(
    typescript_sdk: Path, webhooks_secure: Settings, ingress: IngressProcess
) -> None:
    """postEvent, binary and structured mode, through a real ingress to resumed runs."""
    assert ingress.address is not None
    runs = {
        wait_for(webhooks_secure, "acme", "job.completed", "ts-http é 1"),
        wait_for(webhooks_secure, "acme", "job.completed", "ts-http-2"),
    }
    async with running_daemon(webhooks_secure):
        await _node_test(
            webhooks_secure, "dist/test/integration/ingress.test.js", timeout=60,
            MATCHER_TEST_INGRESS=ingress.address, MATCHER_TEST_SIGNING_KEY=STANDARD_SECRET,
        )  # fmt: skip
        resumes = await read_resumes(webhooks_secure, at_least=2)
    assert {r.run_id for r in resumes} == runs
