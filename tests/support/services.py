"""The services tests run against, and fresh state per test: a database of its own
(cloned from a migrated template: a file copy), topics of its own, and the settings and
environment that point at them."""

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
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from pydantic import SecretStr

from matcher.config import Settings
from matcher.kafka.topics import EVENT_TOPIC_CONFIGS, delete_topics, ensure_topics


@dataclass(frozen=True)
class Services:
    kafka_bootstrap_servers: str
    database_url: str  # an existing database whose server lets us CREATE DATABASE


def with_database(url: str, name: str) -> str:
    """The same server URL, pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def docker_answers() -> bool:
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


def _admin_sql(services: Services, statement: sql.Composed) -> None:
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute(statement)


def create_database(services: Services, name: str, template: str | None = None) -> None:
    if template is None:
        _admin_sql(services, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    else:
        _admin_sql(
            services,
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            ),
        )


def drop_database(services: Services, name: str) -> None:
    _admin_sql(
        services, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


@contextlib.contextmanager
def own_database(services: Services, template_db: str) -> Iterator[str]:
    """The URL of a fresh, fully migrated database, dropped when the block ends."""
    name = f"matcher_t_{uuid.uuid4().hex[:12]}"
    create_database(services, name, template=template_db)
    try:
        yield with_database(services.database_url, name)
    finally:
        drop_database(services, name)


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


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment a subprocess needs to use these settings: every setting that was
    given when they were made (the services, the test's topics, TEST_SETTINGS, the test's
    own overrides), as its MATCHER_* variable: one source of the test settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATCHER_")}
    for name in sorted(settings.model_fields_set):
        value = getattr(settings, name)
        if value is not None:
            env[f"MATCHER_{name.upper()}"] = _env_value(value)
    return env


def _env_value(value: object) -> str:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, timedelta):
        return str(value.total_seconds())
    return str(value)
