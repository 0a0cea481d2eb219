"""Explain's partition question, without services: where each common partitioner puts a
wait's key, and the pure verdict over the lag on those partitions."""

from __future__ import annotations

import uuid
import zlib
from datetime import UTC, datetime, timedelta, timezone

import pytest
from aiokafka.partitioner import DefaultPartitioner

from matcher.domain.explain import (
    PARTITIONERS,
    ExplainFacts,
    Verdict,
    explain,
    rfc3339,
)
from matcher.domain.waits import Wait, WaitState
from matcher.kafka.lag import (
    crc32_partition,
    event_key,
    fnv1a_partition,
    key_partitions,
    murmur2_partition,
)

NOW = datetime(2026, 12, 1, 8, 14, 37, 499328, tzinfo=UTC)


def _wait() -> Wait:
    return Wait(
        id=uuid.uuid4(),
        tenant="acme",
        run_id="run-7",
        position=0,
        event_types=["job.completed"],
        correlation_id="job-42",
        deadline=None,
        external_job_id=None,
        state=WaitState.WAITING,
        created_at=NOW - timedelta(minutes=1),
        resolved_at=None,
        resolution=None,
        resolved_by_producer=None,
        resolved_by_event_id=None,
    )


def test_the_key_is_the_producers_key() -> None:
    from matcher_producer import CompletionEvent, encode

    record = encode(
        CompletionEvent(
            source="s", type="t", tenant="acme", correlation_id="job-42", data=None, id="e"
        )
    )
    assert event_key("acme", "job-42") == record.key == b"acme\x1fjob-42"


@pytest.mark.parametrize("partitions", [1, 2, 3, 6, 12, 24, 100])
def test_murmur2_is_the_java_and_aiokafka_default(partitions: int) -> None:
    everything = list(range(partitions))
    for n in range(200):
        key = event_key(f"tenant-{n % 7}", f"correlation-{n}")
        assert murmur2_partition(key, partitions) == DefaultPartitioner()(
            key, everything, everything
        )


def test_crc32_is_zlibs_crc32_modulo_the_partitions() -> None:
    # librdkafka's consistent_random: rd_crc32(key) % partition_cnt (zlib's CRC-32).
    assert zlib.crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value
    key = event_key("acme", "job-42")
    assert crc32_partition(key, 6) == zlib.crc32(key) % 6


@pytest.mark.parametrize(
    ("key", "fnv1a32"),
    [(b"", 0x811C9DC5), (b"a", 0xE40C292C), (b"foobar", 0xBF9CF968)],
)
def test_fnv1a_is_saramas_hash_partitioner(key: bytes, fnv1a32: int) -> None:
    # Sarama: int32(fnv1a(key)) % n, negated when negative (Go's % truncates toward zero).
    signed = fnv1a32 - (1 << 32) if fnv1a32 >= 1 << 31 else fnv1a32
    for partitions in (1, 3, 6, 7, 12):
        go_remainder = abs(signed) % partitions * (-1 if signed < 0 else 1)
        assert fnv1a_partition(key, partitions) == abs(go_remainder)


def test_key_partitions_names_every_partitioner() -> None:
    found = key_partitions("acme", "job-42", 6)
    assert set(found) == set(PARTITIONERS)
    assert all(0 <= p < 6 for p in found.values())


def _facts(partitions: dict[str, int], lag: dict[int, int] | None) -> ExplainFacts:
    return ExplainFacts(now=NOW, wait=_wait(), partitions=partitions, lag=lag)


def test_lag_on_the_crc32_partition_is_a_backlog() -> None:
    # A librdkafka producer's event sits unread on the CRC32 partition, not on murmur2's.
    found = explain(
        _facts({"murmur2": 4, "crc32": 1, "fnv1a": 4}, dict.fromkeys(range(6), 0) | {1: 3})
    )
    assert found.verdict is Verdict.BACKLOG
    [lagging] = [r for r in found.reasons if r.startswith("consumer lag on partition")]
    assert lagging.startswith("consumer lag on partition 1, where CRC32 (librdkafka's default")
    assert lagging.endswith("puts this wait's key: 3 message(s) not yet read")
    assert found.evidence["key_partitions"] == [
        {"partition": 1, "partitioners": ["crc32"], "lag": 3},
        {"partition": 4, "partitioners": ["murmur2", "fnv1a"], "lag": 0},
    ]


def test_lag_on_a_partition_shared_by_two_partitioners_names_both() -> None:
    found = explain(_facts({"murmur2": 2, "crc32": 2, "fnv1a": 0}, {0: 0, 1: 0, 2: 9}))
    assert found.verdict is Verdict.BACKLOG
    assert any(
        "where murmur2 (" in r and "and CRC32 (" in r and " put this" in r for r in found.reasons
    )


def test_lag_elsewhere_is_no_backlog_of_this_wait() -> None:
    found = explain(_facts({"murmur2": 0, "crc32": 1, "fnv1a": 2}, {0: 0, 1: 0, 2: 0, 3: 50}))
    assert found.verdict is Verdict.MISSING_SIGNAL
    assert found.evidence["consumer_lag"]["3"] == 50


def test_unknown_lag_says_why() -> None:
    facts = ExplainFacts(
        now=NOW, wait=_wait(), lag=None, lag_unknown_because="Kafka is not configured"
    )
    found = explain(facts)
    assert found.verdict is Verdict.MISSING_SIGNAL
    assert "consumer lag unknown: Kafka is not configured" in found.reasons
    assert "key_partitions" not in found.evidence


def test_rfc3339_is_utc_with_a_z() -> None:
    india = timezone(timedelta(hours=5, minutes=30))
    assert rfc3339(NOW) == "2026-12-01T08:14:37.499328Z"
    assert rfc3339(NOW.astimezone(india)) == "2026-12-01T08:14:37.499328Z"
    assert rfc3339(NOW, seconds=True) == "2026-12-01T08:14:37Z"
    assert rfc3339(NOW.replace(microsecond=0)) == "2026-12-01T08:14:37Z"
