"""``IngressSettings``: the webhook ingress's (Kafka and the producers file; a database only
for callback URLs)."""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import Field, SecretStr, field_validator

from matcher.config.checks import CONNECTION_DEFAULTS, check_address, host_port
from matcher.config.kafka import KafkaSettings


class IngressSettings(KafkaSettings):
    """``matcher ingress``: the webhook ingress (Kafka and the producers file; the database
    only if it serves callback URLs)."""

    database_url: SecretStr | None = Field(
        default=None,
        description="libpq connection URI of matcher's Postgres database, for callback URLs "
        "(POST /v1/callbacks/{token}) and the records of refused deliveries that explain and "
        "the console show; unset, the callback route answers 501, refusals are only logged, "
        "and webhooks work as before. Its role needs only EXECUTE on "
        "matcher.complete_callback_v1 and matcher.record_refusals_v1.",
    )
    ingress_refusal_records_per_s: float = Field(
        default=20.0,
        ge=0,
        le=10_000,
        description="Refused deliveries recorded in the database per second at most (bursts "
        "of 10 times as many); past it a refusal is only logged and counted in "
        "matcher_ingress_refusals_unrecorded_total, so a flood of bad requests costs a "
        "bounded number of rows. 0: record none.",
    )
    ingress_db_pool_max_size: int = Field(
        default=4,
        ge=1,
        le=1000,
        description="Database connections the ingress opens at most (callbacks only); a "
        "callback that finds none free within MATCHER_INGRESS_DATABASE_TIMEOUT_S gets 503.",
    )
    ingress_database_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A callback's database call (a connection and the transaction) must end "
        "within this, or the sender gets 503 (it may have been stored: a retry is answered "
        "409 with the outcome).",
    )

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

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None  # an empty variable: no database, as when it is unset
        try:
            conninfo_to_dict(value.get_secret_value())
        except psycopg.ProgrammingError as exc:
            raise ValueError(f"not a URI libpq can read ({str(exc).partition(':')[0]})") from None
        return value

    def database_conninfo(self) -> str | None:
        """The database URL with the daemon's connection defaults where it sets none (a
        connect timeout and TCP keepalives: a database that went away is noticed in
        seconds); None without a database."""
        if self.database_url is None:
            return None
        url = self.database_url.get_secret_value()
        given = conninfo_to_dict(url)
        missing = {k: v for k, v in CONNECTION_DEFAULTS.items() if k not in given}
        return make_conninfo(url, **missing) if missing else url

    @field_validator("ingress_address")
    @classmethod
    def _check_ingress_address(cls, value: str) -> str:
        return check_address(value)

    def ingress_host_port(self) -> tuple[str, int]:
        return host_port(self.ingress_address)
