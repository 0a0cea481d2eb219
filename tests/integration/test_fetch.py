"""SafeFetcher against a real broker: records aiokafka cannot decode are handed over once,
marked, at their offsets; every good record around them is handed over once, in order.

aiokafka's producer encodes header names as UTF-8, so the batches here are built with its
pure-Python batch builder fed a ``str`` whose ``encode`` returns raw bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

from matcher.config import Settings
from matcher.kafka.fetch import FetchedRecord, SafeFetcher
from tests.support.assertions import eventually
from tests.support.kafka import started
from tests.support.records import RawHeaderName

Test = Callable[..., Awaitable[None]]
BAD_NAME = b"\xff\xfebad-\xc3"  # not UTF-8: aiokafka raises UnicodeDecodeError on it
GZIP = 1


@dataclass(frozen=True)
class Spec:
    """One record to produce; ``bad`` gives it a header name that is not UTF-8."""

    value: bytes
    bad: bool = False
    key: bytes | None = None

    def headers(self) -> tuple[tuple[bytes, bytes | None], ...]:
        name = BAD_NAME if self.bad else b"kind"
        return ((b"trace", b"t-1"), (name, self.value[:8]), (b"empty", None))


@dataclass(frozen=True)
class Produced:
    tp: TopicPartition
    offset: int
    spec: Spec


def good(tag: str, n: int) -> list[Spec]:
    return [Spec(f"{tag}-{i}".encode(), key=f"k{i}".encode()) for i in range(n)]


def bad(tag: str) -> Spec:
    return Spec(f"{tag}-bad".encode(), bad=True, key=b"bk")


@asynccontextmanager
async def producer_for(settings: Settings) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(**settings.kafka_client_options(), acks="all")
    async with started(producer):
        yield producer


async def send_batch(
    producer: AIOKafkaProducer,
    tp: TopicPartition,
    specs: Sequence[Spec],
    compression: int = 0,
    transactional: bool = False,
) -> list[Produced]:
    """Produce ``specs`` as one record batch on ``tp``; return where each record went."""
    batch = producer.create_batch()
    # The Python builder encodes names with str.encode, so RawHeaderName's bytes go out as they are.
    builder = _DefaultRecordBatchBuilderPy(2, compression, int(transactional), -1, -1, 0, 1 << 20)
    batch._builder = builder
    # aiokafka insists on its C builder when it sets the producer id (idempotence and
    # transactions); the Python one takes it just as well.
    batch._set_producer_state = builder.set_producer_state
    for spec in specs:
        headers = [
            (RawHeaderName(name) if spec.bad and name == BAD_NAME else name.decode(), value)
            for name, value in spec.headers()
        ]
        assert batch.append(timestamp=None, key=spec.key, value=spec.value, headers=headers)
    metadata = await (await producer.send_batch(batch, tp.topic, partition=tp.partition))
    return [Produced(tp, metadata.offset + i, spec) for i, spec in enumerate(specs)]


def consumer_for(settings: Settings, **options: Any) -> AIOKafkaConsumer:
    options.setdefault("group_id", settings.consumer_group)
    return AIOKafkaConsumer(
        settings.events_topic,
        **settings.kafka_client_options(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **options,
    )


async def fetch_all(
    fetcher: SafeFetcher, want: int, *, seconds: float = 60, max_records: int | None = None
) -> list[FetchedRecord]:
    """Poll until ``want`` records came, then until one normal poll brings nothing more."""
    got: list[FetchedRecord] = []
    async with asyncio.timeout(seconds):
        while True:
            batch = await fetcher.getmany(timeout_ms=300, max_records=max_records)
            for records in batch.values():
                got.extend(records)
            if len(got) >= want and not batch and not fetcher.isolating:
                return got


def check(got: Sequence[FetchedRecord], produced: Sequence[Produced]) -> None:
    """Each produced record handed over exactly once, in order per partition, and bad ones
    marked with all their bytes recovered."""
    by_partition: dict[int, list[FetchedRecord]] = {}
    for record in got:
        by_partition.setdefault(record.partition, []).append(record)
    expected: dict[int, list[Produced]] = {}
    for p in produced:
        expected.setdefault(p.tp.partition, []).append(p)
    assert sorted(by_partition) == sorted(expected)
    for partition, records in by_partition.items():
        want = expected[partition]
        assert [r.offset for r in records] == [p.offset for p in want], partition
        for record, p in zip(records, want, strict=True):
            assert (record.undecodable is not None) == p.spec.bad, (partition, record)
            assert record.key == p.spec.key
            assert record.value == p.spec.value
            assert record.headers == p.spec.headers()
            assert record.timestamp > 0
            if p.spec.bad:
                assert record.undecodable == "header name is not UTF-8"


async def run_layout(settings: Settings, layout: dict[int, list[list[Spec]]]) -> None:
    """Produce each partition's batches, then fetch everything through a SafeFetcher."""
    produced: list[Produced] = []
    async with producer_for(settings) as producer:
        for partition, batches in layout.items():
            tp = TopicPartition(settings.events_topic, partition)
            for specs in batches:
                produced.extend(await send_batch(producer, tp, specs))
    consumer = consumer_for(settings)
    async with started(consumer):
        fetcher = SafeFetcher(consumer)
        check(await fetch_all(fetcher, len(produced)), produced)
        # And it goes on normally: new records come through the plain path.
        async with producer_for(settings) as producer:
            later = await send_batch(
                producer, TopicPartition(settings.events_topic, 0), good("later", 3)
            )
        again = await fetch_all(fetcher, len(later))
        assert not fetcher.isolating
        check(again, later)


