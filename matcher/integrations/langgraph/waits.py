"""Inside a node: record the launch, start the job at most once, wait, and on resume
return what ended the wait.

    waits = Waits(tenant="acme", database_url=URL)

    def start_job(state):
        resume = waits.launch_and_wait(
            lambda launch: jobs.start(key=launch.idempotency_key, corr=launch.correlation_id),
            event_types=["job.completed", "job.failed"], timeout=timedelta(hours=1),
        )
        return {"result": resume.event.data if resume.event else None}

The first time the node runs, the launch intent and its wait are stored (and committed)
before ``submit`` is called, then the node is interrupted with the wait in the
interrupt's value. When the wait resolves, the resumer (``GraphResumer``) resumes that
interrupt by its id; the node runs again from the top, finds its launch stored (so
``submit`` is not called again) and gets the resume back as a typed value.
"""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime, timedelta
from typing import Any, Final, Unpack

import psycopg
from langgraph.config import get_config
from langgraph.errors import GraphInterrupt
from langgraph.types import interrupt
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from matcher.domain.launches import Launch, LaunchSpec
from matcher.domain.resume import ResumeData
from matcher.domain.waits import Wait, WaitShape, WaitSpec
from matcher.integrations.langgraph.keys import Place, next_place
from matcher.integrations.launching import (
    AsyncLookup,
    AsyncSubmit,
    Lookup,
    Submit,
    deadline_of,
    launch_once,
    launch_once_async,
    wait_id_of,
)
from matcher.store.runs import position, position_async
from matcher.store.waits import get_wait, get_wait_async, register_wait, register_wait_async

# The key of an interrupt's value that says it is a matcher wait (what the resumer finds).
WAIT_KEY: Final = "matcher_wait"
DEFAULT_PREFIX: Final = "langgraph:"
# Where the resumer puts its connection in the run's config (see ``transaction``).
TRANSACTION_KEY: Final = "matcher_transaction"


def transaction() -> Any | None:
    """The resume worker's connection, in the transaction that advances the run, when the
    node runs under the resumer (None otherwise: the graph's first run is yours). A node's
    database writes through it commit with the checkpoint and the advance, or not at all:
    exactly once. Writes elsewhere (another connection, an HTTP call) are at least once:
    key them by the resume's ``resolution_id``."""
    try:
        config = get_config()
    except RuntimeError:
        return None
    return config.get("configurable", {}).get(TRANSACTION_KEY)


class KeyReused(RuntimeError):
    """The wait's place in the thread was used before, and its resume consumed: the thread
    was run again from an earlier checkpoint (LangGraph's time travel), which matcher's
    waits do not follow. Start a new thread instead."""


class ForeignResume(RuntimeError):
    """The value the interrupt was resumed with is not this wait's resume (resumed by
    hand, or with another wait's resume): refused rather than taken as this wait's."""


def _request(launch: Launch | None, wait: Wait | None, run_id: str) -> dict[str, Any]:
    """The interrupt's value: what a LangGraph client sees, and what the resumer finds."""
    if launch is not None:
        return {
            WAIT_KEY: {
                "wait_id": str(launch.wait_id), "run_id": run_id, "tenant": launch.tenant,
                "correlation_id": launch.correlation_id, "launch_id": str(launch.id),
                "idempotency_key": launch.idempotency_key,
            }
        }  # fmt: skip
    assert wait is not None
    return {
        WAIT_KEY: {
            "wait_id": str(wait.id), "run_id": run_id, "tenant": wait.tenant,
            "correlation_id": wait.correlation_id, "event_types": wait.event_types,
        }
    }  # fmt: skip


def _answer(value: Any, wait_id: uuid.UUID) -> ResumeData:
    try:
        resume = ResumeData.model_validate(value)
    except ValueError as exc:
        raise ForeignResume(f"the interrupt was resumed with what is not a resume: {exc}") from None
    if resume.wait_id != wait_id:
        raise ForeignResume(f"resumed with wait {resume.wait_id}'s resume, not {wait_id}'s")
    return resume


