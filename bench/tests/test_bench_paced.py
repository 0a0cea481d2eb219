"""The benchmark's paced load generator reports a failure instead of hanging on it."""

from __future__ import annotations

import asyncio

import pytest

from bench.paced import PacedProducer

EVENT = ("corr-1", b"key", [("ce_id", b"1")], b"{}")


@pytest.mark.timeout(60)
def test_undelivered_events_are_an_error_not_a_hang() -> None:
    # Nothing listens on port 1: the events cannot be delivered within the flush bound.
    producer = PacedProducer("127.0.0.1:1", "bench.events", flush_timeout_s=1)
    try:
        with pytest.raises(RuntimeError, match="1 events unsent"):
            asyncio.run(producer.send_now(EVENT))
        with pytest.raises(RuntimeError, match="events unsent"):
            asyncio.run(producer.paced([EVENT] * 3, rate=1000))
    finally:
        producer.close()