@pytest.mark.timeout(90)
async def test_bad_record_first_in_a_partition(settings: Settings) -> None:
    await run_layout(settings, {0: [[bad("a"), *good("a", 3)]], 1: [good("o", 4)]})


@pytest.mark.timeout(90)
async def test_bad_record_in_the_middle_of_a_batch(settings: Settings) -> None:
    await run_layout(settings, {0: [[*good("b", 3), bad("b"), *good("b2", 4)]], 2: [good("o", 3)]})


@pytest.mark.timeout(90)
async def test_bad_record_last(settings: Settings) -> None:
    await run_layout(settings, {0: [[*good("c", 3), bad("c")]], 3: [good("o", 2)]})


@pytest.mark.timeout(90)
async def test_two_bad_records_in_a_row(settings: Settings) -> None:
    await run_layout(
        settings,
        {0: [[*good("d", 2), bad("d1"), bad("d2"), *good("d3", 2)]], 4: [good("o", 2)]},
    )


@pytest.mark.timeout(90)
async def test_bad_records_across_batches(settings: Settings) -> None:
    # The end of one batch and the start of the next, then a batch that is only bad ones.
    await run_layout(
        settings,
        {0: [[*good("e", 2), bad("e1")], [bad("e2"), *good("e3", 2)], [bad("e4"), bad("e5")]]},
    )


@pytest.mark.timeout(90)
async def test_bad_records_on_several_partitions_at_once(settings: Settings) -> None:
    await run_layout(
        settings,
        {
            0: [[bad("p0"), *good("p0", 20)]],
            1: [[*good("p1", 10), bad("p1"), *good("p1b", 10)]],
            2: [[*good("p2", 20), bad("p2")]],
            3: [[*good("p3", 5), bad("p3a"), bad("p3b"), *good("p3c", 5)]],
            4: [good("p4", 30), good("p4b", 30)],
            5: [good("p5", 30)],
        },
    )


@pytest.mark.timeout(90)
async def test_bad_record_in_a_compressed_batch(settings: Settings) -> None:
    produced: list[Produced] = []
    tp = TopicPartition(settings.events_topic, 1)
    async with producer_for(settings) as producer:
        produced += await send_batch(
            producer, tp, [*good("z", 30), bad("z"), *good("z2", 30)], GZIP
        )
    consumer = consumer_for(settings)
    async with started(consumer):
        check(await fetch_all(SafeFetcher(consumer), len(produced)), produced)


