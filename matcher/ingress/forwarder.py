"""The ingress's one Kafka producer: idempotent, ``acks=all``, every call bounded.

A request is answered 2xx only after Kafka acknowledged its record. The producer is
started in the background and restarted while Kafka is away, so the HTTP side is up (and
answers 503 with Retry-After) even when Kafka is not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from matcher.config import IngressSettings
from matcher.ingress.metrics import PRODUCE_ERRORS
from matcher.kafka.deadlines import acknowledged, start_producer, stop_producer

log = logging.getLogger("matcher.ingress")

_RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)


class KafkaUnavailable(Exception):
    """Kafka did not take the record in time (or refused it): answer 503."""


class Forwarder:
    def __init__(self, settings: IngressSettings) -> None:
        self._settings = settings
        self._producer: AIOKafkaProducer | None = None
        self._started = asyncio.Event()

    def _request_timeout_ms(self) -> int:
        return self._settings.request_timeout_ms(self._settings.ingress_produce_timeout_s)

    def _new_producer(self) -> AIOKafkaProducer:
        timeout_ms = self._request_timeout_ms()
        return AIOKafkaProducer(
            **self._settings.kafka_client_options(),
            enable_idempotence=True,
            acks="all",
            linger_ms=0,  # a sender is waiting for each record
            request_timeout_ms=timeout_ms,
            max_request_size=self._settings.max_event_bytes + 2 * self._settings.max_header_bytes,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Start the producer (retrying while Kafka is away) and keep it until ``stop``."""
        attempt = 0
        while not stop.is_set():
            producer = self._new_producer()
            try:
                await start_producer(producer, self._settings.startup_timeout_s)
            except (KafkaError, OSError, TimeoutError) as exc:
                delay = _RESTART_BACKOFF_S[min(attempt, len(_RESTART_BACKOFF_S) - 1)]
                attempt += 1
                log.warning(
                    "Kafka producer not started; retrying",
                    extra={"error": f"{type(exc).__name__}: {exc}", "retry_in_s": delay},
                )
                try:
                    async with asyncio.timeout(delay):
                        await stop.wait()
                except TimeoutError:
                    continue
                return
            self._producer = producer
            self._started.set()
            log.info("Kafka producer started")
            await stop.wait()

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await stop_producer(producer, self._settings.ingress_produce_timeout_s)

    async def send(
        self, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]]
    ) -> datetime:
        """Publish one record; once Kafka acknowledged it, the time the broker appended it
        (the arrival the daemon judges it by: events topics keep ``LogAppendTime``), or
        the time of the acknowledgement when the broker gives none."""
        producer = self._producer
        if producer is None:
            raise KafkaUnavailable("the Kafka producer is not started")
        try:
            async with asyncio.timeout(self._settings.ingress_produce_timeout_s):
                future = await producer.send(
                    self._settings.events_topic, value, key=key, headers=list(headers)
                )
                (metadata,) = await acknowledged(
                    producer,
                    [future],
                    timeout_s=self._settings.ingress_produce_timeout_s,
                    refresh_every_s=self._request_timeout_ms() / 1000,
                )
        except (KafkaError, OSError, TimeoutError) as exc:
            PRODUCE_ERRORS.inc()
            log.warning(
                "Kafka did not acknowledge a record",
                extra={"error": f"{type(exc).__name__}: {exc}"},
            )
            raise KafkaUnavailable(str(exc)) from None
        if metadata.timestamp is None or metadata.timestamp < 0:
            return datetime.now(UTC)
        return datetime.fromtimestamp(metadata.timestamp / 1000, UTC)

    async def reachable(self) -> bool:
        """Whether a broker answers (a metadata request for the events topic, bounded)."""
        producer = self._producer
        if producer is None:
            return False
        try:
            async with asyncio.timeout(2):
                partitions = await producer.partitions_for(self._settings.events_topic)
        except (KafkaError, OSError, TimeoutError):
            return False
        return bool(partitions)
