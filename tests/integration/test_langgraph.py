"""LangGraph through matcher, against the real daemon, broker and Postgres: a node launches
a job and waits; the graph's first run ends; the job's event resolves the wait; the
resumer resumes that interrupt by its id, with the checkpoint, the run's advance and the
node's write in one transaction. And each trap a user falls into by hand: the event
before the interrupt is checkpointed, the event before the run starts, duplicates and
forgeries, a deadline then a late event, threads completed in reverse order, parallel
interrupts in one graph, a sync graph, a checkpointer that is not the worker's."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg_pool import ConnectionPool

from matcher.config import Settings
from matcher.domain.resume import ResumeData
from matcher.integrations.langgraph import (
    GraphResumer,
    NotBoundToTheWorker,
    SyncGraphResumer,
    Waits,
)
from matcher.sdk import advance_async, committed_resume
from matcher.sdk.worker import Retry, metrics
from tests.support import graphs
from tests.support.assertions import eventually
from tests.support.db import db, rows, scalar
from tests.support.kafka import produce, read_resume_messages, started, within
from tests.support.processes import DaemonProcess, process_env, run_cli, running_daemon
from tests.support.records import event
from tests.support.worker import running_worker, worker_settings

pytestmark = pytest.mark.timeout(240)


def _url(settings: Settings) -> str:
    return settings.database_url.get_secret_value()


def _jobs(settings: Settings, thread: str) -> list[dict[str, Any]]:
    """The fake service's jobs of ``thread``, oldest first."""
    return rows(
        settings,
        "SELECT * FROM lg_jobs WHERE run_id LIKE %s ORDER BY at",
        [f"langgraph:{thread}/%"],
    )


def _effects(settings: Settings, thread: str) -> list[dict[str, Any]]:
    return rows(settings, "SELECT node, outcome, data FROM lg_effects WHERE thread = %s "
                          "ORDER BY at", [thread])  # fmt: skip


def _resumes(settings: Settings, thread: str) -> int:
    """How many resume values LangGraph stored for ``thread`` (one per resumed interrupt)."""
    return int(
        scalar(
            settings,
            "SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s AND channel = "
            "'__resume__'",
            [thread],
        )
    )


async def _complete(settings: Settings, job: dict[str, Any], rows_: int) -> None:
    await produce(settings, [event(correlation=job["correlation_id"], data={"rows": rows_})])


def _duplicates() -> float:
    return float(metrics.RESUMES.labels("duplicate", "topic")._value.get())


async def _until_finished(
    settings: Settings, builder: Any, thread: str, timeout: float = 90
) -> Any:
    """The thread's state once it has nothing left to run (polled: a condition with a
    deadline)."""
    url = _url(settings)
    deadline = time.monotonic() + timeout
    while True:
        state = await graphs.state_of(builder, url, thread)
        if not state.next and not state.interrupts:
            return state
        assert time.monotonic() < deadline, f"thread {thread} did not finish: {state.next}"
        await asyncio.sleep(0.1)


async def test_a_launched_job_resumes_its_graph_once(settings: Settings) -> None:
    url = _url(settings)
    graphs.setup(url)
    waits = Waits(graphs.TENANT, url)
    builder = graphs.job_graph(waits, url)
    thread = f"t-{uuid.uuid4().hex[:8]}"
    first = await graphs.start(builder, url, thread, {"log": []})
    [pending] = first["__interrupt__"]
    request = pending.value["matcher_wait"]
    [job] = _jobs(settings, thread)
    assert request["correlation_id"] == job["correlation_id"]
    assert request["run_id"] == job["run_id"]
    resumer = GraphResumer(graphs.compiled(builder))
    worker = worker_settings(settings)
    async with running_daemon(settings), running_worker(worker, resumer, resumer.accepts):
        await _complete(settings, job, 1200)
        state = await _until_finished(settings, builder, thread)
        # The resume delivered again: a duplicate, the graph untouched.
        duplicates = _duplicates()
        messages = await read_resume_messages(settings, at_least=1)
        async with started(AIOKafkaProducer(**settings.kafka_client_options())) as p:
            for message in messages:
                await within(p.send_and_wait(settings.resume_topic, message))
        await eventually(lambda: _duplicates() > duplicates, timeout=60,
                         what="the redelivery seen as a duplicate")  # fmt: skip
    assert state.values["log"] == ["launch:event", "done"]
    assert _effects(settings, thread) == [
        {"node": "launch", "outcome": "event", "data": {"rows": 1200}}
    ]
    assert len(_jobs(settings, thread)) == 1  # submitted once, though the node ran twice
    assert _resumes(settings, thread) == 1
    explained = json.loads(run_cli(settings, "explain", request["run_id"], "--json").stdout)
    assert any("the run advanced past position" in r for r in explained["reasons"])


