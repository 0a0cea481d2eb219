"""Resume a LangGraph graph with its runs' resumes, exactly once: the resume worker's
handler for the waits ``Waits`` made.

In the worker's transaction, which has just advanced the wait's run: take the thread's
lock (resumes of one thread are applied one after the other, whichever workers hold
them), read the thread's state through a checkpointer bound to that same connection, find
the pending interrupt whose value is this wait, and resume it by its id. The new
checkpoints commit with the advance, or neither does. A thread with no checkpoint, or
whose interrupt for this wait is not checkpointed yet (the job's event came before the
node finished), is not resumed: the handler asks to be called again (``Retry``), and
only this run waits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.pregel import Pregel
from langgraph.types import Command, StateSnapshot

from matcher import tracing
from matcher.domain.resume import ResumeData
from matcher.faults import crash_point
from matcher.integrations.langgraph.keys import thread_of
from matcher.integrations.langgraph.waits import DEFAULT_PREFIX, TRANSACTION_KEY, WAIT_KEY
from matcher.sdk.worker.handler import Retry
from matcher.store.locks import hold, hold_async

NOT_READY_AFTER_S: Final = 1.0

SaverFactory = Callable[[Any], BaseCheckpointSaver[Any]]
Configure = Callable[[ResumeData, str], RunnableConfig]


class NotBoundToTheWorker(TypeError):
    """The checkpointer does not write through the worker's connection: its checkpoints
    would commit on their own, apart from the advance, and a crash between the two would
    lose or repeat the resume."""


class NotThisResumersRun(ValueError):
    """A resume of a run this resumer did not make (filter the worker by the prefix)."""


def _interrupt_of(state: StateSnapshot, wait_id: str) -> str | None:
    """The id of the pending interrupt that waits for ``wait_id``, if it is pending."""
    for pending in state.interrupts:
        value = pending.value
        wait = value.get(WAIT_KEY) if isinstance(value, dict) else None
        if isinstance(wait, dict) and wait.get("wait_id") == wait_id:
            return pending.id
    return None


def _config(resume: ResumeData, thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


class _Base:
    def __init__(
        self,
        graph: Pregel[Any, Any, Any, Any],
        *,
        run_prefix: str = DEFAULT_PREFIX,
        checkpointer: SaverFactory | None = None,
        configure: Configure | None = None,
        not_ready_after_s: float = NOT_READY_AFTER_S,
    ) -> None:
        if graph.checkpointer is False:
            raise ValueError("the graph was compiled with checkpointer=False: it cannot resume")
        self.graph = graph
        self.run_prefix = run_prefix
        self._factory = checkpointer
        self._configure = configure or _config
        self._not_ready_after_s = not_ready_after_s

    def accepts(self, resume: ResumeData) -> bool:
        """Whether ``resume`` is one of this resumer's (the worker's ``accept``)."""
        return thread_of(self.run_prefix, resume.run_id) is not None

    def _thread(self, resume: ResumeData) -> str:
        thread = thread_of(self.run_prefix, resume.run_id)
        if thread is None:
            raise NotThisResumersRun(
                f"run {resume.run_id!r} is not a LangGraph wait of prefix {self.run_prefix!r}"
            )
        return thread

    def _saver(self, tx: Any, default: SaverFactory) -> BaseCheckpointSaver[Any]:
        saver = (self._factory or default)(tx)
        if getattr(saver, "conn", None) is not tx:
            raise NotBoundToTheWorker(
                "the checkpointer must write through the worker's connection (the one the"
                f" handler is given); {type(saver).__name__} writes through"
                f" {type(getattr(saver, 'conn', None)).__name__}: a pool commits each"
                " checkpoint on its own"
            )
        return saver

    def _run_config(self, resume: ResumeData, thread: str, tx: Any) -> RunnableConfig:
        config = self._configure(resume, thread)
        return {**config, "configurable": {**config.get("configurable", {}), TRANSACTION_KEY: tx}}

    def _not_ready(self, thread: str, state: StateSnapshot) -> Retry:
        reason = (
            "the thread has no checkpoint yet"
            if state.created_at is None
            else "the thread's interrupt for this wait is not checkpointed yet"
        )
        return Retry(after=self._not_ready_after_s, reason=f"{reason} (thread {thread!r})")


def _attributes(thread: str, interrupt_id: str) -> dict[str, str]:
    return {"langgraph.thread_id": thread, "langgraph.interrupt_id": interrupt_id}


def _lock_name(thread: str) -> str:
    return f"matcher.langgraph:{thread}"


class GraphResumer(_Base):
    """The async handler: ``ResumeWorker(resumer, settings, accept=resumer.accepts)``, or
    ``matcher worker --handler module:resumer`` with MATCHER_WORKER_RUN_PREFIX set to the
    prefix. ``graph`` is the compiled graph; its checkpointer is replaced, for each resume,
    by an ``AsyncPostgresSaver`` on the worker's connection (``checkpointer`` builds
    another, given that connection)."""

    async def __call__(self, tx: psycopg.AsyncConnection[Any], resume: ResumeData) -> None:
        thread = self._thread(resume)
        crash_point("langgraph.after_advance")
        await hold_async(tx, _lock_name(thread))
        graph = self.graph.copy(update={"checkpointer": self._saver(tx, AsyncPostgresSaver)})
        config = self._run_config(resume, thread, tx)
        state = await graph.aget_state(config)
        interrupt_id = _interrupt_of(state, str(resume.wait_id))
        if interrupt_id is None:
            raise self._not_ready(thread, state)
        value = resume.model_dump(mode="json")
        with tracing.span("langgraph.resume", attributes=_attributes(thread, interrupt_id)):
            await graph.ainvoke(Command(resume={interrupt_id: value}), config, durability="sync")
        crash_point("langgraph.after_invoke")


class SyncGraphResumer(_Base):
    """``GraphResumer`` for sync graphs: the worker runs it in a thread with a sync
    connection (``PostgresSaver``)."""

    def __call__(self, tx: psycopg.Connection[Any], resume: ResumeData) -> None:
        thread = self._thread(resume)
        crash_point("langgraph.after_advance")
        hold(tx, _lock_name(thread))
        graph = self.graph.copy(update={"checkpointer": self._saver(tx, PostgresSaver)})
        config = self._run_config(resume, thread, tx)
        state = graph.get_state(config)
        interrupt_id = _interrupt_of(state, str(resume.wait_id))
        if interrupt_id is None:
            raise self._not_ready(thread, state)
        value = resume.model_dump(mode="json")
        with tracing.span("langgraph.resume", attributes=_attributes(thread, interrupt_id)):
            graph.invoke(Command(resume={interrupt_id: value}), config, durability="sync")
        crash_point("langgraph.after_invoke")
