"""A LangGraph agent that starts a batch job, lets its worker go, and carries on with the
job's result when the job's completion event arrives: exactly once, through matcher.

Deterministic (no model, no network beyond Kafka and Postgres). Against `make run`, with
the same environment (`eval "$(matcher devstack env)"`), from the examples directory:

    python langgraph_agent.py start report-42     # plans, launches the job, waits
    python langgraph_agent.py finish report-42    # the batch service reports the job done
    python langgraph_agent.py resume report-42    # the resume worker carries the graph on

`start` ends with the graph interrupted and no process left holding it. `resume` runs the
resume worker until this thread has finished, then prints the agent's answer; in
production that worker is `matcher worker --handler langgraph_agent:resumer` with
MATCHER_WORKER_RUN_PREFIX=langgraph: (every thread, for ever).

The graph: plan -> run_job -> summarize. ``run_job`` records the launch and its wait,
calls the batch service once, and interrupts; when resumed, LangGraph runs it again from
the top, ``launch_and_wait`` finds the launch recorded (the job is not started twice) and
returns the resume. ``summarize`` writes the agent's answer through the resumer's
transaction, so it commits with the checkpoint and the run's advance, or not at all.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import sys
from datetime import timedelta
from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.pregel import Pregel
from matcher_producer import CompletionEvent, EventPublisher
from psycopg.rows import dict_row

from matcher.config import WorkerSettings
from matcher.domain.launches import Launch
from matcher.integrations.langgraph import GraphResumer, Waits, transaction
from matcher.sdk.worker import ResumeWorker

DATABASE_URL = os.environ["MATCHER_DATABASE_URL"]
KAFKA = os.environ["MATCHER_KAFKA_BOOTSTRAP_SERVERS"]
EVENTS_TOPIC = os.environ.get("MATCHER_EVENTS_TOPIC", "matcher.events")

# The batch service, standing in for a real one: its jobs, and the agent's answers.
TABLES = """
CREATE TABLE IF NOT EXISTS demo_batch_jobs (
    job_id text PRIMARY KEY, idempotency_key text UNIQUE NOT NULL,
    correlation_id text NOT NULL, report text NOT NULL, done boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS demo_answers (thread text PRIMARY KEY, answer text NOT NULL);
"""

waits = Waits(tenant="acme", database_url=DATABASE_URL)


class State(TypedDict, total=False):
    report: str
    steps: Annotated[list[str], operator.add]
    rows: int
    answer: str


async def start_batch_job(launch: Launch) -> str:
    """The batch service's API: start a job (idempotent on the key), return its id."""
    job_id = f"job-{launch.idempotency_key[-8:]}"
    async with await psycopg.AsyncConnection.connect(DATABASE_URL, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO demo_batch_jobs (job_id, idempotency_key, correlation_id, report) "
            "VALUES (%s, %s, %s, 'sales') ON CONFLICT (idempotency_key) DO NOTHING",
            [job_id, launch.idempotency_key, launch.correlation_id],
        )
    return job_id


async def plan(state: State) -> State:
    return {"steps": [f"plan: count the rows of {state['report']}"]}


async def run_job(state: State) -> State:
    resume = await waits.alaunch_and_wait(
        start_batch_job, event_types=["job.completed", "job.failed"], timeout=timedelta(hours=1)
    )
    if resume.event is None:  # the deadline passed, or the launch was cancelled
        return {"steps": [f"run_job: {resume.outcome}"], "rows": -1}
    rows = int(resume.event.data["rows"]) if resume.event.type == "job.completed" else -1
    return {"steps": [f"run_job: {resume.event.type}"], "rows": rows}


async def summarize(state: State) -> State:
    answer = (
        f"{state['report']} has {state['rows']} rows"
        if state["rows"] >= 0
        else f"{state['report']}: the job did not finish"
    )
    tx = transaction()  # the resumer's: the answer commits with the graph's checkpoint
    if tx is not None:
        await tx.execute(
            "INSERT INTO demo_answers (thread, answer) VALUES (%s, %s)",
            [_thread(), answer],
        )
    return {"steps": ["summarize"], "answer": answer}


def _thread() -> str:
    from langgraph.config import get_config

    return str(get_config()["configurable"]["thread_id"])


def build() -> StateGraph[Any]:
    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_node("run_job", run_job)
    builder.add_node("summarize", summarize)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "run_job")
    builder.add_edge("run_job", "summarize")
    builder.add_edge("summarize", END)
    return builder


graph: Pregel[Any, Any, Any, Any] = build().compile()
# `matcher worker --handler langgraph_agent:resumer` (MATCHER_WORKER_RUN_PREFIX=langgraph:)
resumer = GraphResumer(graph)


def _config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def setup() -> None:
    with psycopg.connect(DATABASE_URL, autocommit=True, row_factory=dict_row) as conn:
        conn.execute(TABLES)
        PostgresSaver(conn).setup()  # LangGraph's checkpoint tables, in matcher's database


async def start(thread: str) -> None:
    setup()
    async with await psycopg.AsyncConnection.connect(
        DATABASE_URL, autocommit=True, row_factory=dict_row
    ) as conn:
        app = graph.copy(update={"checkpointer": AsyncPostgresSaver(conn)})
        result = await app.ainvoke({"report": "sales", "steps": []}, _config(thread))
    [waiting] = result["__interrupt__"]
    wait = waiting.value["matcher_wait"]
    print(f"{thread}: waiting for job {wait['idempotency_key']} (wait {wait['wait_id']})")


async def finish(thread: str) -> None:
    """The batch service finishes the thread's job and publishes its completion event."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        job = conn.execute(
            "UPDATE demo_batch_jobs SET done = true WHERE idempotency_key LIKE %s "
            "RETURNING job_id, correlation_id",
            [f"acme:langgraph:{thread}/%"],
        ).fetchone()
    if job is None:
        sys.exit(f"{thread}: no job started (run `start {thread}` first)")
    async with EventPublisher(KAFKA, EVENTS_TOPIC, keys=None) as publisher:
        await publisher.publish(
            CompletionEvent(
                source="batch-svc", type="job.completed", tenant="acme",
                correlation_id=job[1], job_id=job[0], data={"rows": 1200},
            )
        )  # fmt: skip
    print(f"{thread}: job {job[0]} completed")


async def resume(thread: str, timeout_s: float = 120) -> None:
    """The resume worker, embedded, until this thread's answer is committed."""
    settings = WorkerSettings(worker_run_prefix="langgraph:")
    worker = ResumeWorker(resumer, settings, accept=resumer.accepts)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        async with asyncio.timeout(timeout_s):
            while (answer := _answer(thread)) is None:
                if running.done():
                    running.result()
                await asyncio.sleep(0.2)  # polling the application's table
    finally:
        stop.set()
        await running
    print(f"{thread}: {answer}")


def _answer(thread: str) -> str | None:
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        row = conn.execute("SELECT answer FROM demo_answers WHERE thread = %s", [thread])
        found = row.fetchone()
    return None if found is None else str(found[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "finish", "resume"])
    parser.add_argument("thread")
    args = parser.parse_args()
    command = {"start": start, "finish": finish, "resume": resume}[args.command]
    asyncio.run(command(args.thread))


if __name__ == "__main__":
    main()
