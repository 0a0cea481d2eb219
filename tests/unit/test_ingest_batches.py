"""How the ingest loop builds a batch: topped up, in order, within its size, and the
HMAC it verifies with held to the standard library's."""

from __future__ import annotations

import asyncio
import hmac
import threading
from typing import Any

import pytest
from aiokafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from matcher.auth.signatures import hmac_sha256
from matcher.config import Settings
from matcher.daemon.ingest import Ingest
from matcher.daemon.intake import INLINE_JUDGE_BYTES, pacing_wait
from matcher.kafka.fetch import Batch, FetchedRecord

A, B = TopicPartition("events", 0), TopicPartition("events", 1)


@given(st.binary(max_size=64), st.binary(max_size=5000))
def test_hmac_is_the_standard_librarys(secret: bytes, message: bytes) -> None:
    assert hmac_sha256(secret, message) == hmac.digest(secret, message, "sha256")


def _record(tp: TopicPartition, offset: int, size: int = 10) -> FetchedRecord:
    return FetchedRecord(tp.topic, tp.partition, offset, -1, 0, None, b"x" * size, ())


class _Fetched:
    """What a fetcher has already fetched: handed over in order, at most as asked."""

    def __init__(self, records: list[FetchedRecord], per_call: int | None = None) -> None:
        self.records = records
        self.per_call = per_call  # as a client that holds one fetch of a partition at a time
        self.asked: list[tuple[int, int | None]] = []

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> Batch:
        self.asked.append((timeout_ms, max_records))
        if not self.records:
            await asyncio.sleep(timeout_ms / 1000)  # nothing comes within the wait
        taken = self.records[: min(max_records or len(self.records), self.per_call or 10**9)]
        self.records = self.records[len(taken) :]
        out: Batch = {}
        for r in taken:
            out.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
        return out


def _ingest(batch_max: int, interval_ms: int = 0) -> Ingest:
    settings = Settings(
        kafka_bootstrap_servers="k:9092",
        database_url="postgresql://u@h/d",
        ingest_batch_max=batch_max,
        ingest_batch_interval_ms=interval_ms,
    )
    return Ingest(settings, pool=None, stop=asyncio.Event(), on_resolved=lambda: None)  # type: ignore[arg-type]


async def _top_up(ingest: Ingest, batch: Batch, fetched: _Fetched) -> list[Any]:
    records = await ingest.intake.judged(batch)
    await ingest.intake.top_up(fetched, batch, records)  # type: ignore[arg-type]
    return records


def test_a_top_up_adds_what_was_fetched_in_order_without_waiting() -> None:
    ingest = _ingest(batch_max=10)
    batch: Batch = {A: [_record(A, 0), _record(A, 1)]}
    fetched = _Fetched([_record(A, 2), _record(B, 0), _record(A, 3)])
    records = asyncio.run(_top_up(ingest, batch, fetched))
    assert [r.offset for r in batch[A]] == [0, 1, 2, 3]
    assert [r.offset for r in batch[B]] == [0]
    assert [(r.partition, r.offset) for r in records] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert fetched.asked == [(0, 8)]  # no wait, and only the room left


def test_a_top_up_stays_within_the_batch_size() -> None:
    ingest = _ingest(batch_max=3)
    batch: Batch = {A: [_record(A, 0), _record(A, 1)]}
    fetched = _Fetched([_record(A, 2), _record(A, 3)])
    records = asyncio.run(_top_up(ingest, batch, fetched))
    assert [r.offset for r in batch[A]] == [0, 1, 2]
    assert len(records) == 3
    assert [r.offset for r in fetched.records] == [3]  # left for the next batch

    full: Batch = {A: [_record(A, n) for n in range(3)]}
    untouched = _Fetched([_record(A, 3)])
    asyncio.run(_top_up(ingest, full, untouched))
    assert untouched.asked == []
    assert len(full[A]) == 3