@pytest.mark.timeout(90)
async def test_small_polls_hand_everything_over_once(settings: Settings) -> None:
    # max_records smaller than a batch: isolation runs over many calls, state carried over.
    produced: list[Produced] = []
    async with producer_for(settings) as producer:
        for partition in range(3):
            tp = TopicPartition(settings.events_topic, partition)
            produced += await send_batch(producer, tp, [*good("s", 7), bad("s"), *good("t", 7)])
    consumer = consumer_for(settings)
    async with started(consumer):
        check(await fetch_all(SafeFetcher(consumer), len(produced), max_records=3), produced)


@pytest.mark.parametrize("committed", [None, 2])
@pytest.mark.timeout(90)
async def test_records_drained_from_other_partitions_are_not_lost(
    settings: Settings, caplog: pytest.LogCaptureFixture, committed: int | None
) -> None:
    """Force the order aiokafka drains its buffer in: a good partition first, then the bad
    one, in the same getmany call. Plain aiokafka loses the good partition's records.
    Nothing was handed over from it yet: it is rewound to where the group had got to (the
    committed offset, or else the start, as auto_offset_reset says)."""
    caplog.set_level(logging.INFO, logger="matcher.fetch")
    good_tp = TopicPartition(settings.events_topic, 4)
    bad_tp = TopicPartition(settings.events_topic, 0)
    async with producer_for(settings) as producer:
        produced = await send_batch(producer, good_tp, good("g", 5))
        produced += await send_batch(producer, bad_tp, [bad("x"), *good("x", 2)])
    if committed is not None:
        await commit(settings, good_tp, committed)
        produced = [p for p in produced if p.tp != good_tp or p.offset >= committed]
    consumer = consumer_for(settings)
    async with started(consumer):
        buffered = await wait_for_buffer(consumer, {good_tp, bad_tp})
        buffered.move_to_end(bad_tp)  # aiokafka's own buffer: drained in this order
        check(await fetch_all(SafeFetcher(consumer), len(produced)), produced)
    # The failed call had drained the good partition: it was rewound to its start.
    rewinds = [r for r in caplog.records if r.getMessage() == "partition rewound"]
    assert [(r.__dict__["partition"], r.__dict__["to"]) for r in rewinds] == [(4, committed or 0)]


async def commit(settings: Settings, tp: TopicPartition, offset: int) -> None:
    """Commit ``offset`` for the test's group, as an earlier member would have."""
    consumer = AIOKafkaConsumer(
        **settings.kafka_client_options(),
        group_id=settings.consumer_group,
        enable_auto_commit=False,
    )
    async with started(consumer):
        consumer.assign([tp])
        await consumer.commit({tp: offset})


