"""``Settings``: the daemon's and the CLI's settings."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any, Self
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import Field, SecretStr, field_validator, model_validator

from matcher.config.checks import (
    ADMIN_TOKEN_MIN_DISTINCT,
    ADMIN_TOKEN_MIN_LENGTH,
    CONNECTION_DEFAULTS,
    check_address,
    check_topic,
    host_port,
)
from matcher.config.kafka import KafkaSettings


class Settings(KafkaSettings):
    """The daemon's and the CLI's settings. Field ``foo`` is read from ``MATCHER_FOO``."""

    database_url: SecretStr = Field(
        description="libpq connection URI of the Postgres database "
        "(postgresql://user:pass@host:port/db). Required. For a Postgres that fails over: "
        "several host:port and target_session_attrs=read-write.",
    )
    resume_topic: str = Field(
        default="matcher.resumes", description="The topic resumes are published on."
    )
    topic_partitions: int = Field(
        default=6,
        ge=1,
        le=10_000,
        description="Partitions of the topics `matcher migrate` creates (existing topics are "
        "left as they are).",
    )
    topic_replication_factor: int | None = Field(
        default=None,
        ge=1,
        le=32,
        description="Replicas of the topics `matcher migrate` creates. Unset: three, or one "
        "per broker on a cluster with fewer than three.",
    )
    consumer_group: str = Field(
        default="matcher",
        min_length=1,
        description="The Kafka consumer group every daemon of one deployment shares.",
    )
    db_pool_min_size: int = Field(
        default=2, ge=1, description="The Postgres pool's least connections."
    )
    db_pool_max_size: int = Field(
        default=8,
        ge=1,
        description="The Postgres pool's most connections (a daemon opens this + 2 in all: "
        "the relay's and the rematch loop's listeners).",
    )
    quarantine_keep_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="A rejected record's value is kept whole (replayable) up to this; a "
        "larger one as a 4 KiB prefix with its size and SHA-256 (not replayable), so the "
        "quarantine cannot grow faster than this per record.",
    )
    quarantine_retention: timedelta = Field(
        default=timedelta(days=30),
        gt=timedelta(0),
        description="Quarantined records are deleted this long after they were quarantined "
        "(ISO-8601 duration, P30D, or seconds).",
    )
    dead_letter_topic: str | None = Field(
        default=None,
        description="When set, rejected records are also copied to this topic (the "
        "quarantine table always has them). It must exist (`matcher migrate` creates it) "
        "and differ from the events and resume topics.",
    )
    dead_letter_call_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="The longest one Kafka call of the dead-letter copy may take; past it "
        "the producer is rebuilt (the copy is dropped and counted).",
    )
    ingest_batch_max: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Kafka records per ingest batch; each batch is one transaction. Larger "
        "batches share a cycle's fixed costs among more events at full rate; at lower "
        "rates batches are smaller than this anyway.",
    )
    ingest_poll_timeout_ms: int = Field(
        default=200, ge=1, description="How long one ingest poll waits for records."
    )
    ingest_max_poll_interval_ms: int = Field(
        default=300_000,
        ge=1000,
        description="Kafka's max.poll.interval.ms for the ingest consumer.",
    )
    ingest_commit_interval_ms: int = Field(
        default=100,
        ge=0,
        le=10_000,
        description="The least time between two offset commits: a batch after a quiet spell "
        "is committed at once, a burst shares one commit. Each commit is a write to "
        "__consumer_offsets; a crash re-reads at most this much more, as duplicates the "
        "inbox key drops.",
    )
    ingest_batch_interval_ms: int = Field(
        default=4,
        ge=0,
        le=1000,
        description="The least time between the starts of two ingest transactions (0: none). "
        "Under a steady flow a transaction then carries a few milliseconds of events rather "
        "than one, and a cycle's fixed costs (a transaction and its commit, a relay batch) "
        "are shared; a batch after a quiet spell goes at once, a full batch never waits. A "
        "revocation waits for a batch being paced, so it may wait this much longer. "
        "Measured in docs/benchmarks/tuning.md.",
    )
    ingest_fetch_wait_ms: int = Field(
        default=8,
        ge=0,
        le=100,
        description="While events flow (at least 8 records in the last 8 fetches), how long "
        "the broker may hold an ingest fetch to gather more (0: never), so that a fetch "
        "carries a few milliseconds of events rather than one; a sparse flow and an idle "
        "daemon fetch as without it (matcher/kafka/fetch_wait.py). Measured in "
        "docs/benchmarks/tuning.md.",
    )
    kafka_session_timeout_ms: int = Field(
        default=10_000,
        ge=1000,
        description="How soon the consumer group notices a daemon that died (its partitions "
        "then move).",
    )
    kafka_heartbeat_interval_ms: int = Field(
        default=3_000,
        ge=100,
        description="How often the consumer heartbeats; below the session timeout.",
    )
    relay_batch_max: int = Field(
        default=1000, ge=1, le=100_000, description="Resumes claimed and published per batch."
    )
    relay_linger_ms: int = Field(
        default=0,
        ge=0,
        description="The resume producer's linger. The relay hands Kafka whole per-partition "
        "batches, so lingering batches nothing more: it only adds its milliseconds to every "
        "resume.",
    )
    relay_poll_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="The relay's safety-net poll of the outbox (a NOTIFY wakes it first).",
    )
    relay_call_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="The longest one Kafka call of the relay may take (a start, a batch's "
        "acknowledgements, a stop); past it the batch is rolled back and the producer "
        "rebuilt.",
    )
    rematch_batch_max: int = Field(
        default=500,
        ge=1,
        le=100_000,
        description="Keys per rematch transaction (newly registered waits, and keys ingest "
        "left busy, against stored events).",
    )
    rematch_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="The rematch pass's safety-net poll (a NOTIFY at each registration wakes "
        "it first).",
    )
    sweep_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often deadlines are swept: a timeout fires up to this late.",
    )
    sweep_batch_max: int = Field(
        default=1000, ge=1, description="Waits timed out per sweep transaction."
    )
    inbox_retention: timedelta = Field(
        default=timedelta(days=7),
        gt=timedelta(0),
        description="Pending events expire this long after they arrived (ISO-8601 duration, "
        "P7D, or seconds).",
    )
    inbox_purge_after: timedelta = Field(
        default=timedelta(days=7),
        ge=timedelta(0),
        description="A day of events is dropped this long after the retention. Retention + "
        "purge-after is the window in which duplicates are recognised (14 days by default, "
        "and up to a day more).",
    )
    janitor_interval_s: float = Field(
        default=60.0,
        gt=0,
        description="How often the janitor expires pending events, purges the quarantine and "
        "makes and drops inbox days.",
    )
    shutdown_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="How long SIGTERM waits for the loops to finish their batches (the "
        "chart's termination grace is this + 15 s).",
    )
    admin_address: str = Field(
        default="127.0.0.1:9464",
        description="HOST:PORT of the admin HTTP API and the console (port 0: any free port).",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="When set, /v1 and the console require it (a bearer header, or the "
        "console's sign-in). Set but empty is refused (it would read as protected and "
        "protect nothing), and so is one shorter than 32 characters or with fewer than 8 "
        "distinct: `openssl rand -hex 32` makes one.",
    )
    admin_auth_failures_burst: int = Field(
        default=10,
        ge=1,
        description="Failed attempts at the admin token one client address may make at once "
        "(sign-in, bearer headers); then one per MATCHER_ADMIN_AUTH_FAILURE_INTERVAL_S, "
        "past which the answer is 429 with Retry-After.",
    )
    admin_auth_failure_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="After the burst, one failed attempt per this many seconds per address.",
    )
    stats_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="How often the system-wide gauges are read from Postgres.",
    )

    @field_validator("inbox_retention", "inbox_purge_after", "quarantine_retention", mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> Any:
        # Durations are ISO-8601 ("P7D", "PT12H") or a plain number of seconds.
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return timedelta(seconds=float(value))
        return value

    @field_validator("admin_token")
    @classmethod
    def _check_admin_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        token = value.get_secret_value()
        if not token.strip():
            raise ValueError("is empty: unset it to leave /v1 open, or give a token")
        if len(token) < ADMIN_TOKEN_MIN_LENGTH or len(set(token)) < ADMIN_TOKEN_MIN_DISTINCT:
            raise ValueError(
                f"is too weak ({len(token)} characters, {len(set(token))} distinct): give at "
                f"least {ADMIN_TOKEN_MIN_LENGTH} characters, {ADMIN_TOKEN_MIN_DISTINCT} of them "
                "distinct, e.g. the output of `openssl rand -hex 32`"
            )
        return value

    def database_conninfo(self) -> str:
        """The database URL with the connection defaults a daemon needs to survive a
        failover, where the URL does not set them: ``connect_timeout`` (libpq applies it
        per host, so a primary that vanished does not hold every reconnect for the OS's
        minutes-long TCP timeout before the next host of a multi-host URL is tried) and
        TCP keepalives (a connection to a host that went away is noticed in seconds)."""
        url = self.database_url.get_secret_value()
        given = conninfo_to_dict(url)
        missing = {k: v for k, v in CONNECTION_DEFAULTS.items() if k not in given}
        return make_conninfo(url, **missing) if missing else url

    @field_validator("admin_address")
    @classmethod
    def _check_admin_address(cls, value: str) -> str:
        return check_address(value)

    def admin_host_port(self) -> tuple[str, int]:
        return host_port(self.admin_address)

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: SecretStr) -> SecretStr:
        parts = urlsplit(value.get_secret_value())
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError("must be a postgresql:// URI")
        try:
            conninfo_to_dict(value.get_secret_value())
        except psycopg.ProgrammingError as exc:
            # libpq's words up to the colon: what follows quotes the URI, password and all.
            raise ValueError(f"not a URI libpq can read ({str(exc).partition(':')[0]})") from None
        return value

    @field_validator("resume_topic", "dead_letter_topic")
    @classmethod
    def _check_topic(cls, value: str | None) -> str | None:
        return value if value is None else check_topic(value)

    @model_validator(mode="after")
    def _check_relations(self) -> Self:
        if self.dead_letter_topic in (self.events_topic, self.resume_topic):
            raise ValueError("MATCHER_DEAD_LETTER_TOPIC must differ from the other topics")
        if self.events_topic == self.resume_topic:
            raise ValueError(
                "MATCHER_EVENTS_TOPIC and MATCHER_RESUME_TOPIC must be different topics"
            )
        if self.kafka_heartbeat_interval_ms >= self.kafka_session_timeout_ms:
            raise ValueError(
                "MATCHER_KAFKA_HEARTBEAT_INTERVAL_MS must be below MATCHER_KAFKA_SESSION_TIMEOUT_MS"
            )
        if self.db_pool_min_size > self.db_pool_max_size:
            raise ValueError("MATCHER_DB_POOL_MIN_SIZE must not exceed MATCHER_DB_POOL_MAX_SIZE")
        return self
