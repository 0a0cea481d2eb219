"""The dead-letter copy: rejected records also go to ``MATCHER_DEAD_LETTER_TOPIC``.

The quarantine row is the durable record of a rejection; this copy is a convenience for
tools that watch a topic. So it must never hold ingest up: ingest hands records over
without waiting (a bounded queue; when it is full the copy is dropped and counted), and
one task sends them, every Kafka call bounded in time (``MATCHER_DEAD_LETTER_CALL_TIMEOUT_S``),
reconnecting after failures. A producer that does not stop in time is abandoned
(matcher.kafka.deadlines): an idempotent producer whose broker keeps answering with a
retriable error would otherwise go on retrying its batch in the background for ever, one
more such producer after every failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from matcher import metrics
from matcher.config import Settings
from matcher.domain.events import Rejection
from matcher.domain.quarantine import QuarantineLimits, headers_from_json, kept_of
from matcher.domain.records import IngestRecord
from matcher.kafka.deadlines import start_producer, stop_producer

log = logging.getLogger("matcher.dead_letters")

# Each copy holds at most the quarantine row's bounds (a value prefix, bounded headers).
QUEUE_MAX = 1000


def _has_neither_key_nor_value(record: IngestRecord) -> bool:
    """The client refuses such a record; its copy carries an empty value instead, and a
    ``matcher-null-value`` header says the original had none."""
    return record.key is None and record.value is None


def _headers(record: IngestRecord, rejection: Rejection) -> list[tuple[str, bytes]]:
    # Names that are not UTF-8 cannot be sent by the client; they are in the quarantine row.
    kept = [(name.decode(), value or b"") for name, value in record.headers if _is_utf8(name)]
    null = [("matcher-null-value", b"true")] if _has_neither_key_nor_value(record) else []
    return [
        *kept,
        ("matcher-reason", rejection.reason.encode()),
        ("matcher-detail", rejection.detail.encode("utf-8", "backslashreplace")[:1000]),
        ("matcher-origin", f"{record.topic}/{record.partition}/{record.offset}".encode()),
        *null,
    ]


def _value(record: IngestRecord) -> bytes | None:
    return b"" if _has_neither_key_nor_value(record) else record.value


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


class DeadLetters:
    def __init__(self, settings: Settings, topic: str, limits: QuarantineLimits) -> None:
        self._settings = settings
        self._topic = topic
        self._limits = limits
        self._queue: asyncio.Queue[IngestRecord] = asyncio.Queue(QUEUE_MAX)
        self._delay = 0.5
        self._timeout_s = settings.dead_letter_call_timeout_s  # any one Kafka call

    def offer(self, records: Sequence[IngestRecord]) -> None:
        """Queue copies of rejected records, as the quarantine keeps them; never waits."""
        for record in records:
            kept = kept_of(record.key, record.headers, record.value, self._limits)
            copy = dataclasses.replace(
                record, key=kept.key, value=kept.value, headers=headers_from_json(kept.headers)
            )
            try:
                self._queue.put_nowait(copy)
            except asyncio.QueueFull:
                metrics.DEAD_LETTERS_DROPPED.inc()

    async def run(self, stop: asyncio.Event) -> None:
        """Send until ``stop`` is set and the queue is drained (or a last attempt failed)."""
        while not (stop.is_set() and self._queue.empty()):
            producer = AIOKafkaProducer(
                **self._settings.kafka_client_options(),
                enable_idempotence=True,
                acks="all",
                request_timeout_ms=self._settings.request_timeout_ms(self._timeout_s),
            )
            try:
                await start_producer(producer, self._timeout_s)
                await self._send_until_stopped(producer, stop)
            except (TimeoutError, KafkaError, OSError) as exc:
                log.warning("dead-letter copy failed", extra={"error": exc})
                if stop.is_set():
                    break
            finally:
                await stop_producer(producer, self._timeout_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._delay)
            self._delay = min(self._delay * 2, 10.0)
        if not self._queue.empty():
            log.warning("dead-letter copies not sent", extra={"records": self._queue.qsize()})

    async def _send_until_stopped(self, producer: AIOKafkaProducer, stop: asyncio.Event) -> None:
        while not (stop.is_set() and self._queue.empty()):
            try:
                record = await asyncio.wait_for(self._queue.get(), 0.5)
            except TimeoutError:
                continue
            rejection = record.parsed
            assert isinstance(rejection, Rejection)
            try:
                async with asyncio.timeout(self._timeout_s):
                    await producer.send_and_wait(
                        self._topic,
                        _value(record),
                        key=record.key,
                        headers=_headers(record, rejection),
                    )
            except MessageSizeTooLargeError:
                metrics.DEAD_LETTERS_DROPPED.inc()  # this copy only; the producer is fine
                continue
            except (TimeoutError, KafkaError, OSError):
                metrics.DEAD_LETTERS_DROPPED.inc()
                raise  # the connection: run() rebuilds the producer
            except Exception as exc:
                # Something in this record the client refuses: drop this copy only. Raised,
                # it would end the copier, and every later copy would be lost unseen.
                metrics.DEAD_LETTERS_DROPPED.inc()
                log.error(
                    "dead-letter copy dropped: the client refused the record",
                    extra={
                        "origin": f"{record.topic}/{record.partition}/{record.offset}",
                        "error": exc,
                    },
                )
                continue
            except BaseException:
                metrics.DEAD_LETTERS_DROPPED.inc()
                raise
            self._delay = 0.5  # sending works: the next failure starts the back-off anew