@pytest.mark.timeout(90)
async def test_the_listener_forgets_then_calls_the_inner_one(settings: Settings) -> None:
    """A rebalance makes what was tracked wrong: the listener drops it first."""
    calls: list[tuple[str, list[TopicPartition]]] = []

    class Inner:
        async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
            calls.append(("revoked", sorted(revoked)))

        def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
            calls.append(("assigned", sorted(assigned)))

    tp = TopicPartition(settings.events_topic, 3)
    async with producer_for(settings) as producer:
        produced = await send_batch(producer, tp, [*good("l", 2), bad("l")])
    consumer = AIOKafkaConsumer(
        **settings.kafka_client_options(),
        group_id=settings.consumer_group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    fetcher = SafeFetcher(consumer)
    consumer.subscribe([settings.events_topic], listener=fetcher.rebalance_listener(Inner()))
    async with started(consumer):
        check(await fetch_all(fetcher, len(produced)), produced)
        assert tp in fetcher._next
        await fetcher.rebalance_listener(Inner()).on_partitions_revoked([tp])
        assert tp not in fetcher._next
    everything = [TopicPartition(settings.events_topic, p) for p in range(6)]
    # aiokafka also reports an empty revocation before the first assignment.
    assert calls.index(("assigned", everything)) < calls.index(("revoked", [tp]))


async def wait_for_buffer(consumer: AIOKafkaConsumer, tps: set[TopicPartition]) -> Any:
    """aiokafka's buffer of fetched records, once it holds every partition in ``tps``."""
    async with asyncio.timeout(30):
        while True:
            fetcher = getattr(consumer, "_fetcher", None)
            if fetcher is not None and consumer.assignment() and tps <= set(fetcher._records):
                return fetcher._records
            await asyncio.sleep(0.02)  # polling a condition, with the deadline above


@pytest.mark.timeout(90)
async def test_normal_path_matches_plain_getmany(settings: Settings) -> None:
    specs = [
        Spec(b"v0", key=None),
        Spec(b"v1", key=b"k"),
        Spec(b"", key=b""),
    ]
    unicode_headers = [("ключ", "значение".encode()), ("", b""), ("n", None)]
    async with producer_for(settings) as producer:
        for i in range(30):
            await producer.send_and_wait(
                settings.events_topic, f"m{i}".encode(), key=b"k%d" % i, headers=unicode_headers
            )
        for partition in range(6):
            await send_batch(producer, TopicPartition(settings.events_topic, partition), specs)
    plain = await read_plain(settings, 30 + 6 * len(specs))
    consumer = consumer_for(settings, group_id=settings.consumer_group + ".safe")
    async with started(consumer):
        safe = await fetch_all(SafeFetcher(consumer), len(plain))
    assert sorted(safe, key=_where) == sorted(plain, key=_where)
    assert all(r.undecodable is None for r in safe)


def _where(r: FetchedRecord) -> tuple[int, int]:
    return r.partition, r.offset


async def read_plain(settings: Settings, want: int) -> list[FetchedRecord]:
    """What plain getmany gives, in FetchedRecord's terms (names encoded back to bytes)."""
    consumer = consumer_for(settings, group_id=settings.consumer_group + ".plain")
    got: list[FetchedRecord] = []
    async with started(consumer):
        async with asyncio.timeout(60):
            while len(got) < want:
                batch = await consumer.getmany(timeout_ms=300)
                got.extend(_as_fetched(m) for records in batch.values() for m in records)
    return got


def _as_fetched(m: Any) -> FetchedRecord:
    headers = tuple((name.encode(), value) for name, value in m.headers)
    return FetchedRecord(
        m.topic, m.partition, m.offset, m.timestamp, m.timestamp_type, m.key, m.value, headers
    )


def failing_once(value: bytes) -> Callable[[bytes | None], bytes | None]:
    """A value deserializer that fails on ``value`` the first time only: transient."""
    failed: list[bool] = []

    def deserialize(raw: bytes | None) -> bytes | None:
        if raw == value and not failed:
            failed.append(True)
            raise ValueError("transient")
        return raw

    return deserialize


def failing_always(value: bytes) -> Callable[[bytes | None], bytes | None]:
    def deserialize(raw: bytes | None) -> bytes | None:
        if raw == value:
            raise ValueError("never decodes")
        return raw

    return deserialize


@pytest.mark.timeout(90)
async def test_a_transient_failure_skips_nothing(settings: Settings) -> None:
    tp = TopicPartition(settings.events_topic, 2)
    async with producer_for(settings) as producer:
        produced = await send_batch(producer, tp, good("q", 6))
    consumer = consumer_for(settings, value_deserializer=failing_once(b"q-3"))
    async with started(consumer):
        check(await fetch_all(SafeFetcher(consumer), len(produced)), produced)


@pytest.mark.timeout(90)
async def test_a_record_failing_for_a_reason_the_bytes_do_not_show(settings: Settings) -> None:
    # The bytes are valid (the deserializer refuses it): handed over as undecodable, with
    # its bytes, and the reason names the client's error.
    tp = TopicPartition(settings.events_topic, 2)
    async with producer_for(settings) as producer:
        produced = await send_batch(producer, tp, good("r", 6))
    consumer = consumer_for(settings, value_deserializer=failing_always(b"r-2"))
    async with started(consumer):
        got = await fetch_all(SafeFetcher(consumer), len(produced))
    assert [r.offset for r in got] == [p.offset for p in produced]
    marked = [r for r in got if r.undecodable is not None]
    assert [r.value for r in marked] == [b"r-2"]
    assert "never decodes" in (marked[0].undecodable or "")
    assert marked[0].headers == produced[2].spec.headers()


@pytest.mark.parametrize("isolation_level", ["read_committed", "read_uncommitted"])
@pytest.mark.timeout(90)
async def test_transactions(settings: Settings, isolation_level: str) -> None:
    """read_committed skips an aborted batch without decoding it (bad records and all);
    the raw fetch must skip it too, from the aborted transactions the broker lists."""
    tp = TopicPartition(settings.events_topic, 5)
    producer = AIOKafkaProducer(
        **settings.kafka_client_options(), transactional_id=settings.consumer_group + ".tx"
    )
    async with started(producer):
        await producer.begin_transaction()
        aborted = await send_batch(producer, tp, [bad("ab1"), *good("ab", 2)], transactional=True)
        await producer.abort_transaction()
        async with producer.transaction():
            kept = await send_batch(producer, tp, [bad("c1"), *good("c", 3)], transactional=True)
    consumer = consumer_for(settings, isolation_level=isolation_level)
    async with started(consumer):
        want = kept if isolation_level == "read_committed" else aborted + kept
        check(await fetch_all(SafeFetcher(consumer), len(want)), want)


@pytest.mark.timeout(90)
async def test_calls_cancelled_anywhere_lose_nothing(settings: Settings) -> None:
    """A call cancelled half-way through isolating hands nothing over: what it had read is
    read again by a later call, so still every record comes exactly once."""
    produced: list[Produced] = []
    async with producer_for(settings) as producer:
        for partition in range(4):
            tp = TopicPartition(settings.events_topic, partition)
            produced += await send_batch(producer, tp, [*good("w", 5), bad("w"), *good("y", 5)])
    consumer = consumer_for(settings)
    got: list[FetchedRecord] = []
    cancelled = 0
    async with started(consumer):
        fetcher = SafeFetcher(consumer)
        patience = [0.001, 0.004, 0.015, 0.05, 0.2, 0.6]
        for call in itertools.count():
            try:
                async with asyncio.timeout(patience[call % len(patience)]):
                    batch = await fetcher.getmany(timeout_ms=100)
            except TimeoutError:
                cancelled += 1
                continue
            got.extend(r for records in batch.values() for r in records)
            if len(got) >= len(produced) and not batch and not fetcher.isolating:
                break
    check(got, produced)
    assert cancelled > 0


@pytest.mark.timeout(60)
async def test_a_cancelled_fetch_leaves_the_consumer_idle_not_busy(settings: Settings) -> None:
    """aiokafka counts a cancelled ``getmany`` as still in progress, after which its
    ``max_poll_interval_ms`` watchdog never sees the loop idle; the fetcher puts the
    count right (the ingest loop cancels fetches made while a batch is paced)."""
    consumer = consumer_for(settings)
    async with started(consumer):
        subscription: Any = consumer._subscription
        call = asyncio.create_task(SafeFetcher(consumer).getmany(timeout_ms=30_000))
        await eventually(lambda: subscription._fetch_count == 1, timeout=10, interval=0.01)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await eventually(
            lambda: subscription.fetcher_idle_time > 0.05, timeout=10, interval=0.01,
            what="the consumer seen idle after its fetch was cancelled",
        )  # fmt: skip
