"""Pydantic AI on matcher: a tool defers its call to an external job or event, the agent's
run ends with ``DeferredToolRequests``, and when every deferred call's event has come the
run is continued with ``DeferredToolResults``, exactly once (``pip install
'matcher[pydantic-ai]'``).

In a tool (the run needs a ``conversation_id``, which names it):

    waits = AgentWaits(tenant="acme", database_url=URL)

    @agent.tool
    async def run_report(ctx: RunContext[None], report: str) -> str:
        await waits.launch(ctx, start_job, event_types=["job.completed", "job.failed"])

    result = await agent.run("...", conversation_id="conv-7")
    async with conn.transaction():          # the history and the waits, together
        await waits.park(conn, result)

and ``AgentResumer(agent, waits)`` as the resume worker's handler. Each deferred call is a
matcher run named ``<prefix><conversation>/<tool call id>`` at position 0. Its result is
what ended the wait: ``{"outcome": "event", "type": ..., "data": ...}``, or
``{"outcome": "timeout"}`` / ``{"outcome": "cancelled"}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, Final, NoReturn, Unpack

import psycopg
from pydantic import TypeAdapter
from pydantic_ai import Agent, CallDeferred, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai.agent import AgentRunResult
from pydantic_ai.messages import ModelMessagesTypeAdapter

from matcher import tracing
from matcher.domain.launches import LaunchSpec
from matcher.domain.resume import ResumeData
from matcher.domain.waits import WaitShape, WaitSpec
from matcher.faults import crash_point
from matcher.integrations.launching import AsyncSubmit, deadline_of, launch_once_async, wait_id_of
from matcher.sdk.worker.handler import Retry
from matcher.store import agent_runs
from matcher.store.locks import hold_async
from matcher.store.waits import get_wait_async, register_wait_async

WAIT_KEY: Final = "matcher_wait"
DEFAULT_PREFIX: Final = "pydantic-ai:"

OnOutput = Callable[[psycopg.AsyncConnection[Any], str, Any], Awaitable[None]]


class NoConversation(ValueError):
    """A matcher wait in a run without a ``conversation_id`` (``agent.run(...,
    conversation_id=...)``): the id names the run and its waits."""


def _conversation(conversation: str | None) -> str:
    if not conversation or "/" in conversation:
        raise NoConversation(
            "a matcher wait needs the run's conversation_id (no '/'): agent.run(...,"
            " conversation_id=...)"
        )
    return conversation


def tool_result(resume: ResumeData) -> dict[str, Any]:
    """What a deferred call returns to the model once its wait has ended."""
    if resume.event is None:
        return {"outcome": str(resume.outcome)}
    return {"outcome": "event", "type": resume.event.type, "data": resume.event.data}


class AgentWaits:
    """Deferred tool calls as matcher waits of ``tenant``, named
    ``<run_prefix><conversation>/<tool call id>``."""

    def __init__(self, tenant: str, database_url: str, *, run_prefix: str = DEFAULT_PREFIX) -> None:
        if "/" in run_prefix:
            raise ValueError("the run prefix may not contain '/'")
        self.tenant = tenant
        self.run_prefix = run_prefix
        self._url = database_url

    def run_id(self, conversation: str, tool_call_id: str) -> str:
        return f"{self.run_prefix}{conversation}/{tool_call_id}"

    def parse(self, run_id: str) -> tuple[str, str] | None:
        """(conversation, tool call id) of one of this prefix's run ids, else None."""
        if not run_id.startswith(self.run_prefix):
            return None
        conversation, sep, call = run_id[len(self.run_prefix) :].partition("/")
        return (conversation, call) if sep and conversation and call else None

    async def launch(
        self,
        ctx: RunContext[Any],
        submit: AsyncSubmit,
        *,
        event_types: list[str],
        deadline: datetime | None = None,
        timeout: timedelta | None = None,  # noqa: ASYNC109 (the wait's, not this call's)
    ) -> NoReturn:
        """Record the launch and its wait (committed), start the job at most once
        (``submit(launch)``, which may return the job's id), then defer the tool call."""
        conversation = _conversation(ctx.conversation_id)
        assert ctx.tool_call_id is not None
        spec = LaunchSpec(
            tenant=self.tenant, run_id=self.run_id(conversation, ctx.tool_call_id),
            position=0, event_types=event_types, deadline=deadline_of(deadline, timeout),
        )  # fmt: skip
        conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
        async with conn:
            launch = await launch_once_async(conn, spec, submit, None)
        raise CallDeferred(
            metadata={WAIT_KEY: {"wait_id": str(launch.wait_id), "run_id": spec.run_id}}
        )

    def wait_for_event(
        self,
        ctx: RunContext[Any],
        *,
        event_types: list[str] | None = None,
        correlation_id: str | None = None,
        deadline: datetime | None = None,
        timeout: timedelta | None = None,
        **more: Unpack[WaitShape],
    ) -> NoReturn:
        """Defer the tool call until an event of ``event_types`` with ``correlation_id``
        (registered by ``park``, with the run's history). ``more`` says more: a
        ``condition`` on the data, a heartbeat, or fan-in ``conditions`` with a ``rule``
        instead of ``event_types`` and ``correlation_id`` (docs: waits that say more);
        checked here, so that a malformed wait fails the tool call, not ``park``."""
        _conversation(ctx.conversation_id)
        when = deadline_of(deadline, timeout)
        shape = {"event_types": event_types, "correlation_id": correlation_id, **more}
        WaitSpec.model_validate({"tenant": self.tenant, "run_id": "-", "position": 0} | shape)
        raise CallDeferred(
            metadata={
                WAIT_KEY: TypeAdapter(dict[str, Any]).dump_python(
                    shape | {"deadline": None if when is None else when.isoformat()},
                    mode="json",
                )
            }
        )

    async def park(
        self, conn: psycopg.AsyncConnection[Any], result: AgentRunResult[Any]
    ) -> dict[str, str]:
        """In the caller's transaction: store the run's history and a wait for each of its
        deferred calls (those ``launch`` made are stored already). Returns {tool call id:
        wait id}. The resumer continues the run once every call has its result."""
        requests = result.output
        if not isinstance(requests, DeferredToolRequests):
            raise ValueError("the run did not end on deferred tool calls")
        conversation = _conversation(result.conversation_id)
        pending: dict[str, str] = {}
        for call in requests.calls:
            wait = (requests.metadata.get(call.tool_call_id) or {}).get(WAIT_KEY)
            if not isinstance(wait, dict):
                raise ValueError(f"tool call {call.tool_name} was deferred without a matcher wait")
            if "wait_id" in wait:
                pending[call.tool_call_id] = str(wait["wait_id"])
            else:
                pending[call.tool_call_id] = await self._register(
                    conn, conversation, call.tool_call_id, wait
                )
        history = ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json")
        await agent_runs.park(conn, self.tenant, conversation, history, pending)
        return pending

    async def _register(
        self,
        conn: psycopg.AsyncConnection[Any],
        conversation: str,
        call: str,
        wait: dict[str, Any],
    ) -> str:
        run_id = self.run_id(conversation, call)
        wait_id = wait_id_of(self.tenant, run_id)
        if await get_wait_async(conn, wait_id) is None:
            deadline = wait.get("deadline")
            shape = {k: v for k, v in wait.items() if k != "deadline"}
            await register_wait_async(
                conn,
                WaitSpec.model_validate(
                    {"tenant": self.tenant, "run_id": run_id, "position": 0, "id": wait_id,
                     "deadline": None if deadline is None else datetime.fromisoformat(deadline)}
                    | shape
                ),
            )  # fmt: skip
        return str(wait_id)


