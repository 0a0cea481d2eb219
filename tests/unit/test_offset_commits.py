"""The background offset committer: never reorders, coalesces, keeps what failed.

The consumer here is a stand-in recording the commit requests it gets; what a real group
coordinator does with them is covered by the integration tests (crash, rebalance, scale).
"""

from __future__ import annotations

import asyncio
import random

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, KafkaConnectionError
from aiokafka.structs import OffsetAndMetadata
from hypothesis import given, settings
from hypothesis import strategies as st

from matcher.kafka.commits import OffsetCommitter

P0, P1, GONE = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 9)


class RecordingConsumer:
    def __init__(self, delays: list[float] | None = None) -> None:
        self.assigned = {P0, P1}
        self.requests: list[dict[TopicPartition, int]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_next: list[Exception] = []
        self._delays = delays or []

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self._delays.pop(0) if self._delays else 0.001)
            if self.fail_next:
                raise self.fail_next.pop(0)
            self.requests.append({tp: meta.offset for tp, meta in offsets.items()})
        finally:
            self.in_flight -= 1


def _committer(consumer: RecordingConsumer) -> OffsetCommitter:
    return OffsetCommitter(consumer)


def test_a_burst_of_batches_costs_one_commit_after_the_first() -> None:
    async def scenario() -> RecordingConsumer:
        consumer = RecordingConsumer(delays=[0.05])
        committer = _committer(consumer)
        for offset in range(1, 11):
            committer.submit({P0: offset})
            await asyncio.sleep(0)
        await committer.flush()
        return consumer

    consumer = asyncio.run(scenario())
    assert consumer.requests == [{P0: 1}, {P0: 10}]
    assert consumer.most_in_flight == 1


def test_an_older_offset_never_follows_a_newer_one() -> None:
    async def scenario() -> OffsetCommitter:
        committer = _committer(RecordingConsumer())
        committer.submit({P0: 7, P1: 3})
        committer.submit({P0: 5})  # stale: a smaller offset must not move P0 back
        await committer.flush()
        return committer

    assert asyncio.run(scenario()).committed == {P0: 7, P1: 3}


def test_a_failed_commit_is_retried_by_the_flush() -> None:
    async def scenario() -> tuple[RecordingConsumer, OffsetCommitter]:
        consumer = RecordingConsumer()
        consumer.fail_next.append(KafkaConnectionError("coordinator away"))
        committer = _committer(consumer)
        committer.submit({P0: 4})
        await asyncio.sleep(0.02)
        assert committer.committed == {}
        await committer.flush()
        return consumer, committer

    consumer, committer = asyncio.run(scenario())
    assert committer.committed == {P0: 4}
    assert consumer.requests == [{P0: 4}]


def test_a_failed_commit_keeps_a_newer_offset_submitted_meanwhile() -> None:
    async def scenario() -> OffsetCommitter:
        consumer = RecordingConsumer(delays=[0.03])
        consumer.fail_next.append(KafkaConnectionError("coordinator away"))
        committer = _committer(consumer)
        committer.submit({P0: 4})
        await asyncio.sleep(0.01)
        committer.submit({P0: 9})  # arrives while the commit of 4 is failing
        await asyncio.sleep(0.05)
        await committer.flush()
        return committer

    assert asyncio.run(scenario()).committed == {P0: 9}


def test_an_idle_partitions_failed_commit_is_retried_by_the_tick_after_a_pause() -> None:
    async def scenario() -> tuple[RecordingConsumer, OffsetCommitter]:
        consumer = RecordingConsumer()
        consumer.fail_next.append(KafkaConnectionError("coordinator away"))
        committer = OffsetCommitter(consumer, retry_after_s=0.1)
        committer.submit({P0: 4})  # the partition's last batch for a while
        await asyncio.sleep(0.02)
        committer.tick()  # too soon: no request storm while the coordinator is away
        await asyncio.sleep(0.02)
        assert consumer.requests == []
        assert committer.committed == {}
        await asyncio.sleep(0.1)
        committer.tick()
        await asyncio.sleep(0.02)
        return consumer, committer

    consumer, committer = asyncio.run(scenario())
    assert consumer.requests == [{P0: 4}]
    assert committer.committed == {P0: 4}


def test_a_refused_commit_is_dropped_for_the_new_owner() -> None:
    async def scenario() -> tuple[RecordingConsumer, OffsetCommitter]:
        consumer = RecordingConsumer()
        consumer.fail_next.append(CommitFailedError("rebalanced"))
        committer = _committer(consumer)
        committer.submit({P0: 4})
        await committer.flush()
        await committer.flush()
        return consumer, committer

    consumer, committer = asyncio.run(scenario())
    assert committer.committed == {}
    assert consumer.requests == []


def test_partitions_no_longer_assigned_are_not_committed() -> None:
    async def scenario() -> RecordingConsumer:
        consumer = RecordingConsumer()
        committer = _committer(consumer)
        committer.submit({P0: 2, GONE: 8})
        await committer.flush()
        return consumer

    assert asyncio.run(scenario()).requests == [{P0: 2}]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([P0, P1]), st.integers(1, 1000), st.integers(0, 3)),
        min_size=1,
        max_size=40,
    ),
    st.randoms(use_true_random=False),
)
def test_commits_are_serial_monotonic_and_end_at_the_newest(
    submissions: list[tuple[TopicPartition, int, int]], rng: random.Random
) -> None:
    """Batches finish in order, each with the next offsets of its partitions; whatever the
    timing of the coordinator, requests never overlap, never go back, and the last one
    per partition is the newest offset submitted."""

    async def scenario() -> tuple[RecordingConsumer, OffsetCommitter]:
        consumer = RecordingConsumer(delays=[rng.random() / 200 for _ in submissions])
        committer = _committer(consumer)
        high: dict[TopicPartition, int] = {}
        for tp, step, pause in submissions:
            high[tp] = high.get(tp, 0) + step
            committer.submit({tp: high[tp]})
            for _ in range(pause):
                await asyncio.sleep(0.001)
        await committer.flush()
        assert committer.committed == high
        return consumer, committer

    consumer, _ = asyncio.run(scenario())
    assert consumer.most_in_flight == 1
    last: dict[TopicPartition, int] = {}
    for request in consumer.requests:
        for tp, offset in request.items():
            assert offset > last.get(tp, 0)
            last[tp] = offset