def _outcomes(name: str) -> float:
    return float(metrics.RESUMES.labels(name, "topic")._value.get())


async def test_an_event_before_the_interrupt_is_checkpointed_waits_for_it(
    settings: Settings,
) -> None:
    """The job finishes before its node has interrupted: the resume is published while
    the thread has no checkpoint with that interrupt. The resumer retries (this run only)
    and resumes once the first run has checkpointed it; never a run from scratch."""
    url = _url(settings)
    graphs.setup(url)
    thread = f"early-{uuid.uuid4().hex[:8]}"

    async def finish_at_once(launch: Any) -> None:
        await produce(settings, [event(correlation=launch.correlation_id, data={"rows": 7})])
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.resolutions o JOIN matcher.waits"
                                     " w ON w.id = o.wait_id WHERE w.run_id = %s AND "
                                     "o.published", [launch.run_id]) == 1,
            timeout=60, what="the resume published before the node interrupts",
        )  # fmt: skip
        await eventually(lambda: _outcomes("not_ready") > not_ready, timeout=60,
                         what="the resumer finding the interrupt not checkpointed")  # fmt: skip

    waits = Waits(graphs.TENANT, url)
    builder = graphs.job_graph(waits, url, after_submit=finish_at_once)
    resumer = GraphResumer(graphs.compiled(builder), not_ready_after_s=0.2)
    not_ready = _outcomes("not_ready")
    worker = worker_settings(settings)
    async with running_daemon(settings), running_worker(worker, resumer, resumer.accepts):
        await graphs.start(builder, url, thread, {"log": []})
        state = await _until_finished(settings, builder, thread)
    assert state.values["log"] == ["launch:event", "done"]
    assert [e["outcome"] for e in _effects(settings, thread)] == ["event"]
    assert len(_jobs(settings, thread)) == 1
    assert _resumes(settings, thread) == 1


async def test_an_event_before_the_run_starts_is_kept_for_its_wait(settings: Settings) -> None:
    url = _url(settings)
    graphs.setup(url)
    thread = f"before-{uuid.uuid4().hex[:8]}"
    correlation = f"approval-{uuid.uuid4().hex[:8]}"
    builder = graphs.approval_graph(Waits(graphs.TENANT, url))
    resumer = GraphResumer(graphs.compiled(builder))
    worker = worker_settings(settings)
    async with running_daemon(settings), running_worker(worker, resumer, resumer.accepts):
        await produce(settings, [event(correlation=correlation, type_="approval.granted",
                                       data={"by": "ops"})])  # fmt: skip
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox WHERE correlation_id"
                                     " = %s", [correlation]) == 1,
            timeout=60, what="the approval stored before any wait",
        )  # fmt: skip
        await graphs.start(builder, url, thread, {"log": [], "correlation": correlation})
        state = await _until_finished(settings, builder, thread)
    assert state.values["log"] == ["approve:event"]
    assert _effects(settings, thread) == [
        {"node": "approve", "outcome": "event", "data": {"by": "ops"}}
    ]


async def test_a_fan_in_wait_resumes_the_graph_once_with_every_event(settings: Settings) -> None:
    url = _url(settings)
    graphs.setup(url)
    thread = f"fan-in-{uuid.uuid4().hex[:8]}"
    correlation = f"approval-{uuid.uuid4().hex[:8]}"
    builder = graphs.two_approvals_graph(Waits(graphs.TENANT, url))
    resumer = GraphResumer(graphs.compiled(builder))
    granted = "approval.granted"
    sent = [
        event(correlation=correlation + "-2", type_=granted, data={"by": "no", "answer": "no"}),
        event(correlation=correlation, type_=granted, data={"by": "ops"}),
        event(correlation=correlation + "-2", type_=granted, data={"by": "cfo", "answer": "yes"}),
    ]
    async with (
        running_daemon(settings),
        running_worker(worker_settings(settings), resumer, resumer.accepts),
    ):
        await graphs.start(builder, url, thread, {"log": [], "correlation": correlation})
        await produce(settings, sent)
        state = await _until_finished(settings, builder, thread)
    assert state.values["log"] == ["approve:event:cfo,ops"]
    assert _resumes(settings, thread) == 1


async def test_a_deadline_takes_the_timeout_branch_and_a_later_event_is_late(
    settings: Settings,
) -> None:
    url = _url(settings)
    graphs.setup(url)
    thread = f"late-{uuid.uuid4().hex[:8]}"
    builder = graphs.job_graph(Waits(graphs.TENANT, url), url, timeout=timedelta(seconds=1))
    resumer = GraphResumer(graphs.compiled(builder))
    quick = settings.model_copy(update={"sweep_interval_s": 0.2})
    worker = worker_settings(settings)
    async with running_daemon(quick), running_worker(worker, resumer, resumer.accepts):
        await graphs.start(builder, url, thread, {"log": []})
        state = await _until_finished(settings, builder, thread)
        [job] = _jobs(settings, thread)
        await _complete(settings, job, 5)
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox WHERE correlation_id"
                                     " = %s", [job["correlation_id"]]) == 1,
            timeout=60, what="the late event stored",
        )  # fmt: skip
    assert state.values["log"] == ["launch:timeout", "timed_out"]
    assert [e["outcome"] for e in _effects(settings, thread)] == ["timeout"]
    explained = json.loads(run_cli(settings, "explain", job["run_id"], "--json").stdout)
    assert explained["verdict"] == "timed_out"
    assert explained["evidence"]["late_events"], explained


