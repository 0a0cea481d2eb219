"""The daemon process: connect to Postgres and Kafka, run until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiokafka.admin import AIOKafkaAdminClient
from psycopg_pool import AsyncConnectionPool

from matcher.config import Settings

log = logging.getLogger("matcher.daemon")


class StartupError(Exception):
    """A dependency could not be reached at start; the message says which and why."""


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
        await admin.close()
    return [t for t in (settings.events_topic, settings.resume_topic) if t not in topics]


async def _open_pool(settings: Settings) -> AsyncConnectionPool:
    pool = AsyncConnectionPool(
        settings.database_url.get_secret_value(),
        min_size=settings.db_pool_min_size,
        max_size=settings.db_pool_max_size,
        open=False,
        name="matcher",
    )
    try:
        await pool.open(wait=True, timeout=settings.startup_timeout_s)
    except Exception as exc:
        await pool.close()
        raise StartupError(f"Postgres did not accept connections: {exc!r}") from exc
    return pool


async def run(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set or the process receives SIGTERM/SIGINT."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        pool = await _open_pool(settings)
        try:
            missing = await _check_kafka(settings)
            if missing:
                raise StartupError(
                    f"topics {', '.join(missing)} do not exist: run `matcher migrate` first"
                )
            log.info(
                "matcher ready",
                extra={
                    "kafka": settings.kafka_bootstrap_servers,
                    "events_topic": settings.events_topic,
                    "resume_topic": settings.resume_topic,
                },
            )
            await stop.wait()
            log.info("stopping")
        finally:
            await pool.close()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("stopped")
