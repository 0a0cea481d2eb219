"""Configuration: every setting is a ``MATCHER_*`` environment variable, validated at start.

A bad configuration fails before anything connects anywhere, with one line per problem
that names the variable, what is wrong, and (for non-secret values) what was given.
"""

from __future__ import annotations

import contextlib
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from matcher.auth.policy import Policy
from matcher.logs import quoted

ENV_PREFIX = "MATCHER_"
# The admin token guards /v1 and the console: long enough that guessing it, even at the
# rate the throttle allows (matcher.admin.throttle), is hopeless; 32 hex digits are 128 bits.
ADMIN_TOKEN_MIN_LENGTH = 32
ADMIN_TOKEN_MIN_DISTINCT = 8

# libpq parameters every daemon connection gets unless the URL says otherwise.
_CONNECTION_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}

# Kafka topic names: the broker's own rule (legal characters, at most 249 of them).
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_HOST_PORT_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


class ConfigError(Exception):
    """Raised with one human-readable line per bad setting."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class KafkaSettings(BaseSettings):
    """What every process that reads or writes the events topic needs: Kafka, the producer
    registry and the gate's limits, logging. The ingress (no database) runs on these alone.
    Field ``foo`` is read from ``MATCHER_FOO``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    kafka_bootstrap_servers: str = Field(
        description="Comma-separated host:port list of Kafka brokers. Required. When it and "
        "MATCHER_DATABASE_URL are both set, `make run`, `make migrate` and `make test` use "
        "them and leave the local stack alone.",
    )
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT",
        description="Kafka's security protocol, passed straight to the clients.",
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None,
        description="The SASL mechanism; required with a SASL_* protocol (with "
        "MATCHER_KAFKA_SASL_USERNAME and MATCHER_KAFKA_SASL_PASSWORD).",
    )
    kafka_sasl_username: str | None = Field(default=None, description="The SASL user name.")
    kafka_sasl_password: SecretStr | None = Field(
        default=None, description="The SASL password (never logged)."
    )
    kafka_ssl_cafile: str | None = Field(
        default=None, description="TLS: the CA bundle that verifies the brokers (a PEM file)."
    )
    kafka_ssl_certfile: str | None = Field(
        default=None, description="TLS: this client's certificate, for mutual TLS (a PEM file)."
    )
    kafka_ssl_keyfile: str | None = Field(
        default=None, description="TLS: the private key of that certificate (a PEM file)."
    )
    events_topic: str = Field(
        default="matcher.events", description="The topic completion events come in on."
    )
    kafka_request_timeout_ms: int = Field(
        default=5000,
        ge=500,
        le=600_000,
        description="How long a producer waits for one broker's answer before it retries "
        "the request (after a metadata refresh: elsewhere, once the partition's leader "
        "moved): what a broker that hangs (paused, partitioned away) costs, not a whole "
        "call's bound.",
    )
    producers_file: Path | None = Field(
        default=None,
        description="The producer registry (TOML): who may send what, with which keys. "
        "Required by `matcher run` (unless MATCHER_ALLOW_UNSIGNED) and `matcher ingress`; "
        "reloaded when it changes and on SIGHUP.",
    )
    producers_reload_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="How often the producers file is checked for changes (SIGHUP reloads it "
        "at once).",
    )
    allow_unsigned: bool = Field(
        default=False,
        description="Local development only: accept unsigned events from producers that are "
        "not in the producers file (logged loudly at start; `make run` sets it when no "
        "producers file is given). A producer that is in the file must still sign.",
    )
    signature_tolerance_s: float = Field(
        default=300.0,
        gt=0,
        description="How far a signed timestamp may be from the record's arrival at the "
        "broker (its LogAppendTime), either way, not from when it is read: the replay "
        "window. Must be the same for the ingress and the daemon.",
    )
    max_event_bytes: int = Field(
        default=1024 * 1024, ge=1, description="The most bytes a record's value may hold."
    )
    max_header_bytes: int = Field(
        default=16 * 1024,
        ge=1,
        description="The most bytes a record's key and headers may hold together.",
    )
    max_headers: int = Field(
        default=64, ge=1, le=10_000, description="The most headers a record may have."
    )
    max_json_depth: int = Field(
        default=64, ge=2, le=500, description="The deepest nesting of an event's JSON."
    )
    max_signatures: int = Field(
        default=8,
        ge=1,
        le=100,
        description="The most entries a webhook-signature header may hold (more is "
        "limit_exceeded).",
    )
    max_batch_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024 * 1024,
        description="A record batch decompressed past this is quarantined whole as "
        "undecodable (compression bombs: the broker bounds a batch by its compressed size).",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="The least level logged."
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="text: one escaped line per record, for people; json: one JSON object "
        "per line.",
    )
    startup_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="How long startup waits for Kafka and Postgres before giving up.",
    )

    @field_validator("log_level", "kafka_security_protocol", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",") if s.strip()]
        if not servers:
            raise ValueError("must list at least one host:port")
        for server in servers:
            match = _HOST_PORT_RE.match(server)
            if match is None or not 1 <= int(match.group(2)) <= 65535:
                raise ValueError(f"each entry must be host:port, and {quoted(server)} is not")
        return ",".join(servers)

    @field_validator("events_topic")
    @classmethod
    def _check_events_topic(cls, value: str) -> str:
        return check_topic(value)

    @model_validator(mode="after")
    def _check_sasl(self) -> Self:
        if self.kafka_security_protocol.startswith("SASL_") and self.kafka_sasl_mechanism is None:
            raise ValueError("MATCHER_KAFKA_SASL_MECHANISM is required with a SASL_* protocol")
        return self

    def policy(self) -> Policy:
        """The gate's limits and rules, from these settings."""
        return Policy(
            require_signatures=not self.allow_unsigned,
            timestamp_tolerance=timedelta(seconds=self.signature_tolerance_s),
            max_value_bytes=self.max_event_bytes,
            max_header_bytes=self.max_header_bytes,
            max_headers=self.max_headers,
            max_json_depth=self.max_json_depth,
            max_signatures=self.max_signatures,
        )

    def request_timeout_ms(self, call_bound_s: float) -> int:
        """A producer's wait for one broker's answer within a call bounded at
        ``call_bound_s``: ``kafka_request_timeout_ms``, never longer than the call."""
        return min(self.kafka_request_timeout_ms, int(call_bound_s * 1000))

    def kafka_client_options(self) -> dict[str, Any]:
        """Keyword arguments every aiokafka client gets (servers and security)."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.kafka_bootstrap_servers,
            "security_protocol": self.kafka_security_protocol,
        }
        if self.kafka_security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            options["ssl_context"] = create_ssl_context(
                cafile=self.kafka_ssl_cafile,
                certfile=self.kafka_ssl_certfile,
                keyfile=self.kafka_ssl_keyfile,
            )
        if self.kafka_sasl_mechanism is not None:
            options["sasl_mechanism"] = self.kafka_sasl_mechanism
            options["sasl_plain_username"] = self.kafka_sasl_username
            if self.kafka_sasl_password is not None:
                options["sasl_plain_password"] = self.kafka_sasl_password.get_secret_value()
        return options


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
        missing = {k: v for k, v in _CONNECTION_DEFAULTS.items() if k not in given}
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


class IngressSettings(KafkaSettings):
    """``matcher ingress``: the webhook ingress (Kafka and the producers file; no database)."""

    ingress_address: str = Field(
        default="127.0.0.1:8080",
        description="HOST:PORT the webhook ingress listens on (port 0: any free port, logged "
        "at start).",
    )
    ingress_max_concurrency: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="Requests judged and forwarded at once, each taken once its body is "
        "complete; past it a request gets 503 with Retry-After at once.",
    )
    ingress_max_connections: int = Field(
        default=1024,
        ge=1,
        le=1_000_000,
        description="Open connections at most (idle keep-alive ones included). Past it a new "
        "connection evicts one waiting on its client (of the address holding the most, the "
        "longest waiting); with every connection busy, 503. Bodies being read hold at most "
        "this times MATCHER_MAX_EVENT_BYTES of memory.",
    )
    ingress_read_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A request's headers must arrive within this, or the connection is "
        "closed; its body within as long again, or it is answered 408.",
    )
    ingress_min_body_rate_bps: int = Field(
        default=500,
        ge=0,
        description="A body must keep arriving at this many bytes per second at least (after "
        "its first second), or it is answered 408 (0: no minimum).",
    )
    ingress_produce_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Kafka must acknowledge a record within this; past it the sender gets "
        "503 (the record may still be written: a retry is a duplicate).",
    )
    ingress_drain_timeout_s: float = Field(
        default=20.0,
        gt=0,
        description="On SIGTERM: stop accepting, and let in-flight requests finish for at "
        "most this long.",
    )

    @field_validator("ingress_address")
    @classmethod
    def _check_ingress_address(cls, value: str) -> str:
        return check_address(value)

    def ingress_host_port(self) -> tuple[str, int]:
        return host_port(self.ingress_address)


def check_address(value: str) -> str:
    match = _HOST_PORT_RE.match(value)
    if match is None or not 0 <= int(match.group(2)) <= 65535:
        raise ValueError("must be HOST:PORT (port 0: any free port)")
    return value


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def check_topic(value: str) -> str:
    if not _TOPIC_RE.match(value) or value in (".", ".."):
        raise ValueError("a Kafka topic name is 1-249 of the characters A-Z a-z 0-9 . _ -")
    return value


def describe_problem(error: Any) -> str:
    """One line for one pydantic error: the variable, the problem, and the given value."""
    loc = [str(part) for part in error.get("loc", ()) if part != "__root__"]
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if not loc:
        return message
    field = loc[0]
    variable = ENV_PREFIX + field.upper()
    if error.get("type") == "missing":
        return f"{variable}: required, not set"
    given = error.get("input")
    secret = any(word in field for word in ("password", "url", "secret", "token"))
    if given is None or secret or isinstance(given, dict):
        return f"{variable}: {message}"
    return f"{variable}: {message} (got {quoted(str(given))})"


def load_settings(**overrides: Any) -> Settings:
    """Read the settings from the environment; raise ConfigError listing every problem."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError([describe_problem(e) for e in exc.errors()]) from None


def load_ingress_settings(**overrides: Any) -> IngressSettings:
    """The ingress's settings from the environment; ConfigError lists every problem."""
    try:
        return IngressSettings(**overrides)
    except ValidationError as exc:
        raise ConfigError([describe_problem(e) for e in exc.errors()]) from None
