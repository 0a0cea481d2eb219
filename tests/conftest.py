"""Fixtures: real Kafka and Postgres, and fresh state for every test.

Where the services come from, in order:
1. ``MATCHER_KAFKA_BOOTSTRAP_SERVERS`` and ``MATCHER_DATABASE_URL``, when both are set;
2. testcontainers, when a Docker engine answers;
3. the project's devstack (started if it is not running).

Each test gets its own database, cloned from a migrated template (fast: a file copy),
and its own topic names, so tests cannot see each other's rows or messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from matcher.config import Settings
from matcher.kafka.topics import EVENT_TOPIC_CONFIGS, delete_topics, ensure_topics
from matcher.store.migrate import migrate


@dataclass(frozen=True)
class Services:
    kafka_bootstrap_servers: str
    database_url: str  # an existing database whose server lets us CREATE DATABASE


def with_database(url: str, name: str) -> str:
    """The same server URL, pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def _docker_answers() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        probe = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    kafka = os.environ.get("MATCHER_KAFKA_BOOTSTRAP_SERVERS")
    database = os.environ.get("MATCHER_DATABASE_URL")
    if kafka and database:
        yield Services(kafka, database)
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer
        from testcontainers.postgres import PostgresContainer

        with (
            KafkaContainer("apache/kafka:4.1.1").with_kraft() as kafka_container,
            PostgresContainer("postgres:15", driver=None) as pg_container,
        ):
            yield Services(
                kafka_container.get_bootstrap_server(), pg_container.get_connection_url()
            )
        return
    from matcher.devstack.stack import Devstack

    stack = Devstack()
    stack.up()
    env = stack.env()
    yield Services(env["MATCHER_KAFKA_BOOTSTRAP_SERVERS"], env["MATCHER_DATABASE_URL"])


def _admin_sql(services: Services, statement: sql.Composed) -> None:
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute(statement)


def _create_db(services: Services, name: str, template: str | None = None) -> None:
    if template is None:
        _admin_sql(services, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    else:
        _admin_sql(
            services,
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            ),
        )


def _drop_db(services: Services, name: str) -> None:
    _admin_sql(
        services, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


@pytest.fixture(scope="session")
def template_db(services: Services) -> Iterator[str]:
    """A database with every migration applied, cloned for each test."""
    name = f"matcher_tpl_{uuid.uuid4().hex[:12]}"
    _create_db(services, name)
    try:
        migrate(with_database(services.database_url, name))
        yield name
    finally:
        _drop_db(services, name)


@pytest.fixture
def empty_db(services: Services) -> Iterator[str]:
    """The URL of a new, empty database (no migrations applied)."""
    name = f"matcher_t_{uuid.uuid4().hex[:12]}"
    _create_db(services, name)
    try:
        yield with_database(services.database_url, name)
    finally:
        _drop_db(services, name)


@contextlib.contextmanager
def own_database(services: Services, template_db: str) -> Iterator[str]:
    """The URL of a fresh, fully migrated database, dropped when the block ends."""
    name = f"matcher_t_{uuid.uuid4().hex[:12]}"
    _create_db(services, name, template=template_db)
    try:
        yield with_database(services.database_url, name)
    finally:
        _drop_db(services, name)


# What a test's settings start from.
TEST_SETTINGS: dict[str, object] = {
    # Most tests are not about authentication; the security tests set a registry.
    "allow_unsigned": True,
    # Quick loops: tests wait on outcomes, and slow polling only slows them down.
    "ingest_poll_timeout_ms": 50,
    "relay_poll_interval_s": 0.2,
    "sweep_interval_s": 0.1,
    "janitor_interval_s": 0.5,
    "shutdown_timeout_s": 20,
    "stats_interval_s": 0.2,
    "admin_address": "127.0.0.1:0",
    "kafka_session_timeout_ms": 3000,
    "kafka_heartbeat_interval_ms": 500,
}


def _apart(work: Coroutine[Any, Any, object]) -> None:
    """Run ``work`` to its end in a thread of its own: the caller's thread may already
    run an event loop (Playwright's sync API does)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(work)
        except BaseException as exc:  # handed to the caller
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


@contextlib.contextmanager
def own_settings(services: Services, database_url: str, **overrides: object) -> Iterator[Settings]:
    """Settings on ``database_url`` with topics of their own, created first and deleted
    when the block ends; TEST_SETTINGS, then ``overrides``."""
    suffix = uuid.uuid4().hex[:10]
    result = Settings(
        kafka_bootstrap_servers=services.kafka_bootstrap_servers,
        database_url=database_url,
        events_topic=f"test.{suffix}.events",
        resume_topic=f"test.{suffix}.resumes",
        consumer_group=f"test.{suffix}",
        **(TEST_SETTINGS | overrides),  # type: ignore[arg-type]
    )
    topics = [result.events_topic, result.resume_topic]
    _apart(
        ensure_topics(
            result.kafka_client_options(),
            topics,
            partitions=result.topic_partitions,
            configs={result.events_topic: EVENT_TOPIC_CONFIGS},
        )
    )
    try:
        yield result
    finally:
        # Best effort: a broker left with thousands of test partitions slows every later run.
        with contextlib.suppress(Exception):
            _apart(delete_topics(result.kafka_client_options(), topics))


@pytest.fixture
def db_url(services: Services, template_db: str) -> Iterator[str]:
    """The URL of a fresh, fully migrated database of this test's own."""
    with own_database(services, template_db) as url:
        yield url


@pytest.fixture
def settings(services: Services, db_url: str) -> Iterator[Settings]:
    """Settings for this test: its own database and its own, already created, topics."""
    with own_settings(services, db_url) as result:
        yield result


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment a subprocess needs to use these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATCHER_")}
    env.update(
        MATCHER_KAFKA_BOOTSTRAP_SERVERS=settings.kafka_bootstrap_servers,
        MATCHER_DATABASE_URL=settings.database_url.get_secret_value(),
        MATCHER_EVENTS_TOPIC=settings.events_topic,
        MATCHER_RESUME_TOPIC=settings.resume_topic,
        MATCHER_CONSUMER_GROUP=settings.consumer_group,
        MATCHER_ALLOW_UNSIGNED=str(settings.allow_unsigned).lower(),
        MATCHER_INGEST_POLL_TIMEOUT_MS=str(settings.ingest_poll_timeout_ms),
        MATCHER_RELAY_POLL_INTERVAL_S=str(settings.relay_poll_interval_s),
        MATCHER_SWEEP_INTERVAL_S=str(settings.sweep_interval_s),
        MATCHER_JANITOR_INTERVAL_S=str(settings.janitor_interval_s),
        MATCHER_SHUTDOWN_TIMEOUT_S=str(settings.shutdown_timeout_s),
        MATCHER_STATS_INTERVAL_S=str(settings.stats_interval_s),
        MATCHER_ADMIN_ADDRESS=settings.admin_address,
        MATCHER_KAFKA_SESSION_TIMEOUT_MS=str(settings.kafka_session_timeout_ms),
        MATCHER_KAFKA_HEARTBEAT_INTERVAL_MS=str(settings.kafka_heartbeat_interval_ms),
    )
    if settings.producers_file is not None:
        env["MATCHER_PRODUCERS_FILE"] = str(settings.producers_file)
    return env
