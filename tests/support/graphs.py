"""LangGraph graphs for the integration's tests: deterministic agents (no model, no
network) whose nodes launch fake batch jobs or wait for events through matcher.

The fake batch service is a table: ``submit`` inserts the job (its idempotency key and
correlation id) and the test sends the job's completion event. Each node that resumes
writes one row in ``lg_effects`` through the resumer's transaction (no unique key: a
second row would be a double). ``resumer`` and ``sync_resumer`` are importable as
``tests.support.graphs:resumer`` for ``matcher worker --handler`` (they read
MATCHER_DATABASE_URL).
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import cache
from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Send
from psycopg.rows import dict_row

from matcher.domain.launches import Launch
from matcher.domain.resume import ResumeData
from matcher.integrations.langgraph import GraphResumer, Waits, transaction

TENANT = "acme"
JOB_TYPES = ["job.completed", "job.failed"]
TABLES = """
CREATE TABLE IF NOT EXISTS lg_jobs (
    idempotency_key text NOT NULL, correlation_id text NOT NULL, run_id text NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS lg_effects (
    thread text NOT NULL, node text NOT NULL, outcome text NOT NULL, data jsonb,
    at timestamptz NOT NULL DEFAULT now()
);
"""


def setup(url: str) -> None:
    """The fake service's and the effects' tables, and LangGraph's checkpoint tables (its
    setup creates indexes concurrently: outside a transaction)."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute(TABLES)
        PostgresSaver(conn).setup()


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    items: list[str]
    correlation: str


def _job_id(launch: Launch) -> str:
    return f"job-{launch.idempotency_key[-12:]}"


def _submit_sql(launch: Launch) -> tuple[str, list[Any]]:
    return (
        "INSERT INTO lg_jobs (idempotency_key, correlation_id, run_id) VALUES (%s, %s, %s)",
        [launch.idempotency_key, launch.correlation_id, launch.run_id],
    )


def _outcome(resume: ResumeData) -> tuple[str, str | None]:
    data = None if resume.event is None else json.dumps(resume.event.data)
    return str(resume.outcome), data


def _thread() -> str:
    from langgraph.config import get_config

    return str(get_config()["configurable"]["thread_id"])


async def _effect(node: str, resume: ResumeData) -> None:
    tx = transaction()
    assert tx is not None, "a resumed node runs under the resumer"
    outcome, data = _outcome(resume)
    await tx.execute(
        "INSERT INTO lg_effects (thread, node, outcome, data) VALUES (%s, %s, %s, %s)",
        [_thread(), node, outcome, data],
    )


def _effect_sync(node: str, resume: ResumeData) -> None:
    tx = transaction()
    assert tx is not None, "a resumed node runs under the resumer"
    outcome, data = _outcome(resume)
    tx.execute(
        "INSERT INTO lg_effects (thread, node, outcome, data) VALUES (%s, %s, %s, %s)",
        [_thread(), node, outcome, data],
    )


AfterSubmit = Callable[[Launch], Awaitable[None]]


def job_graph(
    waits: Waits,
    url: str,
    *,
    timeout: timedelta | None = None,
    after_submit: AfterSubmit | None = None,
) -> StateGraph[Any]:
    """START -> launch (a job, waited for) -> done | timed_out -> END. ``after_submit``
    runs once the job is submitted, before the node interrupts (a job that finishes at
    once)."""

    async def submit(launch: Launch) -> str:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(*_submit_sql(launch))
        if after_submit is not None:
            await after_submit(launch)
        return _job_id(launch)

    async def launch(state: State) -> State:
        resume = await waits.alaunch_and_wait(submit, event_types=JOB_TYPES, timeout=timeout)
        await _effect("launch", resume)
        return {"log": [f"launch:{resume.outcome}"]}

    async def done(state: State) -> State:
        return {"log": ["done"]}

    async def timed_out(state: State) -> State:
        return {"log": ["timed_out"]}

    def route(state: State) -> str:
        return "timed_out" if state["log"][-1] == "launch:timeout" else "done"

    builder = StateGraph(State)
    builder.add_node("launch", launch)
    builder.add_node("done", done)
    builder.add_node("timed_out", timed_out)
    builder.add_edge(START, "launch")
    builder.add_conditional_edges("launch", route, ["done", "timed_out"])
    builder.add_edge("done", END)
    builder.add_edge("timed_out", END)
    return builder