def test_large_batches_are_judged_off_the_event_loop(monkeypatch: Any) -> None:
    """A batch past the inline bound is judged in a worker thread, a small one on the
    event loop's own thread (no hand-over)."""
    import matcher.daemon.intake as ingest_module

    judged_on: list[str] = []
    judge = ingest_module.to_ingest_records

    def recording(*args: Any) -> Any:
        judged_on.append(threading.current_thread().name)
        return judge(*args)

    monkeypatch.setattr(ingest_module, "to_ingest_records", recording)
    ingest = _ingest(batch_max=10)
    big: Batch = {A: [_record(A, n, size=INLINE_JUDGE_BYTES // 2 + 1) for n in range(2)]}
    small: Batch = {A: [_record(A, 0)]}
    for batch in (big, small):
        records = asyncio.run(ingest.intake.judged(batch))
        assert [r.offset for r in records] == [m.offset for m in batch[A]]
    main = threading.main_thread().name
    assert judged_on[0] != main
    assert judged_on[1] == main


@given(st.none() | st.floats(0, 100), st.floats(0, 2), st.floats(0, 1))
def test_a_batch_waits_at_most_the_interval_and_only_behind_a_recent_one(
    last: float | None, elapsed: float, interval: float
) -> None:
    now = (last or 0.0) + elapsed
    wait = pacing_wait(last, now, interval)
    assert 0.0 <= wait <= interval
    if last is None or elapsed >= interval:
        assert wait == 0.0  # a first batch, or one after a quiet spell
    else:
        assert wait == pytest.approx(interval - elapsed)  # until the interval is out


def test_pacing_waits_out_the_interval_taking_what_arrives() -> None:
    """Behind a batch begun just now, the next takes what arrives until the interval is
    out, however many fetches that is (a client hands over one fetch of a partition at
    a time); the first batch, a full one, and one after a quiet spell go at once."""

    async def paced(began_ago_s: float | None, batch_max: int) -> tuple[list[int], _Fetched]:
        ingest = _ingest(batch_max=batch_max, interval_ms=20)
        loop = asyncio.get_running_loop()
        if began_ago_s is not None:
            ingest.intake.batch_began = loop.time() - began_ago_s
        batch: Batch = {A: [_record(A, 0)]}
        fetched = _Fetched([_record(A, 1), _record(A, 2), _record(A, 3)], per_call=1)
        records = await ingest.intake.judged(batch)
        await ingest.intake.paced(fetched, batch, records)  # type: ignore[arg-type]
        assert ingest.intake.batch_began is not None
        assert ingest.intake.batch_began >= loop.time() - 1
        return [r.offset for r in records], fetched

    offsets, fetched = asyncio.run(paced(began_ago_s=0.0, batch_max=10))
    assert offsets == [0, 1, 2, 3]
    assert [room for _, room in fetched.asked[:3]] == [9, 8, 7]
    assert all(0 < wait <= 20 for wait, _ in fetched.asked)
    for began_ago_s, batch_max in ((None, 10), (1.0, 10), (0.0, 1)):
        offsets, fetched = asyncio.run(paced(began_ago_s, batch_max))
        assert (offsets, fetched.asked) == ([0], []), (began_ago_s, batch_max)


class _Reassigning(_Fetched):
    """A client in the middle of a rebalance: after handing over what it holds, its
    ``getmany`` waits for the next assignment whatever its timeout, as aiokafka's does,
    and that assignment waits for the revocation, which waits for the paced batch."""

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> Batch:
        if self.records:
            return await super().getmany(timeout_ms, max_records)
        self.asked.append((timeout_ms, max_records))
        await asyncio.Event().wait()  # the assignment that cannot come
        raise AssertionError("unreachable")


def test_a_paced_batch_is_not_held_by_a_rebalance_it_holds_up() -> None:
    """The pacing fetches while holding the batch lock a revocation waits for: a fetch
    that waits for the next assignment must be cut off, and the batch go as it is."""

    async def paced() -> tuple[list[int], float]:
        ingest = _ingest(batch_max=10, interval_ms=20)
        loop = asyncio.get_running_loop()
        ingest.intake.batch_began = loop.time()
        batch: Batch = {A: [_record(A, 0)]}
        fetched = _Reassigning([_record(A, 1)], per_call=1)
        records = await ingest.intake.judged(batch)
        began = loop.time()
        await asyncio.wait_for(ingest.intake.paced(fetched, batch, records), 10)  # type: ignore[arg-type]
        assert [m.offset for m in batch[A]] == [0, 1]
        return [r.offset for r in records], loop.time() - began

    offsets, took = asyncio.run(paced())
    assert offsets == [0, 1]
    assert took < 5  # the interval and the grace, not the 10 s guard
