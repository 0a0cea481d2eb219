"""The background offset committer: never reorders, coalesces, keeps what failed, and does
not wait for ever on a commit that never returns.

The consumer here is a stand-in whose commit calls return when the test says so (each
call waits on an asyncio.Event), and the committer's clock is the test's: every
interleaving is set by the test, none by wall-clock sleeps. What a real group coordinator
does with the requests is covered by the integration tests (crash, rebalance, scale).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, KafkaConnectionError
from aiokafka.structs import OffsetAndMetadata
from hypothesis import given, settings
from hypothesis import strategies as st

from matcher.kafka.commits import OffsetCommitter

P0, P1, GONE = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 9)

# Event-loop steps (not seconds) a condition may take to come true: the committer reacts
# within a handful; far more means it never will.
STEPS = 1000


async def until(condition: Callable[[], bool], what: str) -> None:
    """Step the event loop until ``condition`` holds (AssertionError past STEPS steps)."""
    for _ in range(STEPS):
        if condition():
            return
        await asyncio.sleep(0)  # one step of the loop, not a pause
    raise AssertionError(f"not within {STEPS} loop steps: {what}")


def committing() -> bool:
    """Whether the committer's background task is running."""
    return any(t.get_name() == "offset-commits" and not t.done() for t in asyncio.all_tasks())


async def idle() -> None:
    """Until the committer's task has finished (it waits on no coordinator any more)."""
    await until(lambda: not committing(), "the committer idle")


class Call:
    """One commit request, answered by the test: ``succeed``, ``fail``, or never."""

    def __init__(self, offsets: dict[TopicPartition, int]) -> None:
        self.offsets = offsets
        self.error: Exception | None = None
        self.answered = False
        self.cancelled = False
        self._release = asyncio.Event()

    def succeed(self) -> None:
        self.answered = True
        self._release.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.succeed()

    async def wait(self) -> None:
        await self._release.wait()


class ControlledConsumer:
    """Records every commit request; with ``auto`` each is answered at once (failing with
    the next of ``fail_next``, if any), else it waits for the test's answer."""

    def __init__(self, *, auto: bool = False) -> None:
        self.assigned = {P0, P1}
        self.auto = auto
        self.calls: list[Call] = []
        self.requests: list[dict[TopicPartition, int]] = []  # the successful ones
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_next: list[Exception] = []
        self.acknowledged = asyncio.Event()  # set by every successful request

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        call = Call({tp: meta.offset for tp, meta in offsets.items()})
        self.calls.append(call)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.auto:
                if self.fail_next:
                    call.fail(self.fail_next.pop(0))
                else:
                    call.succeed()
            await call.wait()
            if call.error is not None:
                raise call.error
            self.requests.append(call.offsets)
            self.acknowledged.set()
        except asyncio.CancelledError:
            call.cancelled = True
            raise
        finally:
            self.in_flight -= 1

    async def call(self, n: int) -> Call:
        """The ``n``-th commit request (from 0), once the committer has made it."""
        await until(lambda: len(self.calls) > n, f"commit request #{n}")
        return self.calls[n]

    def open_call(self) -> Call | None:
        return next((c for c in self.calls if not c.answered and not c.cancelled), None)


def test_a_burst_of_batches_costs_one_commit_after_the_first() -> None:
    async def scenario() -> ControlledConsumer:
        consumer = ControlledConsumer()
        committer = OffsetCommitter(consumer)
        committer.submit({P0: 1})
        first = await consumer.call(0)  # in flight while the burst comes
        for offset in range(2, 11):
            committer.submit({P0: offset})
        first.succeed()
        (await consumer.call(1)).succeed()
        await idle()
        await committer.flush()
        return consumer

    consumer = asyncio.run(scenario())
    assert consumer.requests == [{P0: 1}, {P0: 10}]
    assert len(consumer.calls) == 2
    assert consumer.most_in_flight == 1


def test_a_commit_within_the_interval_waits_and_carries_the_newest_offsets() -> None:
    async def scenario() -> tuple[ControlledConsumer, bool]:
        consumer = ControlledConsumer()
        committer = OffsetCommitter(consumer, min_interval_s=3600, clock=lambda: 0.0)
        committer.submit({P0: 1})
        (await consumer.call(0)).succeed()  # the first is not held back
        committer.submit({P0: 2})
        committer.submit({P0: 3, P1: 1})
        for _ in range(STEPS):  # the interval has not passed: nothing more is asked
            await asyncio.sleep(0)
        held = len(consumer.calls) == 1 and committing()
        flushing = asyncio.create_task(committer.flush())  # a flush does not wait it out
        (await consumer.call(1)).succeed()
        await asyncio.wait_for(flushing, 5)
        return consumer, held

    consumer, held = asyncio.run(scenario())
    assert held
    assert consumer.requests == [{P0: 1}, {P0: 3, P1: 1}]