class Waits:
    """Matcher waits for the nodes of LangGraph graphs, as runs of ``tenant`` named
    ``<run_prefix><thread id>/<key>`` (the resumer of the graph uses the same prefix).

    Launch intents and waits are stored through connections of their own (``database_url``,
    or the pools given), each committed before the node goes on: the intent must be stored
    before the job is started, whatever becomes of the node's run.
    """

    def __init__(
        self,
        tenant: str,
        database_url: str | None = None,
        *,
        run_prefix: str = DEFAULT_PREFIX,
        pool: ConnectionPool | None = None,
        async_pool: AsyncConnectionPool | None = None,
    ) -> None:
        if database_url is None and pool is None and async_pool is None:
            raise ValueError("give a database_url or a pool")
        if "/" in run_prefix:
            raise ValueError("the run prefix may not contain '/'")
        self.tenant = tenant
        self.run_prefix = run_prefix
        self._url = database_url
        self._pool = pool
        self._async_pool = async_pool

    # --- connections ---------------------------------------------------------------

    @contextmanager
    def _conn(self) -> Any:
        if self._pool is not None:
            with self._pool.connection() as conn:
                yield conn
            return
        if self._url is None:
            raise ValueError("a sync node needs a database_url or a pool")
        with psycopg.connect(self._url, autocommit=True, connect_timeout=10) as conn:
            yield conn

    @asynccontextmanager
    async def _aconn(self) -> Any:
        if self._async_pool is not None:
            async with self._async_pool.connection() as conn:
                yield conn
            return
        if self._url is None:
            raise ValueError("an async node needs a database_url or an async pool")
        conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True, connect_timeout=10)
        async with conn:
            yield conn

    # --- a launch and its wait -------------------------------------------------------

    def _launch_spec(
        self, place: Place, event_types: list[str], deadline: datetime | None
    ) -> LaunchSpec:
        return LaunchSpec(
            tenant=self.tenant, run_id=place.run_id(self.run_prefix), position=0,
            event_types=event_types, deadline=deadline,
        )  # fmt: skip

    def launch_and_wait(
        self,
        submit: Submit,
        *,
        event_types: list[str],
        deadline: datetime | None = None,
        timeout: timedelta | None = None,
        lookup: Lookup | None = None,
    ) -> ResumeData:
        """Record the launch (once per place in the thread), call ``submit(launch)`` at
        most once per launch (it starts the job with ``launch.idempotency_key`` and
        ``launch.correlation_id``, and may return the job's id), then wait. Returns the
        resume: ``outcome`` event (with ``event``), timeout or cancelled.

        A launch found recorded without a job id (the process died around ``submit``) is
        not submitted again; ``lookup``, when given, is asked (``Found``: its job id is
        stored; ``NotFound``: ``submit`` is called); otherwise ``matcher reconcile`` or
        the deadline settles it."""
        place = next_place()
        spec = self._launch_spec(place, event_types, deadline_of(deadline, timeout))
        with self._conn() as conn:
            launch = launch_once(conn, spec, submit, lookup)
        return self._wait(_request(launch, None, spec.run_id), launch.wait_id, spec.run_id)

    async def alaunch_and_wait(
        self,
        submit: AsyncSubmit,
        *,
        event_types: list[str],
        deadline: datetime | None = None,
        timeout: timedelta | None = None,  # noqa: ASYNC109 (the wait's, not this call's)
        lookup: AsyncLookup | None = None,
    ) -> ResumeData:
        """``launch_and_wait`` for async nodes (``submit`` and ``lookup`` async)."""
        place = next_place()
        spec = self._launch_spec(place, event_types, deadline_of(deadline, timeout))
        async with self._aconn() as conn:
            launch = await launch_once_async(conn, spec, submit, lookup)
        request = _request(launch, None, spec.run_id)
        return await self._await(request, launch.wait_id, spec.run_id)

    # --- a wait without a launch -----------------------------------------------------

    def _wait_spec(
        self, place: Place, deadline: datetime | None, shape: dict[str, Any]
    ) -> WaitSpec:
        run_id = place.run_id(self.run_prefix)
        return WaitSpec.model_validate(
            {"tenant": self.tenant, "run_id": run_id, "position": 0, "deadline": deadline,
             "id": wait_id_of(self.tenant, run_id)} | shape
        )  # fmt: skip

    def wait_for_event(
        self,
        *,
        event_types: list[str] | None = None,
        correlation_id: str | None = None,
        deadline: datetime | None = None,
        timeout: timedelta | None = None,
        external_job_id: str | None = None,
        **more: Unpack[WaitShape],
    ) -> ResumeData:
        """Wait for an event of ``event_types`` with ``correlation_id`` (an approval, a
        job someone else started). Registered the first time the node runs; when it runs
        again, the wait registered then is the one waited for.

        ``more`` says more (docs: waits that say more): a ``condition`` on the event's
        data; a heartbeat (``heartbeat_interval_s`` with ``progress_types``); or, instead
        of ``event_types`` and ``correlation_id``, fan-in ``conditions`` with a ``rule``
        (``all``, ``any``, ``at_least`` with ``at_least``): the resume then lists every
        event that counted in ``events``."""
        place = next_place()
        shape = {"event_types": event_types, "correlation_id": correlation_id,
                 "external_job_id": external_job_id, **more}  # fmt: skip
        spec = self._wait_spec(place, deadline_of(deadline, timeout), shape)
        assert spec.id is not None
        with self._conn() as conn:
            wait = get_wait(conn, spec.id)
            if wait is None:
                try:
                    wait = register_wait(conn, spec)
                except psycopg.errors.UniqueViolation:  # registered by a concurrent run
                    wait = get_wait(conn, spec.id)
            assert wait is not None
        return self._wait(_request(None, wait, spec.run_id), wait.id, spec.run_id)

    async def await_event(
        self,
        *,
        event_types: list[str] | None = None,
        correlation_id: str | None = None,
        deadline: datetime | None = None,
        timeout: timedelta | None = None,  # noqa: ASYNC109 (the wait's, not this call's)
        external_job_id: str | None = None,
        **more: Unpack[WaitShape],
    ) -> ResumeData:
        """``wait_for_event`` for async nodes."""
        place = next_place()
        shape = {"event_types": event_types, "correlation_id": correlation_id,
                 "external_job_id": external_job_id, **more}  # fmt: skip
        spec = self._wait_spec(place, deadline_of(deadline, timeout), shape)
        assert spec.id is not None
        async with self._aconn() as conn:
            wait = await get_wait_async(conn, spec.id)
            if wait is None:
                try:
                    wait = await register_wait_async(conn, spec)
                except psycopg.errors.UniqueViolation:
                    wait = await get_wait_async(conn, spec.id)
            assert wait is not None
        return await self._await(_request(None, wait, spec.run_id), wait.id, spec.run_id)

    # --- the interrupt ---------------------------------------------------------------

    def _wait(self, request: dict[str, Any], wait_id: uuid.UUID, run_id: str) -> ResumeData:
        try:
            value = interrupt(request)
        except GraphInterrupt:
            with self._conn() as conn:
                if position(conn, self.tenant, run_id):
                    raise KeyReused(_reused(run_id)) from None
            raise
        return _answer(value, wait_id)

    async def _await(self, request: dict[str, Any], wait_id: uuid.UUID, run_id: str) -> ResumeData:
        try:
            value = interrupt(request)
        except GraphInterrupt:
            async with self._aconn() as conn:
                if await position_async(conn, self.tenant, run_id):
                    raise KeyReused(_reused(run_id)) from None
            raise
        return _answer(value, wait_id)


def _reused(run_id: str) -> str:
    return (
        f"the wait of run {run_id} was resumed before: this thread was run again from an"
        " earlier checkpoint, which matcher's waits do not follow (start a new thread)"
    )