async def test_two_threads_completed_in_reverse_order(settings: Settings) -> None:
    url = _url(settings)
    graphs.setup(url)
    builder = graphs.job_graph(Waits(graphs.TENANT, url), url)
    threads = [f"rev-{n}-{uuid.uuid4().hex[:6]}" for n in range(2)]
    for thread in threads:
        await graphs.start(builder, url, thread, {"log": []})
    resumer = GraphResumer(graphs.compiled(builder))
    worker = worker_settings(settings)
    async with running_daemon(settings), running_worker(worker, resumer, resumer.accepts):
        for n, thread in enumerate(reversed(threads)):
            [job] = _jobs(settings, thread)
            await _complete(settings, job, n)
            await _until_finished(settings, builder, thread)
        assert len(_effects(settings, threads[0])) == 1  # the first finished last
    for n, thread in enumerate(reversed(threads)):
        assert _effects(settings, thread) == [
            {"node": "launch", "outcome": "event", "data": {"rows": n}}
        ]
        assert _resumes(settings, thread) == 1


async def test_parallel_interrupts_in_one_graph_are_each_resumed_by_their_own_event(
    settings: Settings,
) -> None:
    """Three tasks of one step each launch a job and wait (three interrupts pending at
    once); the jobs finish in reverse order, two of them together: each interrupt gets its
    own job's resume, and the thread's resumes are applied one after the other."""
    url = _url(settings)
    graphs.setup(url)
    builder = graphs.fan_out_graph(Waits(graphs.TENANT, url), url)
    thread = f"fan-{uuid.uuid4().hex[:8]}"
    first = await graphs.start(builder, url, thread, {"log": [], "items": ["a", "b", "c"]})
    assert len(first["__interrupt__"]) == 3
    jobs = _jobs(settings, thread)
    assert len(jobs) == 3
    by_run = {j["run_id"]: j for j in jobs}
    items = {
        i.value["matcher_wait"]["run_id"]: i for i in first["__interrupt__"]
    }  # run id -> interrupt
    assert set(items) == set(by_run)
    resumer = GraphResumer(graphs.compiled(builder))
    # One resume per transaction, several at once: the thread's lock is what orders them.
    worker = worker_settings(settings, worker_batch_max=1, worker_concurrency=4)
    async with running_daemon(settings), running_worker(worker, resumer, resumer.accepts):
        last, *together = list(reversed(jobs))
        await _complete(settings, last, 100)
        await eventually(lambda: len(_effects(settings, thread)) == 1, timeout=60,
                         what="the first job's task resumed")  # fmt: skip
        await produce(settings, [event(correlation=j["correlation_id"], data={"rows": n})
                                 for n, j in enumerate(together)])  # fmt: skip
        state = await _until_finished(settings, builder, thread)
    assert sorted(state.values["log"]) == ["a:event", "b:event", "c:event", "joined:3"]
    effects = _effects(settings, thread)
    assert sorted(e["node"] for e in effects) == ["work:a", "work:b", "work:c"]
    assert len(_jobs(settings, thread)) == 3  # each job submitted once
    assert _resumes(settings, thread) == 3


async def test_a_sync_graph_resumes_through_the_sync_resumer(settings: Settings) -> None:
    url = _url(settings)
    graphs.setup(url)
    builder = graphs.sync_job_graph(Waits(graphs.TENANT, url), url)
    thread = f"sync-{uuid.uuid4().hex[:8]}"
    graphs.start_sync(builder, url, thread, {"log": []})
    resumer = SyncGraphResumer(graphs.compiled(builder))
    worker = worker_settings(settings)
    async with running_daemon(settings), running_worker(worker, resumer, resumer.accepts):
        [job] = _jobs(settings, thread)
        await _complete(settings, job, 3)
        state = await _until_finished(settings, builder, thread)
    assert state.values["log"] == ["launch:event"]
    assert _effects(settings, thread) == [
        {"node": "launch", "outcome": "event", "data": {"rows": 3}}
    ]
    assert _resumes(settings, thread) == 1