def test_a_batch_after_a_quiet_spell_is_committed_at_once() -> None:
    async def scenario() -> ControlledConsumer:
        now = [0.0]
        consumer = ControlledConsumer()
        committer = OffsetCommitter(consumer, min_interval_s=1.0, clock=lambda: now[0])
        committer.submit({P0: 1})
        (await consumer.call(0)).succeed()
        await idle()
        now[0] = 1.5  # longer ago than the interval
        committer.submit({P0: 2})
        (await consumer.call(1)).succeed()
        await idle()
        return consumer

    assert asyncio.run(scenario()).requests == [{P0: 1}, {P0: 2}]


def test_a_held_commit_goes_out_when_the_interval_ends() -> None:
    async def scenario() -> tuple[ControlledConsumer, float]:
        consumer = ControlledConsumer(auto=True)
        committer = OffsetCommitter(consumer, min_interval_s=0.05)
        committer.submit({P0: 1})
        await consumer.call(0)
        started = time.monotonic()
        committer.submit({P0: 2})
        async with asyncio.timeout(5):  # a bound: it ends on the condition
            while len(consumer.requests) < 2:
                consumer.acknowledged.clear()
                await consumer.acknowledged.wait()
        return consumer, time.monotonic() - started

    consumer, waited = asyncio.run(scenario())
    assert consumer.requests == [{P0: 1}, {P0: 2}]
    assert waited >= 0.04  # held for (about) the interval, not sent at once


def test_an_older_offset_never_follows_a_newer_one() -> None:
    async def scenario() -> OffsetCommitter:
        committer = OffsetCommitter(ControlledConsumer(auto=True))
        committer.submit({P0: 7, P1: 3})
        committer.submit({P0: 5})  # stale: a smaller offset must not move P0 back
        await committer.flush()
        return committer

    assert asyncio.run(scenario()).committed == {P0: 7, P1: 3}


def test_a_failed_commit_is_retried_by_the_flush() -> None:
    async def scenario() -> tuple[ControlledConsumer, OffsetCommitter]:
        consumer = ControlledConsumer()
        committer = OffsetCommitter(consumer)
        committer.submit({P0: 4})
        (await consumer.call(0)).fail(KafkaConnectionError("coordinator away"))
        await idle()
        assert committer.committed == {}
        flushing = asyncio.create_task(committer.flush())
        (await consumer.call(1)).succeed()
        await asyncio.wait_for(flushing, 5)
        return consumer, committer

    consumer, committer = asyncio.run(scenario())
    assert committer.committed == {P0: 4}
    assert consumer.requests == [{P0: 4}]


def test_a_failed_commit_keeps_a_newer_offset_submitted_meanwhile() -> None:
    async def scenario() -> tuple[ControlledConsumer, OffsetCommitter]:
        consumer = ControlledConsumer()
        committer = OffsetCommitter(consumer)
        committer.submit({P0: 4})
        failing = await consumer.call(0)
        committer.submit({P0: 9})  # arrives while the commit of 4 is in flight...
        failing.fail(KafkaConnectionError("coordinator away"))  # ...and then it fails
        await idle()
        flushing = asyncio.create_task(committer.flush())
        (await consumer.call(1)).succeed()
        await asyncio.wait_for(flushing, 5)
        return consumer, committer

    consumer, committer = asyncio.run(scenario())
    assert [c.offsets for c in consumer.calls] == [{P0: 4}, {P0: 9}]  # 4 is not tried again
    assert committer.committed == {P0: 9}


def test_an_idle_partitions_failed_commit_is_retried_by_the_tick_after_a_pause() -> None:
    async def scenario() -> tuple[ControlledConsumer, OffsetCommitter]:
        now = [100.0]
        consumer = ControlledConsumer()
        committer = OffsetCommitter(consumer, retry_after_s=1.0, clock=lambda: now[0])
        committer.submit({P0: 4})  # the partition's last batch for a while
        (await consumer.call(0)).fail(KafkaConnectionError("coordinator away"))
        await idle()
        now[0] += 0.5
        committer.tick()  # too soon: no request storm while the coordinator is away
        assert not committing()
        assert len(consumer.calls) == 1
        assert committer.committed == {}
        now[0] += 0.5
        committer.tick()  # the pause is over: tried again, with no new batch to carry it
        (await consumer.call(1)).succeed()
        await idle()
        return consumer, committer

    consumer, committer = asyncio.run(scenario())
    assert consumer.requests == [{P0: 4}]
    assert committer.committed == {P0: 4}


