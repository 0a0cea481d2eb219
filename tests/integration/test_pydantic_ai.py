"""Pydantic AI through matcher, against the real daemon, broker and Postgres, with Pydantic
AI's own function model (no network, no LLM): tools defer their calls to external jobs and
events; the run's history and waits are parked in one transaction; the run continues once,
when the last deferred call's resume arrives, with every result."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from pydantic_ai import Agent, DeferredToolRequests, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from matcher.config import Settings
from matcher.domain.launches import Launch
from matcher.integrations.pydantic_ai import AgentResumer, AgentWaits
from matcher.sdk.worker import metrics
from tests.support.assertions import eventually
from tests.support.db import db, rows, scalar
from tests.support.kafka import produce, read_resume_messages, started, within
from tests.support.processes import running_daemon
from tests.support.records import event
from tests.support.worker import running_worker, worker_settings

pytestmark = pytest.mark.timeout(240)

TABLES = """
CREATE TABLE IF NOT EXISTS pai_jobs (
    idempotency_key text NOT NULL, correlation_id text NOT NULL, run_id text NOT NULL
);
CREATE TABLE IF NOT EXISTS pai_outputs (conversation text NOT NULL, output text NOT NULL);
"""


def _model(calls: list[tuple[str, dict[str, Any], str]]) -> FunctionModel:
    """Asks for ``calls`` (tool, args, id) at first; once their results are in, answers
    with them, sorted."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [
            p for m in messages if isinstance(m, ModelRequest) for p in m.parts
            if isinstance(p, ToolReturnPart)
        ]  # fmt: skip
        if returns:
            answers = sorted(
                f"{r.tool_call_id}={json.dumps(r.content, sort_keys=True)}" for r in returns
            )
            return ModelResponse(parts=[TextPart("; ".join(answers))])
        return ModelResponse(parts=[ToolCallPart(t, a, tool_call_id=i) for t, a, i in calls])

    return FunctionModel(respond)


AfterSubmit = Callable[[Launch], Awaitable[None]]


def _agent(
    url: str,
    waits: AgentWaits,
    calls: list[tuple[str, dict[str, Any], str]],
    after_submit: AfterSubmit | None = None,
    timeout: timedelta | None = None,
) -> Agent[None, str | DeferredToolRequests]:
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        _model(calls), output_type=[str, DeferredToolRequests]
    )

    async def submit(launch: Launch) -> str:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(
                "INSERT INTO pai_jobs VALUES (%s, %s, %s)",
                [launch.idempotency_key, launch.correlation_id, launch.run_id],
            )
        if after_submit is not None:
            await after_submit(launch)
        return f"job-{launch.idempotency_key[-6:]}"

    @agent.tool
    async def run_report(ctx: RunContext[None], report: str) -> str:
        await waits.launch(ctx, submit, event_types=["job.completed", "job.failed"])

    @agent.tool
    def approval(ctx: RunContext[None], ticket: str) -> str:
        waits.wait_for_event(
            ctx, event_types=["approval.granted"], correlation_id=ticket, timeout=timeout
        )

    return agent


def _setup(settings: Settings) -> str:
    with db(settings) as conn:
        conn.execute(TABLES)
    return settings.database_url.get_secret_value()


async def _output(tx: psycopg.AsyncConnection[Any], conversation: str, output: Any) -> None:
    await tx.execute("INSERT INTO pai_outputs VALUES (%s, %s)", [conversation, str(output)])


def _outputs(settings: Settings, conversation: str) -> list[str]:
    found = rows(settings, "SELECT output FROM pai_outputs WHERE conversation = %s",
                 [conversation])  # fmt: skip
    return [r["output"] for r in found]


async def _park(url: str, waits: AgentWaits, agent: Agent[Any, Any], conversation: str) -> Any:
    result = await agent.run("report please", conversation_id=conversation)
    assert isinstance(result.output, DeferredToolRequests)
    connecting = psycopg.AsyncConnection.connect(url, autocommit=True)
    async with await connecting as conn, conn.transaction():
        return await waits.park(conn, result)


def _duplicates() -> float:
    return float(metrics.RESUMES.labels("duplicate", "topic")._value.get())