class AgentResumer:
    """The resume worker's handler for ``waits``' runs: ``ResumeWorker(resumer, settings,
    accept=resumer.accepts)``. Each resume's result is stored with the run; the one that
    completes the set continues the run (``agent.run`` with the history and every
    result), in the transaction that advanced its wait. A run that defers again is parked
    again in that transaction; a run that ends calls ``on_output(tx, conversation,
    output)``, whose writes commit with it."""

    def __init__(
        self,
        agent: Agent[Any, Any],
        waits: AgentWaits,
        *,
        deps: Callable[[str], Any] | None = None,
        on_output: OnOutput | None = None,
        not_ready_after_s: float = 1.0,
    ) -> None:
        self.agent = agent
        self.waits = waits
        self._deps = deps
        self._on_output = on_output
        self._not_ready_after_s = not_ready_after_s

    def accepts(self, resume: ResumeData) -> bool:
        return self.waits.parse(resume.run_id) is not None

    async def __call__(self, tx: psycopg.AsyncConnection[Any], resume: ResumeData) -> None:
        parsed = self.waits.parse(resume.run_id)
        if parsed is None:
            raise ValueError(f"run {resume.run_id!r} is not one of {self.waits.run_prefix!r}")
        conversation, call = parsed
        tenant = self.waits.tenant
        await hold_async(tx, f"matcher.pydantic_ai:{tenant}\x1f{conversation}")
        run = await agent_runs.get(tx, tenant, conversation)
        if run is None or run.state != "waiting" or call not in run.pending:
            raise Retry(self._not_ready_after_s, "the run's deferred call is not parked yet")
        results = {**run.results, call: tool_result(resume)}
        if set(results) < set(run.pending):
            await agent_runs.add_result(tx, tenant, conversation, call, results[call])
            return
        await self._continue(tx, conversation, run.history, results)

    async def _continue(
        self,
        tx: psycopg.AsyncConnection[Any],
        conversation: str,
        history: Any,
        results: dict[str, Any],
    ) -> None:
        with tracing.span(
            "pydantic_ai.continue", attributes={"matcher.conversation": conversation}
        ):
            result = await self.agent.run(
                message_history=ModelMessagesTypeAdapter.validate_python(history),
                deferred_tool_results=DeferredToolResults(calls=results),
                conversation_id=conversation,
                deps=None if self._deps is None else self._deps(conversation),
            )
        crash_point("agent.after_run")
        if isinstance(result.output, DeferredToolRequests):
            await self.waits.park(tx, result)
            return
        history_now = ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json")
        output = result.output
        stored = (
            output if isinstance(output, str | int | float | bool | dict | list) else str(output)
        )
        await agent_runs.finish(tx, self.waits.tenant, conversation, history_now, stored)
        if self._on_output is not None:
            await self._on_output(tx, conversation, output)
