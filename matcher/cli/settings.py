"""The settings a verb needs, and the connections it makes. A verb asks only for the
services it uses: `waits list` needs no Kafka settings, `emit` no database URL."""

from __future__ import annotations

import importlib
import logging
import os
import time
import uuid
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

import psycopg
from pydantic import SecretStr, ValidationError, field_validator

from matcher import logs
from matcher.cli.output import (
    EXIT_NOT_MIGRATED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    fail,
    one_line,
    validation_lines,
)
from matcher.config import KafkaSettings, Settings, describe_problem
from matcher.logs import quoted
from matcher.store.migrate import schema_problem


class AnyServices(Settings):
    """The settings with both services optional (empty: not configured)."""

    kafka_bootstrap_servers: str = ""
    database_url: SecretStr = SecretStr("")

    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        return value if value == "" else Settings._check_bootstrap(value)

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: SecretStr) -> SecretStr:
        return value if value.get_secret_value() == "" else Settings._check_database_url(value)


def settings_for(*, postgres: bool = True, kafka: bool = True, **overrides: Any) -> Settings:
    problems: list[str] = []
    settings: Settings | None = None
    try:
        settings = AnyServices(**overrides)
    except ValidationError as exc:
        problems = [describe_problem(e) for e in exc.errors()]
    wanted = {"database_url": postgres, "kafka_bootstrap_servers": kafka}
    for field, needed in wanted.items():
        if needed and not _given(field, settings, overrides):
            problems.append(f"MATCHER_{field.upper()}: required, not set")
    if problems or settings is None:
        fail([f"matcher: configuration error: {p}" for p in problems], code=EXIT_USAGE)
    return settings


def _given(field: str, settings: Settings | None, overrides: Mapping[str, Any]) -> bool:
    if settings is not None:
        value = getattr(settings, field)
        return bool(value.get_secret_value() if isinstance(value, SecretStr) else value)
    # The settings did not validate: was the variable given at all? (Read as pydantic-
    # settings reads it: case-insensitively, empty meaning unset here.)
    variable = f"MATCHER_{field.upper()}"
    return bool(overrides.get(field)) or any(
        name.upper() == variable and value for name, value in os.environ.items()
    )


def configure_logging(settings: KafkaSettings) -> None:
    logs.configure(settings.log_level, settings.log_format)


def quiet_clients() -> None:
    """For the verbs that are Kafka clients (not the daemon): the Kafka client's own log
    lines ("Unable connect to ...") are not for the person at the terminal, who gets one
    line saying what failed."""
    for name in ("aiokafka", "kafka", "matcher.lag"):
        logger = logging.getLogger(name)
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


def parse_filters(model: type[Any], options: Mapping[str, str], **values: Any) -> Any:
    """The shared filter model of a list (matcher.admin.filters), or exit 2 naming the
    option that is wrong."""
    try:
        return model(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        fail(validation_lines(exc, options), code=EXIT_USAGE)


def connect(settings: Settings) -> Any:
    try:
        return psycopg.connect(settings.database_url.get_secret_value(), autocommit=True)
    except psycopg.OperationalError as exc:
        fail([f"matcher: cannot reach Postgres: {one_line(exc)}"], code=EXIT_UNREACHABLE)


def require_schema(settings: Settings) -> None:
    """Before the daemon starts: Postgres answers (within the startup timeout) and has
    every migration, so a missing schema is said at once rather than by a dying loop."""
    deadline = time.monotonic() + settings.startup_timeout_s
    while True:
        try:
            with psycopg.connect(
                settings.database_url.get_secret_value(), autocommit=True, connect_timeout=5
            ) as conn:
                problem = schema_problem(conn)
            break
        except psycopg.OperationalError as exc:
            if time.monotonic() >= deadline:
                fail(
                    [f"matcher: cannot start: Postgres did not answer: {one_line(exc)}"],
                    code=EXIT_UNREACHABLE,
                )
            time.sleep(0.5)
    if problem is not None:
        fail([f"matcher: cannot start: {problem}: run `matcher migrate`"], EXIT_NOT_MIGRATED)


def uuid_argument(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        fail([f"matcher: {quoted(value)} is not a {what} id (a UUID)"], code=EXIT_USAGE)


def load_object(spec: str, option: str, group: str) -> Any:
    """User code a verb runs: ``module:attribute`` (the module importable from here), or the
    name of an entry point in ``group``; exit 2 naming ``option`` when it cannot be found."""
    if ":" in spec:
        module_name, _, attribute = spec.partition(":")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            fail([f"matcher: {option} {quoted(spec)}: {exc}"], code=EXIT_USAGE)
        return target
    found = entry_points(group=group, name=spec)
    if not found:
        fail(
            [f"matcher: {option} {quoted(spec)}: no such entry point in group {group}"], EXIT_USAGE
        )
    return next(iter(found)).load()