def _resume_for(run_id: str, wait_id: uuid.UUID | None = None) -> ResumeData:
    now = "2026-01-01T00:00:00Z"
    return ResumeData.model_validate({
        "resolution_id": str(uuid.uuid4()), "tenant": graphs.TENANT, "run_id": run_id,
        "position": 0, "outcome": "timeout", "wait_id": str(wait_id or uuid.uuid4()),
        "correlation_id": "c", "event_types": ["job.completed"], "created_at": now,
        "resolved_at": now,
    })  # fmt: skip


async def test_a_thread_without_a_checkpoint_is_never_resumed(settings: Settings) -> None:
    """A resume for a thread that has no checkpoint (or not this interrupt) is not applied:
    LangGraph would run the graph again from the start and drop the value."""
    url = _url(settings)
    graphs.setup(url)
    builder = graphs.job_graph(Waits(graphs.TENANT, url), url)
    resumer = GraphResumer(graphs.compiled(builder))
    resume = _resume_for(f"langgraph:nobody-{uuid.uuid4().hex[:6]}/{'0' * 32}")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as tx:
        with pytest.raises(Retry, match="no checkpoint"):
            async with tx.transaction():
                await resumer(tx, resume)
    assert scalar(settings, "SELECT count(*) FROM checkpoints") == 0
    assert scalar(settings, "SELECT count(*) FROM lg_jobs") == 0


def test_a_checkpointer_on_a_pool_is_refused(settings: Settings) -> None:
    url = _url(settings)
    graphs.setup(url)
    builder = graphs.sync_job_graph(Waits(graphs.TENANT, url), url)
    with ConnectionPool(url, min_size=1, max_size=1, open=True) as pool:
        resumer = SyncGraphResumer(
            graphs.compiled(builder),
            checkpointer=lambda _tx: PostgresSaver(pool),  # type: ignore[arg-type]
        )
        resume = _resume_for(f"langgraph:t/{'0' * 32}")
        with db(settings) as tx, pytest.raises(NotBoundToTheWorker, match="commits each"):
            resumer(tx, resume)


async def test_two_resumes_of_one_thread_at_once_are_applied_in_turn(
    settings: Settings,
) -> None:
    """Two workers' transactions resume two interrupts of one thread at the same moment:
    the thread's lock makes the second read the state the first committed, so neither
    resume is lost (without it, both would continue from the same checkpoint)."""
    url = _url(settings)
    graphs.setup(url)
    builder = graphs.fan_out_graph(Waits(graphs.TENANT, url), url)
    thread = f"race-{uuid.uuid4().hex[:8]}"
    await graphs.start(builder, url, thread, {"log": [], "items": ["a", "b"]})
    jobs = _jobs(settings, thread)
    async with running_daemon(settings):
        await produce(settings, [event(correlation=j["correlation_id"]) for j in jobs])
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.waits WHERE run_id LIKE %s"
                                     " AND state = 'matched'", [f"langgraph:{thread}/%"]) == 2,
            timeout=60, what="both waits resolved",
        )  # fmt: skip
    waits = rows(settings, "SELECT id FROM matcher.waits WHERE run_id LIKE %s",
                 [f"langgraph:{thread}/%"])  # fmt: skip
    with db(settings) as conn:
        resumes = [committed_resume(conn, w["id"]) for w in waits]
    resumer = GraphResumer(graphs.compiled(builder))

    async def apply(resume: ResumeData | None) -> None:
        assert resume is not None
        connecting = psycopg.AsyncConnection.connect(url, autocommit=True)
        async with await connecting as tx, tx.transaction():
            assert await advance_async(tx, resume)
            await resumer(tx, resume)
            await asyncio.sleep(0.5)  # hold the transaction open while the other starts

    await asyncio.gather(*(apply(r) for r in resumes))
    state = await graphs.state_of(builder, url, thread)
    assert not state.interrupts
    assert not state.next
    assert sorted(state.values["log"]) == ["a:event", "b:event", "joined:2"]
    assert len(_effects(settings, thread)) == 2


def test_the_documented_langgraph_agent_runs(settings: Settings) -> None:
    """examples/langgraph_agent.py, its three commands as the docs give them."""
    daemon = DaemonProcess(process_env(settings))
    daemon.wait_ready()
    examples = Path(__file__).resolve().parents[2] / "examples"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "langgraph_agent.py", *args], cwd=examples,
            env=process_env(settings), capture_output=True, text=True, timeout=150,
            check=False,
        )  # fmt: skip

    try:
        done = [run(command, "report-42") for command in ("start", "finish", "resume")]
    finally:
        assert daemon.terminate() == 0, daemon.output
    for step in done:
        assert step.returncode == 0, step.stderr
    assert "report-42: waiting for job acme:langgraph:report-42/" in done[0].stdout
    assert "report-42: job job-" in done[1].stdout
    assert "report-42: sales has 1200 rows" in done[2].stdout
    assert scalar(settings, "SELECT count(*) FROM demo_batch_jobs") == 1