def test_a_commit_that_never_returns_is_bounded_and_kept_for_later() -> None:
    """A coordinator that never answers holds neither the flush nor the offsets: the
    commit is given up after ``timeout_s``, its offsets (or newer ones) stay pending, and
    the tick after the pause commits them."""

    async def scenario() -> tuple[ControlledConsumer, OffsetCommitter, Call]:
        now = [100.0]
        consumer = ControlledConsumer()
        committer = OffsetCommitter(
            consumer, retry_after_s=1.0, timeout_s=0.05, clock=lambda: now[0]
        )
        committer.submit({P0: 4, P1: 2})
        hung = await consumer.call(0)  # never answered
        committer.submit({P0: 6})  # a newer offset meanwhile
        # Without the bound this would wait for ever (pytest-timeout would end the test).
        await asyncio.wait_for(committer.flush(), 5)
        assert hung.cancelled
        assert consumer.in_flight == 0
        assert committer.committed == {}
        committer.tick()  # the retry pause has not passed on the committer's clock
        assert not committing()
        now[0] += 1.0
        committer.tick()
        (await consumer.call(1)).succeed()
        await idle()
        return consumer, committer, hung

    consumer, committer, hung = asyncio.run(scenario())
    assert not hung.answered
    assert consumer.calls[1].offsets == {P0: 6, P1: 2}
    assert committer.committed == {P0: 6, P1: 2}


def test_a_refused_commit_is_dropped_for_the_new_owner() -> None:
    async def scenario() -> tuple[ControlledConsumer, OffsetCommitter]:
        consumer = ControlledConsumer(auto=True)
        consumer.fail_next.append(CommitFailedError("rebalanced"))
        committer = OffsetCommitter(consumer)
        committer.submit({P0: 4})
        await committer.flush()
        await committer.flush()
        return consumer, committer

    consumer, committer = asyncio.run(scenario())
    assert committer.committed == {}
    assert consumer.requests == []
    assert len(consumer.calls) == 1  # not tried again


def test_partitions_no_longer_assigned_are_not_committed() -> None:
    async def scenario() -> ControlledConsumer:
        consumer = ControlledConsumer(auto=True)
        committer = OffsetCommitter(consumer)
        committer.submit({P0: 2, GONE: 8})
        await committer.flush()
        return consumer

    assert asyncio.run(scenario()).requests == [{P0: 2}]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([P0, P1]), st.integers(1, 1000), st.booleans()),
        min_size=1,
        max_size=40,
    ),
    st.randoms(use_true_random=False),
)
def test_commits_are_serial_monotonic_and_end_at_the_newest(
    submissions: list[tuple[TopicPartition, int, bool]], rng: random.Random
) -> None:
    """Batches finish in order, each with the next offsets of its partitions; whatever the
    coordinator's timing (when it answers the request in flight, relative to the next
    submissions: drawn by hypothesis), requests never overlap, never go back, and the
    last one per partition is the newest offset submitted."""

    async def settle(consumer: ControlledConsumer) -> None:
        """Until the committer waits on the coordinator or has nothing left to do."""
        await until(
            lambda: consumer.open_call() is not None or not committing(), "the committer settled"
        )

    async def scenario() -> tuple[ControlledConsumer, OffsetCommitter]:
        consumer = ControlledConsumer()
        committer = OffsetCommitter(consumer)
        high: dict[TopicPartition, int] = {}
        for tp, step, answer_now in submissions:
            high[tp] = high.get(tp, 0) + step
            committer.submit({tp: high[tp]})
            await settle(consumer)
            if answer_now and (call := consumer.open_call()) is not None:
                call.succeed()
                await settle(consumer)
        flushing = asyncio.create_task(committer.flush())
        while not flushing.done():
            await until(
                lambda: flushing.done() or consumer.open_call() is not None,
                "the flush waits on a request, or is done",
            )
            if (call := consumer.open_call()) is not None:
                # Answered in an order hypothesis varies: at once or after a few steps.
                for _ in range(rng.randrange(3)):
                    await asyncio.sleep(0)
                call.succeed()
        await flushing
        assert committer.committed == high
        return consumer, committer

    consumer, _ = asyncio.run(scenario())
    assert consumer.most_in_flight == 1
    last: dict[TopicPartition, int] = {}
    for request in consumer.requests:
        for tp, offset in request.items():
            assert offset > last.get(tp, 0)
            last[tp] = offset
