"""The daemon process: ingest, relay, sweeper and janitor in one asyncio process.

SIGTERM or SIGINT sets the stop event: ingest finishes and commits its batch and leaves
the consumer group, the relay publishes what is committed, and the process exits 0.
A loop that dies unexpectedly stops the others too and the process exits non-zero, so
its supervisor restarts it rather than leaving it half-working.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient
from psycopg_pool import AsyncConnectionPool

from matcher import metrics, tracing
from matcher.admin.server import AdminServer
from matcher.admin.state import AdminState
from matcher.auth.registry import RegistryError
from matcher.auth.registry_watch import RegistryHolder
from matcher.config import Settings
from matcher.daemon import stats
from matcher.daemon.ingest import Ingest
from matcher.daemon.janitor import Janitor
from matcher.daemon.notifications import listen
from matcher.daemon.relay import Relay
from matcher.daemon.rematch import Rematch
from matcher.daemon.sweeper import Sweeper
from matcher.kafka.deadlines import close_admin
from matcher.kafka.topics import TIMESTAMP_TYPE, events_timestamp_type
from matcher.store.isolation import read_committed

log = logging.getLogger("matcher.daemon")


class StartupError(Exception):
    """A dependency could not be reached at start; the message says which and why."""


class LoopFailed(Exception):
    """A loop of the daemon died; the daemon stopped the others."""


async def _check_kafka(settings: Settings) -> list[str]:
    """Reach the brokers; return the expected topics that are missing."""
    admin = AIOKafkaAdminClient(**settings.kafka_client_options(), request_timeout_ms=10_000)
    try:
        await asyncio.wait_for(admin.start(), settings.startup_timeout_s)
        topics = set(await asyncio.wait_for(admin.list_topics(), settings.startup_timeout_s))
    except Exception as exc:
        raise StartupError(
            f"Kafka at {settings.kafka_bootstrap_servers} did not answer: {exc!r}"
        ) from exc
    finally:
        await close_admin(admin, settings.startup_timeout_s)
    wanted = [settings.events_topic, settings.resume_topic, settings.dead_letter_topic]
    return [t for t in wanted if t is not None and t not in topics]


async def _warn_on_create_time(settings: Settings) -> None:
    kind = await events_timestamp_type(settings)
    if kind is not None and kind != "LogAppendTime":
        log.warning(
            "the events topic keeps producer timestamps (%s=%s): signature freshness is "
            "judged at read time instead, so a backlog longer than "
            "MATCHER_SIGNATURE_TOLERANCE_S quarantines valid events as expired_timestamp; "
            "`matcher migrate` sets LogAppendTime",
            TIMESTAMP_TYPE,
            kind,
            extra={"topic": settings.events_topic},
        )


async def _open_pool(settings: Settings) -> AsyncConnectionPool:
    pool = AsyncConnectionPool(
        settings.database_conninfo(),
        min_size=settings.db_pool_min_size,
        max_size=settings.db_pool_max_size,
        open=False,
        name="matcher",
        configure=read_committed,  # whatever the database's default (matcher.store.isolation)
    )
    try:
        await pool.open(wait=True, timeout=settings.startup_timeout_s)
    except Exception as exc:
        await pool.close()
        raise StartupError(f"Postgres did not accept connections: {exc!r}") from exc
    return pool


async def _supervise(stop: asyncio.Event, tasks: list[asyncio.Task[None]], grace: float) -> None:
    """Wait for a stop request or a loop's end; then stop all loops, cancelling laggards.

    A loop that ends (even without an error) before anyone asked to stop is a failure:
    the daemon is no longer whole, so it exits non-zero for its supervisor to restart it.
    """
    stop_waiter = asyncio.ensure_future(stop.wait())
    first_done, _ = await asyncio.wait([stop_waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    early = [] if stop_waiter in first_done else [t for t in tasks if t in first_done]
    stop.set()
    stop_waiter.cancel()
    _, pending = await asyncio.wait(tasks, timeout=grace)
    for task in pending:
        log.error("loop did not stop in time; cancelling", extra={"loop": task.get_name()})
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    failed = [t for t in tasks if not t.cancelled() and t.exception() is not None]
    failed += [t for t in early if t not in failed]
    for task in failed:
        error = None if task.cancelled() else task.exception()
        log.error("loop failed", extra={"loop": task.get_name()}, exc_info=error)
    if failed:
        raise LoopFailed(", ".join(t.get_name() for t in failed))


def _refuse_unauthenticated(settings: Settings) -> None:
    if settings.producers_file is None and not settings.allow_unsigned:
        raise StartupError(
            "MATCHER_PRODUCERS_FILE is not set: without it no event can be authenticated "
            "(set MATCHER_ALLOW_UNSIGNED=true to accept unsigned events in local development)"
        )


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event, enabled: bool) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` while the block runs (if ``enabled``)."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if enabled else ()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


async def _preflight(settings: Settings) -> RegistryHolder:
    """The checks before any loop starts; returns the loaded producer registry.

    A missing topic or an unreadable registry is a StartupError now rather than a loop
    failing later, so a misconfigured deployment says what is wrong and exits.
    """
    missing = await _check_kafka(settings)
    if missing:
        raise StartupError(f"topics {', '.join(missing)} do not exist: run `matcher migrate` first")
    await _warn_on_create_time(settings)
    registry = RegistryHolder(
        settings.producers_file,
        settings.producers_reload_interval_s,
        metrics.REGISTRY_RELOADS,
        metrics.REGISTRY_RELOAD_FAILING,
    )
    try:
        registry.load_initial()
    except RegistryError as exc:
        raise StartupError(str(exc)) from exc
    if settings.allow_unsigned:
        log.warning(
            "MATCHER_ALLOW_UNSIGNED is set: events WITHOUT SIGNATURES are accepted. "
            "This is for local development only; never run production like this."
        )
    return registry


@dataclass
class _Loops:
    tasks: list[asyncio.Task[None]]  # supervised: one ending early stops the daemon
    wake: dict[str, Callable[[], None]]  # NOTIFY channel -> the nudge of the loop it wakes


def _start_loops(
    settings: Settings, pool: AsyncConnectionPool, stop: asyncio.Event, registry: RegistryHolder
) -> _Loops:
    relay = Relay(settings, pool, stop)
    ingest = Ingest(settings, pool, stop, on_resolved=relay.nudge, registry=registry)
    rematch = Rematch(settings, pool, stop, on_resolved=relay.nudge)
    sweeper = Sweeper(settings, pool, stop, on_resolved=relay.nudge)
    wake = {"matcher_outbox": relay.nudge, "matcher_match": rematch.nudge}
    janitor = Janitor(settings, pool, stop)
    admin = AdminServer(
        AdminState(
            settings=settings,
            pool=pool,
            assigned_partitions=ingest.assigned_partitions,
            kafka_reachable=ingest.kafka_reachable,
        ),
        *settings.admin_host_port(),
    )
    tasks = [
        asyncio.create_task(admin.run(stop), name="admin"),
        asyncio.create_task(stats.run(pool, stop, settings.stats_interval_s), name="stats"),
        asyncio.create_task(ingest.run(), name="ingest"),
        asyncio.create_task(relay.run(), name="relay"),
        asyncio.create_task(rematch.run(), name="rematch"),
        asyncio.create_task(sweeper.run(), name="sweeper"),
        asyncio.create_task(janitor.run(), name="janitor"),
        asyncio.create_task(registry.watch(stop), name="registry"),
    ]
    return _Loops(tasks, wake)


def _settle_heap() -> None:
    """Move everything built so far (the imported modules, the loops' clients) out of
    the garbage collector's sight: it is kept for the process's life, and a full
    collection would scan it all, pausing the daemon for tens of milliseconds under load,
    a large part of the latency's tail (docs/benchmarks/tuning.md). Only a process of its
    own does this: it changes the collector for the whole interpreter."""
    gc.collect()
    gc.freeze()


def _log_ready(settings: Settings) -> None:
    log.info(
        "matcher ready",
        extra={
            "kafka": settings.kafka_bootstrap_servers,
            "events_topic": settings.events_topic,
            "resume_topic": settings.resume_topic,
            "group": settings.consumer_group,
        },
    )


async def _supervise_with_wakeups(settings: Settings, stop: asyncio.Event, loops: _Loops) -> None:
    # Wake-ups only; not supervised (it reconnects on its own, and the loops poll).
    listener = asyncio.create_task(
        listen(settings.database_conninfo(), loops.wake), name="listener"
    )
    try:
        await _supervise(stop, loops.tasks, settings.shutdown_timeout_s)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener


async def run(
    settings: Settings, stop: asyncio.Event | None = None, *, handle_signals: bool = True
) -> None:
    """Run until ``stop`` is set or (with ``handle_signals``) SIGTERM/SIGINT arrives."""
    stop = stop or asyncio.Event()
    _refuse_unauthenticated(settings)
    tracing.configure_from_env()
    with _stop_on_signals(stop, handle_signals):
        pool = await _open_pool(settings)
        try:
            registry = await _preflight(settings)
            loops = _start_loops(settings, pool, stop, registry)
            if handle_signals:
                _settle_heap()
            _log_ready(settings)
            await _supervise_with_wakeups(settings, stop, loops)
            log.info("stopping")
        finally:
            await pool.close()
    log.info("stopped")
