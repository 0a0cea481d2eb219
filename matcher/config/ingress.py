"""``IngressSettings``: the webhook ingress's (Kafka and the producers file; no database)."""

from __future__ import annotations

from pydantic import Field, field_validator

from matcher.config.checks import check_address, host_port
from matcher.config.kafka import KafkaSettings


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
