"""``WorkerSettings``: the resume worker's (``matcher worker``, ``matcher.sdk.worker``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from matcher.config.checks import check_address, check_topic
from matcher.config.kafka import KafkaSettings


class WorkerSettings(KafkaSettings):
    """The resume worker's settings: the database and the resume topic, and how it
    consumes, retries and sweeps. Field ``foo`` is read from ``MATCHER_FOO``."""

    database_url: SecretStr = Field(
        description="libpq connection URI of matcher's Postgres database, where the worker "
        "advances runs and its handler writes in the same transaction. Required.",
    )
    resume_topic: str = Field(
        default="matcher.resumes", description="The topic resumes are consumed from."
    )
    worker_group: str = Field(
        default="matcher-worker",
        min_length=1,
        description="The Kafka consumer group of the workers of one application (workers "
        "of different applications sharing a resume topic need groups of their own).",
    )
    worker_tenants: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Only resumes of these tenants (comma-separated; empty: every tenant); "
        "the others are skipped, for other applications' workers.",
    )
    worker_run_prefix: str | None = Field(
        default=None, description="Only resumes whose run id starts with this."
    )
    worker_concurrency: int = Field(
        default=8, ge=1, le=1000, description="Handlers running at once (one per run at most)."
    )
    worker_batch_max: int = Field(
        default=32,
        ge=1,
        le=1000,
        description="The most resumes (of distinct runs) attempted in one transaction when "
        "several are ready and the handler is quick (about 20 ms of handler time per "
        "batch); 1: one transaction per resume. A batch that fails in any way is retried "
        "one resume at a time.",
    )
    worker_max_attempts: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="A handler that fails this many times on one resume parks it (a "
        "matcher.worker_failures row, shown by explain and the console; `matcher resumes "
        "retry` gives it back).",
    )
    worker_backoff_s: float = Field(
        default=1.0,
        gt=0,
        description="The wait before a failed resume's second attempt; it doubles after "
        "each failure, up to MATCHER_WORKER_BACKOFF_MAX_S.",
    )
    worker_backoff_max_s: float = Field(
        default=60.0, gt=0, description="The longest wait between two attempts."
    )
    worker_not_ready_limit_s: float = Field(
        default=3600.0,
        gt=0,
        description="How long a run may stay not ready (its handler raises Retry, or an "
        "earlier resume of the run is not advanced yet) before its resume is parked.",
    )
    worker_handler_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="The longest an async handler may run; past it the transaction rolls "
        "back and the attempt counts as failed (a sync handler is not interrupted).",
    )
    worker_sweep_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="How often the worker asks the database for resolutions no worker "
        "advanced (matcher.unadvanced_resolutions_v1): a lost offset, an expired retention "
        "or a deleted topic never strands a run.",
    )
    worker_sweep_after_s: float = Field(
        default=60.0,
        ge=0,
        description="A resolution is swept once it was committed this long ago (sooner, the "
        "resume topic is still bringing it).",
    )
    worker_sweep_window: timedelta = Field(
        default=timedelta(days=7),
        gt=timedelta(0),
        description="How far back the sweep looks (ISO-8601 duration or seconds).",
    )
    worker_shutdown_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="On SIGTERM: how long running handlers may take to finish; past it they "
        "are cancelled and their transactions roll back (their resumes come again).",
    )
    worker_commit_interval_ms: int = Field(
        default=500,
        ge=0,
        le=60_000,
        description="The least time between two commits of the resume topic's offsets.",
    )
    worker_metrics_address: str | None = Field(
        default=None,
        description="HOST:PORT to serve the worker's Prometheus metrics on (`matcher "
        "worker`; unset: not served).",
    )

    @field_validator("worker_tenants", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("worker_sweep_window", mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return timedelta(seconds=float(value))
            except ValueError:
                return value
        return value

    @field_validator("resume_topic")
    @classmethod
    def _check_topic(cls, value: str) -> str:
        return check_topic(value)

    @field_validator("worker_metrics_address")
    @classmethod
    def _check_metrics_address(cls, value: str | None) -> str | None:
        return value if value is None else check_address(value)

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: SecretStr) -> SecretStr:
        try:
            conninfo_to_dict(value.get_secret_value())
        except psycopg.ProgrammingError as exc:
            raise ValueError(f"not a URI libpq can read ({str(exc).partition(':')[0]})") from None
        return value