def fan_out_graph(waits: Waits, url: str) -> StateGraph[Any]:
    """One job per item, launched by parallel tasks (``Send``): several interrupts of one
    thread pending at once, each resumed by its own job's event; then a join, which runs
    only once the last of them is resumed."""

    async def submit(launch: Launch) -> str:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(*_submit_sql(launch))
        return _job_id(launch)

    def fan(state: State) -> list[Send]:
        return [Send("work", {"items": [item]}) for item in state["items"]]

    async def work(state: State) -> State:
        resume = await waits.alaunch_and_wait(submit, event_types=JOB_TYPES)
        await _effect(f"work:{state['items'][0]}", resume)
        return {"log": [f"{state['items'][0]}:{resume.outcome}"]}

    async def join(state: State) -> State:
        return {"log": [f"joined:{len(state['log'])}"]}

    builder = StateGraph(State)
    builder.add_node("work", work)
    builder.add_node("join", join)
    builder.add_conditional_edges(START, fan, ["work"])
    builder.add_edge("work", "join")
    builder.add_edge("join", END)
    return builder


def approval_graph(waits: Waits) -> StateGraph[Any]:
    """A wait without a launch: an event someone else sends, by a known correlation id."""

    async def approve(state: State) -> State:
        resume = await waits.await_event(
            event_types=["approval.granted"], correlation_id=state["correlation"]
        )
        await _effect("approve", resume)
        return {"log": [f"approve:{resume.outcome}"]}

    builder = StateGraph(State)
    builder.add_node("approve", approve)
    builder.add_edge(START, "approve")
    builder.add_edge("approve", END)
    return builder


def two_approvals_graph(waits: Waits) -> StateGraph[Any]:
    """A fan-in wait: both approvers, the second only with a yes in its data."""

    async def approve(state: State) -> State:
        resume = await waits.await_event(
            conditions=[
                {"event_types": ["approval.granted"], "correlation_id": state["correlation"]},
                {"event_types": ["approval.granted"], "correlation_id": state["correlation"] + "-2",
                 "condition": '$.answer == "yes"'},
            ],
            rule="all",
        )  # fmt: skip
        by = sorted(e.data["by"] for e in resume.events or [])
        return {"log": [f"approve:{resume.outcome}:{','.join(by)}"]}

    builder = StateGraph(State)
    builder.add_node("approve", approve)
    builder.add_edge(START, "approve")
    builder.add_edge("approve", END)
    return builder


def sync_job_graph(waits: Waits, url: str) -> StateGraph[Any]:
    """``job_graph``'s launch with sync nodes, for the sync resumer."""

    def submit(launch: Launch) -> str:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(*_submit_sql(launch))
        return _job_id(launch)

    def launch(state: State) -> State:
        resume = waits.launch_and_wait(submit, event_types=JOB_TYPES)
        _effect_sync("launch", resume)
        return {"log": [f"launch:{resume.outcome}"]}

    builder = StateGraph(State)
    builder.add_node("launch", launch)
    builder.add_edge(START, "launch")
    builder.add_edge("launch", END)
    return builder


async def start(builder: StateGraph[Any], url: str, thread: str, state: State) -> dict[str, Any]:
    """The graph's first run, by the application (its own checkpointer, on a connection
    of its own): until it waits."""
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row
    ) as conn:
        graph = builder.compile(checkpointer=AsyncPostgresSaver(conn))
        config: Any = {"configurable": {"thread_id": thread}}
        result: dict[str, Any] = await graph.ainvoke(state, config, durability="sync")
        return result


def start_sync(builder: StateGraph[Any], url: str, thread: str, state: State) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        graph = builder.compile(checkpointer=PostgresSaver(conn))
        config: Any = {"configurable": {"thread_id": thread}}
        result: dict[str, Any] = graph.invoke(state, config, durability="sync")
        return result


async def state_of(builder: StateGraph[Any], url: str, thread: str) -> Any:
    """The thread's state now (values, next, interrupts)."""
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row
    ) as conn:
        graph = builder.compile(checkpointer=AsyncPostgresSaver(conn))
        return await graph.aget_state({"configurable": {"thread_id": thread}})


def compiled(builder: StateGraph[Any]) -> Pregel[Any, Any, Any, Any]:
    """Compiled without a checkpointer: the resumer gives it one on its connection."""
    return builder.compile()


@cache
def _url() -> str:
    return os.environ["MATCHER_DATABASE_URL"]


@cache
def _waits() -> Waits:
    return Waits(TENANT, _url())


@cache
def _resumer() -> GraphResumer:
    return GraphResumer(compiled(job_graph(_waits(), _url())))


async def resumer(tx: psycopg.AsyncConnection[Any], resume: ResumeData) -> None:
    """``job_graph``'s resumer, for ``matcher worker --handler`` (built on first use: the
    module is imported before the settings are read)."""
    await _resumer()(tx, resume)
