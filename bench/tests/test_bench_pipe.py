"""The pipe's latency floor (bench/pipe.py) and what the benchmark says of it: offsets are
committed only once the resumes of their records are acknowledged, in order, never more
often than matcher commits them; a pair's ratio is matcher's window over the floor's
beside it; and a floor over a target is named in the notes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from bench import pipe
from bench.run import _floor_notes, _ratio_runs


class _Consumer:
    def __init__(self) -> None:
        self.commits: list[dict[TopicPartition, OffsetAndMetadata]] = []

    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        self.commits.append(dict(offsets))


def _record(partition: int, offset: int) -> Any:
    return SimpleNamespace(topic="t", partition=partition, offset=offset)


def _committed(consumer: _Consumer) -> dict[int, int]:
    merged: dict[int, int] = {}
    for commit in consumer.commits:
        merged |= {tp.partition: o.offset for tp, o in commit.items()}
    return merged


async def _settle() -> None:
    for _ in range(3):  # the commit task runs
        await asyncio.sleep(0)


def test_offsets_wait_for_their_resumes_in_order() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        consumer = _Consumer()
        acknowledged = pipe._Acknowledged(consumer)
        first, second = loop.create_future(), loop.create_future()
        acknowledged.add([first], [_record(0, 10), _record(1, 4)])
        acknowledged.add([second], [_record(0, 11)])
        second.set_result(None)  # the later batch acknowledged first
        await _settle()
        acknowledged.poll()
        await _settle()
        assert consumer.commits == [], "a batch's offsets went before an earlier batch's"
        first.set_result(None)
        await _settle()
        acknowledged.poll()
        await _settle()
        assert _committed(consumer) == {0: 12, 1: 5}

    asyncio.run(scenario())


def test_commits_are_spaced_like_matchers(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        consumer = _Consumer()
        acknowledged = pipe._Acknowledged(consumer)
        # An interval no test machine outruns, then none: no test waits on a clock.
        monkeypatch.setattr(pipe, "COMMIT_INTERVAL_S", 3600.0)
        for offset in range(5):
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            acknowledged.add([done], [_record(0, offset)])
            await _settle()
            acknowledged.poll()
            await _settle()
        # The first commit goes at once; the next ones wait out the interval.
        assert len(consumer.commits) == 1
        monkeypatch.setattr(pipe, "COMMIT_INTERVAL_S", 0.0)
        acknowledged.poll()
        await _settle()
        assert len(consumer.commits) == 2
        assert _committed(consumer) == {0: 5}

    asyncio.run(scenario())


def test_a_failed_send_is_raised_not_committed() -> None:
    async def scenario() -> None:
        consumer = _Consumer()
        acknowledged = pipe._Acknowledged(consumer)
        failed = asyncio.get_running_loop().create_future()
        failed.set_exception(RuntimeError("broker refused"))
        acknowledged.add([failed], [_record(0, 1)])
        await _settle()
        with pytest.raises(RuntimeError, match="broker refused"):
            acknowledged.poll()
        assert consumer.commits == []

    asyncio.run(scenario())


def test_the_floors_resume_names_its_event() -> None:
    event = SimpleNamespace(correlationid="c-1", data={"ok": True})
    key, value = pipe.resume_of(event)  # type: ignore[arg-type]
    assert key == b"c-1"
    assert value == b'{"data": {"correlation_id": "c-1", "payload": {"ok": true}}}'


def test_each_pair_is_matchers_window_over_the_floor_beside_it() -> None:
    runs = {
        "r_matcher": [100.0],
        "latency_2000_p99_ms": [40.0, 90.0, 50.0],
        "latency_pipe_2000_p99_ms": [20.0, 30.0, 25.0],
        "latency_pipe_2000_p50_ms": [5.0, 6.0, 7.0],
    }
    assert _ratio_runs(runs) == {"latency_2000_p99_over_pipe": [2.0, 3.0, 2.0]}


def test_a_floor_over_the_target_is_named() -> None:
    floors = [{"p99_ms": 20.0}, {"p99_ms": 75.5}, {"p99_ms": 61.0}]
    (note,) = _floor_notes(2000, floors)
    assert "2 of 3 windows (75.5, 61.0 ms)" in note
    assert _floor_notes(2000, [{"p99_ms": 59.9}]) == []
    assert _floor_notes(200, floors) == []  # no target at that rate
