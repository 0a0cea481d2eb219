"""``KafkaSettings``: what every process that reads or writes the events topic needs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from matcher.auth.policy import Policy
from matcher.config.checks import ENV_PREFIX, HOST_PORT_RE, check_topic
from matcher.logs import quoted


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
            match = HOST_PORT_RE.match(server)
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
