"""Launch intents, reconciliation, lookups by job id, and the documented worker flow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg

from matcher.config import Settings
from matcher.sdk import (
    LaunchSpec,
    audit_trail,
    get_launch,
    get_wait,
    record_job_id,
    record_launch,
)
from tests.support.kafka import produce, read_resumes
from tests.support.processes import DaemonProcess, process_env, running_daemon
from tests.support.records import event

ROOT = Path(__file__).parents[2]


def _spec(key: str, run: str = "run-l") -> LaunchSpec:
    return LaunchSpec(
        tenant="acme", run_id=run, position=0, event_types=["job.completed"], idempotency_key=key
    )


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "matcher", *args],
        env=process_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def test_launch_is_idempotent_and_job_id_reaches_the_wait(settings: Settings) -> None:
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        first = record_launch(conn, _spec("k-1"))
        again = record_launch(conn, _spec("k-1"))  # a retry after a crash
        assert again.id == first.id
        assert again.correlation_id == first.correlation_id
        wait = get_wait(conn, first.wait_id)
        assert wait is not None
        assert wait.correlation_id == first.correlation_id
        assert wait.state == "waiting"
        assert record_job_id(conn, first.id, "job-42")
        assert record_job_id(conn, first.id, "job-42")  # the same id again: fine
        assert not record_job_id(conn, first.id, "job-43")  # a different one: refused
        launch = get_launch(conn, first.id)
        assert launch is not None
        assert (launch.state, launch.external_job_id) == ("submitted", "job-42")
        wait = get_wait(conn, first.wait_id)
        assert wait is not None
        assert wait.external_job_id == "job-42"
        assert [a["answer"] for a in audit_trail(conn, first.id)] == ["submitted"]
    by_job = _cli(settings, "waits", "list", "--job-id", "job-42", "--json")
    assert [w["id"] for w in json.loads(by_job.stdout)] == [str(first.wait_id)]


async def test_completion_while_the_worker_dies_still_matches(settings: Settings) -> None:
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        launch = record_launch(conn, _spec("k-dying", run="run-dying"))
    # The worker died before recording the job id; the job ran and reported anyway.
    async with running_daemon(settings):
        await produce(settings, [event(correlation=launch.correlation_id, job_id="job-7")])
        [resume] = await read_resumes(settings, at_least=1)
    assert resume.run_id == "run-dying"
    assert resume.event is not None
    assert resume.event.external_job_id == "job-7"
    events = _cli(settings, "events", "list", "--job-id", "job-7", "--json")
    assert [e["correlation_id"] for e in json.loads(events.stdout)] == [launch.correlation_id]


async def test_reconcile_records_every_answer(settings: Settings) -> None:
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        launches = {
            key: record_launch(conn, _spec(key, run=f"run-{key}"))
            for key in ("found-1", "missing-1", "down-1", "broken-1", "submitted-1")
        }
        record_job_id(conn, launches["submitted-1"].id, "job-s")
    result = _cli(
        settings, "reconcile", "--reconciler", "tests.reconcilers:lookup", "--older-than", "0",
        "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    answers = {r["run_id"]: r["answer"] for r in json.loads(result.stdout)}
    assert answers == {
        "run-found-1": "found",
        "run-missing-1": "not_found",
        "run-down-1": "unknown",
        "run-broken-1": "error",
    }  # the submitted one is not asked about
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        found = get_launch(conn, launches["found-1"].id)
        assert found is not None
        assert (found.state, found.external_job_id) == ("reconciled", "job-for-found-1")
        missing = get_launch(conn, launches["missing-1"].id)
        assert missing is not None
        assert missing.state == "failed"
        cancelled = get_wait(conn, missing.wait_id)
        assert cancelled is not None
        assert cancelled.state == "cancelled"
        down = get_launch(conn, launches["down-1"].id)
        assert down is not None
        assert (down.state, down.reconcile_attempts) == ("intent", 1)
        trail = audit_trail(conn, launches["broken-1"].id)
        assert trail[-1]["answer"] == "error"
        assert "500" in trail[-1]["detail"]
    # A second pass asks again only about the ones still undecided.
    again = _cli(
        settings, "reconcile", "--reconciler", "tests.reconcilers:lookup", "--older-than", "0",
        "--json",
    )  # fmt: skip
    assert sorted(r["run_id"] for r in json.loads(again.stdout)) == ["run-broken-1", "run-down-1"]
    shown = _cli(settings, "launches", "show", str(launches["found-1"].id), "--json")
    assert [a["answer"] for a in json.loads(shown.stdout)["audit"]] == ["found"]
    bad = _cli(settings, "reconcile", "--reconciler", "tests.nothing:here")
    assert bad.returncode == 2


def test_the_documented_worker_flow_runs(settings: Settings) -> None:
    daemon = DaemonProcess(process_env(settings))
    daemon.wait_ready()
    try:
        flow = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "worker_flow.py")],
            env=process_env(settings),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        assert daemon.terminate() == 0, daemon.output
    assert flow.returncode == 0, flow.stderr
    assert "worker A: started job-" in flow.stdout
    assert "continues after event" in flow.stdout
    assert "1200 rows" in flow.stdout  # the handler's write, committed with the advance
