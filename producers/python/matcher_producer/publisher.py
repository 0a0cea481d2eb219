"""Publish signed completion events with an idempotent producer (acks=all)."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaProducer

from matcher_producer.event import CompletionEvent, encode
from matcher_producer.signing import SigningKey, sign_record


class EventPublisher:
    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        keys: SigningKey | list[SigningKey] | None,
        *,
        structured: bool = False,
        **kafka_options: Any,
    ) -> None:
        self._topic = topic
        self._keys = [keys] if isinstance(keys, SigningKey) else list(keys or [])
        self._structured = structured
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers,
            enable_idempotence=True,
            acks="all",
            **kafka_options,
        )

    async def __aenter__(self) -> EventPublisher:
        await self._producer.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._producer.stop()

    async def publish(self, event: CompletionEvent) -> None:
        """Send one event and wait until Kafka has it (all in-sync replicas)."""
        record = encode(event, structured=self._structured)
        if self._keys:
            record = sign_record(record, event.id, self._keys)
        await self._producer.send_and_wait(
            self._topic, record.value, key=record.key, headers=record.headers
        )
