"""Configuration: every setting is a ``MATCHER_*`` environment variable, validated at start.

A bad configuration fails before anything connects anywhere, with one line per problem
that names the variable, what is wrong, and (for non-secret values) what was given. Every
setting has a description, from which docs/reference/configuration.md is generated.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from matcher.config.checks import (
    ADMIN_TOKEN_MIN_DISTINCT,
    ADMIN_TOKEN_MIN_LENGTH,
    ENV_PREFIX,
    ConfigError,
    check_address,
    check_topic,
    describe_problem,
    host_port,
)
from matcher.config.daemon import Settings
from matcher.config.ingress import IngressSettings
from matcher.config.kafka import KafkaSettings
from matcher.config.worker import WorkerSettings


def load_settings(**overrides: Any) -> Settings:
    """Read the settings from the environment; raise ConfigError listing every problem."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError([describe_problem(e) for e in exc.errors()]) from None


def load_worker_settings(**overrides: Any) -> WorkerSettings:
    """The resume worker's settings from the environment; ConfigError lists every problem."""
    try:
        return WorkerSettings(**overrides)
    except ValidationError as exc:
        raise ConfigError([describe_problem(e) for e in exc.errors()]) from None


def load_ingress_settings(**overrides: Any) -> IngressSettings:
    """The ingress's settings from the environment; ConfigError lists every problem."""
    try:
        return IngressSettings(**overrides)
    except ValidationError as exc:
        raise ConfigError([describe_problem(e) for e in exc.errors()]) from None


__all__ = [
    "ADMIN_TOKEN_MIN_DISTINCT",
    "ADMIN_TOKEN_MIN_LENGTH",
    "ENV_PREFIX",
    "ConfigError",
    "IngressSettings",
    "KafkaSettings",
    "Settings",
    "WorkerSettings",
    "check_address",
    "check_topic",
    "describe_problem",
    "host_port",
    "load_ingress_settings",
    "load_settings",
    "load_worker_settings",
]