async def test_two_deferred_jobs_continue_the_run_once_with_both_results(
    settings: Settings,
) -> None:
    url = _setup(settings)
    waits = AgentWaits("acme", url)
    calls = [("run_report", {"report": "a"}, "call_a"), ("run_report", {"report": "b"}, "call_b")]
    agent = _agent(url, waits, calls)
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    pending = await _park(url, waits, agent, conversation)
    assert set(pending) == {"call_a", "call_b"}
    jobs = {r["run_id"]: r for r in rows(settings, "SELECT * FROM pai_jobs")}
    assert set(jobs) == {waits.run_id(conversation, c) for c in pending}
    resumer = AgentResumer(agent, waits, on_output=_output)
    worker = worker_settings(settings)
    async with running_daemon(settings), running_worker(worker, resumer, resumer.accepts):
        b = jobs[waits.run_id(conversation, "call_b")]
        await produce(settings, [event(correlation=b["correlation_id"], data={"rows": 2})])
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.runs WHERE run_id = %s",
                           [waits.run_id(conversation, "call_b")]) == 1,
            timeout=60, what="the first result stored",
        )  # fmt: skip
        assert _outputs(settings, conversation) == []  # waiting for the other call
        a = jobs[waits.run_id(conversation, "call_a")]
        await produce(settings, [event(correlation=a["correlation_id"], data={"rows": 1})])
        await eventually(lambda: len(_outputs(settings, conversation)) == 1, timeout=60,
                         what="the run continued")  # fmt: skip
        duplicates = _duplicates()
        messages = await read_resume_messages(settings, at_least=2)
        async with started(AIOKafkaProducer(**settings.kafka_client_options())) as p:
            for message in messages:
                await within(p.send_and_wait(settings.resume_topic, message))
        await eventually(lambda: _duplicates() >= duplicates + 2, timeout=60,
                         what="the redeliveries seen as duplicates")  # fmt: skip
    assert _outputs(settings, conversation) == [
        'call_a={"data": {"rows": 1}, "outcome": "event", "type": "job.completed"}; '
        'call_b={"data": {"rows": 2}, "outcome": "event", "type": "job.completed"}'
    ]
    assert scalar(settings, "SELECT count(*) FROM pai_jobs") == 2  # each started once
    assert scalar(settings, "SELECT state FROM matcher.agent_runs WHERE conversation = %s",
                  [conversation]) == "done"  # fmt: skip


async def test_an_event_before_the_run_is_parked_waits_for_it(settings: Settings) -> None:
    url = _setup(settings)
    waits = AgentWaits("acme", url)
    conversation = f"early-{uuid.uuid4().hex[:8]}"

    async def finish_at_once(launch: Launch) -> None:
        await produce(settings, [event(correlation=launch.correlation_id, data={"rows": 9})])
        await eventually(
            lambda: scalar(settings, "SELECT count(*) FROM matcher.resolutions o JOIN matcher.waits"
                                     " w ON w.id = o.wait_id WHERE w.run_id = %s AND "
                                     "o.published", [launch.run_id]) == 1,
            timeout=60, what="the resume published before the run is parked",
        )  # fmt: skip

    agent = _agent(url, waits, [("run_report", {"report": "x"}, "call_x")], finish_at_once)
    resumer = AgentResumer(agent, waits, on_output=_output, not_ready_after_s=0.2)
    worker = worker_settings(settings)
    async with running_daemon(settings), running_worker(worker, resumer, resumer.accepts):
        await _park(url, waits, agent, conversation)
        await eventually(lambda: len(_outputs(settings, conversation)) == 1, timeout=60,
                         what="the run continued once parked")  # fmt: skip
    assert _outputs(settings, conversation) == [
        'call_x={"data": {"rows": 9}, "outcome": "event", "type": "job.completed"}'
    ]


async def test_an_approval_past_its_deadline_returns_timeout(settings: Settings) -> None:
    url = _setup(settings)
    waits = AgentWaits("acme", url)
    conversation = f"approve-{uuid.uuid4().hex[:8]}"
    ticket = f"ticket-{uuid.uuid4().hex[:6]}"
    agent = _agent(url, waits, [("approval", {"ticket": ticket}, "call_ok")],
                   timeout=timedelta(seconds=1))  # fmt: skip
    resumer = AgentResumer(agent, waits, on_output=_output)
    quick = settings.model_copy(update={"sweep_interval_s": 0.2})
    worker = worker_settings(settings)
    async with running_daemon(quick), running_worker(worker, resumer, resumer.accepts):
        await _park(url, waits, agent, conversation)
        await eventually(lambda: len(_outputs(settings, conversation)) == 1, timeout=60,
                         what="the run continued on the timeout")  # fmt: skip
    assert _outputs(settings, conversation) == ['call_ok={"outcome": "timeout"}']
