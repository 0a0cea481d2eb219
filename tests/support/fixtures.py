"""The fixtures every test tier shares: real Kafka and Postgres, and fresh state per test.

Where the services come from, in order:
1. ``MATCHER_KAFKA_BOOTSTRAP_SERVERS`` and ``MATCHER_DATABASE_URL``, when both are set;
2. testcontainers, when a Docker engine answers;
3. the project's devstack (started if it is not running).

Each test gets its own database, cloned from a migrated template (fast: a file copy),
and its own topic names, so tests cannot see each other's rows or messages.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from matcher.config import Settings
from matcher.store.migrate import migrate
from tests.support.services import (
    Services,
    create_database,
    docker_answers,
    drop_database,
    own_database,
    own_settings,
    with_database,
)


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    kafka = os.environ.get("MATCHER_KAFKA_BOOTSTRAP_SERVERS")
    database = os.environ.get("MATCHER_DATABASE_URL")
    if kafka and database:
        yield Services(kafka, database)
        return
    if docker_answers():
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
    from matcher_devstack.stack import Devstack

    stack = Devstack()
    stack.up()
    env = stack.env()
    yield Services(env["MATCHER_KAFKA_BOOTSTRAP_SERVERS"], env["MATCHER_DATABASE_URL"])


@pytest.fixture(scope="session")
def template_db(services: Services) -> Iterator[str]:
    """A database with every migration applied, cloned for each test."""
    name = f"matcher_tpl_{uuid.uuid4().hex[:12]}"
    create_database(services, name)
    try:
        migrate(with_database(services.database_url, name))
        yield name
    finally:
        drop_database(services, name)


@pytest.fixture
def empty_db(services: Services) -> Iterator[str]:
    """The URL of a new, empty database (no migrations applied)."""
    name = f"matcher_t_{uuid.uuid4().hex[:12]}"
    create_database(services, name)
    try:
        yield with_database(services.database_url, name)
    finally:
        drop_database(services, name)


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
