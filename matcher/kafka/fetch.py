"""Fetching that always makes progress, whatever bytes a producer wrote.

aiokafka decodes records lazily inside ``getmany``. A record it cannot decode (a header
name that is not UTF-8, a batch failing its CRC, a malformed record) raises out of
``getmany`` half-way through the call: the records already drained from other partitions
in that call are dropped although their positions have moved past them, and the failing
batch is fetched again and fails again, for ever. Anybody who can write to the topic can
stall a partition or crash the daemon that way.

``SafeFetcher`` wraps the consumer. The normal path is one ``consumer.getmany`` and a
conversion. When it fails on decoding, the fetcher *isolates* the failure:

1. It seeks every assigned partition back to just after the last record it handed over
   (for a partition with nothing handed over since assignment: the committed offset, or
   the reset policy), so nothing the failed call drained is lost, and notes each
   partition's end offset then (its *frontier*: the failing record lies below it).
2. It reads each partition still below its frontier on its own, ``getmany(tp,
   max_records=k)``, halving ``k`` on failure (and doubling it on success), so the good
   records before the failing one are handed over normally and, at ``k == 1``, the
   failing record is the next one at ``consumer.position(tp)``.
3. Only when it fails again at the same position (a transient error never skips a good
   record) does it read the bytes there itself, with a raw FetchRequest and
   ``raw_records.locate``: the undecodable record is handed over with ``undecodable`` set
   and whatever bytes could be read, and so are the rest of its batch (which aiokafka can
   never decode past it: it decodes every record of a batch, even those below the
   position). Then it seeks past them.
4. When every partition has reached its frontier, it goes back to the normal path.

Every await on the failure path is bounded in time, and each call returns within about
``max(timeout_ms, step_s)`` with what it found; its state carries over to the next call.
A call cancelled half-way hands nothing over and rewinds what it had read.

What it leans on beyond aiokafka's public API (pinned below 0.15): the consumer's
``_client`` (for the raw fetch), its subscription's ``_fetch_count`` and
``_last_fetch_ended`` (put right after a cancelled call), its settings ``_isolation_level``,
``_auto_offset_reset``, ``_max_poll_records`` and ``_max_partition_fetch_bytes`` (the raw
fetch must see what the consumer sees), and the names of the ``PartitionRecords`` methods
that decode (to tell a decoding failure from a bug elsewhere). It assumes ``check_crcs``
is left on. With ``auto_offset_reset="latest"`` and no committed offset, a failure in the
first call after an assignment rewinds a partition to its end (where it started is not
known): matcher uses "earliest".
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.errors import (
    CorruptRecordException,
    IllegalStateError,
    KafkaError,
    UnsupportedCodecError,
)
from aiokafka.protocol.fetch import FetchRequest

from matcher.kafka.raw_records import Located, Piece, locate

log = logging.getLogger("matcher.fetch")

Header = tuple[bytes, bytes | None]
Batch = dict[TopicPartition, list["FetchedRecord"]]

# The code aiokafka decodes records in: an exception raised there (not a KafkaError) is
# about the data, not the client. Looked up by name, so a renamed method only makes the
# check fall back to the exception types below.
_DECODING_CODE = frozenset(
    getattr(PartitionRecords, name).__code__
    for name in ("_unpack_records", "_consumer_record", "_contains_abort_marker")
    if hasattr(PartitionRecords, name)
)
_BLIND_AFTER = 4  # failures at one position, its bytes unreadable, before it is skipped


def _count_cancelled_fetch_out(consumer: Any) -> None:
    """aiokafka (0.14) counts a ``getmany`` in and out of progress with a context manager
    that does not count a cancelled one out; after that the consumer looks busy for ever
    to its own ``max_poll_interval_ms`` watchdog, which leaves the group when the loop
    stops fetching. Only one ``getmany`` runs at a time here, so after a cancelled one
    none is in progress (a client that counts it out itself is left as it is)."""
    subscription: Any = getattr(consumer, "_subscription", None)
    count = getattr(subscription, "_fetch_count", None)
    if isinstance(count, int) and count > 0:
        subscription._fetch_count = 0
        subscription._last_fetch_ended = time.monotonic()


@dataclass(frozen=True, slots=True)
class FetchedRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds; -1 when the record has none
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    # None for a record decoded normally. Otherwise why the client could not decode it;
    # key, value and headers then hold what could be read of it (possibly nothing).
    undecodable: str | None = None


class SafeFetcher:
    """``getmany`` over an ``AIOKafkaConsumer`` that hands over every record once, in
    order per partition, undecodable ones included (marked), and never stalls on one.

    The consumer must be used only through this fetcher for fetching and seeking, and
    what it knows of a partition must be dropped on every rebalance: subscribe with
    ``rebalance_listener()`` (or call ``forget`` from a listener of your own)."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        *,
        call_timeout_s: float = 5.0,
        step_s: float = 0.5,
        isolation_limit_s: float = 60.0,
    ) -> None:
        self._consumer = consumer
        self._call_timeout_s = call_timeout_s  # any one await on the failure path
        self._step_s = step_s  # the least time one call spends isolating
        # Isolating reads only the partitions below their frontier: after this long, the
        # others get their turn (if the failure is still there, isolation starts over).
        self._isolation_limit_s = isolation_limit_s
        self._began = 0.0
        # What the consumer was configured with; the raw fetch must see what it sees.
        self._read_committed = _setting(consumer, "_isolation_level") == "read_committed"
        self._reset = _setting(consumer, "_auto_offset_reset")
        self._poll_records = int(getattr(consumer, "_max_poll_records", None) or 500)
        self._fetch_bytes = int(getattr(consumer, "_max_partition_fetch_bytes", 1 << 20))
        # Per partition, the offset after the last record handed over (or an offset below
        # which nothing is left to hand over): where a failed call is rewound to.
        self._next: dict[TopicPartition, int] = {}
        # Isolation state: partitions still to rewind; partitions still below their
        # frontier; the k per partition; failures at k == 1 as (position, count).
        self._unseeked: set[TopicPartition] = set()
        self._frontiers: dict[TopicPartition, int] = {}
        self._steps: dict[TopicPartition, int] = {}
        self._failures: dict[TopicPartition, tuple[int, int]] = {}
        self._pending_error: Exception | None = None
        # Bumped by forget(): an await that spans it must not act on what it read before.
        self._generation = 0

    @property
    def isolating(self) -> bool:
        """Whether a decoding failure is being isolated (the slow, careful path)."""
        return bool(self._unseeked or self._frontiers)

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> Batch:
        """Like ``AIOKafkaConsumer.getmany`` over all assigned partitions."""
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error
        if self.isolating:
            return await self._isolate(timeout_ms, max_records)
        try:
            batch = await self._consumer_getmany(timeout_ms=timeout_ms, max_records=max_records)
        except Exception as exc:
            if not is_decoding_failure(exc):
                raise
            log.warning("a fetched record cannot be decoded; isolating it", extra={"error": exc})
            self._begin_isolation()
            return await self._isolate(timeout_ms, max_records)
        return self._hand_over(batch)

    async def _consumer_getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int | None
    ) -> dict[TopicPartition, list[Any]]:
        """The consumer's ``getmany``, its count of fetches in progress put right if the
        call is cancelled (see ``_count_cancelled_fetch_out``)."""
        try:
            batch: dict[TopicPartition, list[Any]] = await self._consumer.getmany(
                *partitions, timeout_ms=timeout_ms, max_records=max_records
            )
        except asyncio.CancelledError:
            _count_cancelled_fetch_out(self._consumer)
            raise
        return batch

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Drop what is known of these partitions: call it from the rebalance listener,
        for the revoked partitions (and the assigned ones), before fetching again."""
        for tp in partitions:
            self._next.pop(tp, None)
            self._unseeked.discard(tp)
            self._frontiers.pop(tp, None)
            self._steps.pop(tp, None)
            self._failures.pop(tp, None)
        self._generation += 1

    def rebalance_listener(self, inner: Any = None) -> ConsumerRebalanceListener:
        """A listener for ``consumer.subscribe`` that forgets the partitions of every
        rebalance, then calls ``inner`` (a ConsumerRebalanceListener, or None)."""
        return _Forgetting(self, inner)

    def _hand_over(self, batch: dict[TopicPartition, list[Any]]) -> Batch:
        """The hot path: convert, and note where each partition is."""
        out: Batch = {}
        handed = self._next
        for tp, messages in batch.items():
            if messages:
                out[tp] = [_converted(m) for m in messages]
                handed[tp] = messages[-1].offset + 1
        return out

    def _begin_isolation(self) -> None:
        self._unseeked = set(self._consumer.assignment())
        paused = self._consumer.paused()
        self._frontiers = {}
        for tp in self._unseeked - paused:  # a paused partition is not drained: not it
            end = self._end_offset(tp)
            if end is not None:  # no fetch answered yet: it cannot hold the failure
                self._frontiers[tp] = end
        self._steps.clear()
        self._failures.clear()
        self._began = asyncio.get_running_loop().time()

    def _end_offset(self, tp: TopicPartition) -> int | None:
        """Where the fetched data of ``tp`` ends, as the consumer last heard."""
        if self._read_committed:
            lso = self._consumer.last_stable_offset(tp)
            if lso is not None and lso >= 0:
                return int(lso)
        highwater = self._consumer.highwater(tp)
        return None if highwater is None else int(highwater)

    async def _isolate(self, timeout_ms: int, max_records: int | None) -> Batch:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms / 1000, self._step_s)
        budget = max_records or self._poll_records
        before = dict(self._next)
        out: Batch = {}
        try:
            await self._rewind()
            for tp in sorted(self._frontiers):
                if budget <= 0 or loop.time() >= deadline:
                    break
                if tp in self._unseeked:
                    continue
                # Filled in place, so that a cancellation in the middle rolls it back.
                got = out.setdefault(tp, [])
                await self._drain(tp, got, budget, deadline)
                budget -= len(got)
                if not got:
                    del out[tp]
        except Exception as exc:
            if not out:
                raise
            self._pending_error = exc  # raised by the next call, after these records
        except BaseException:
            self._roll_back(out, before)  # cancelled: what was read here goes again
            raise
        self._end_isolation_if_done(loop.time())
        return out

    def _end_isolation_if_done(self, now: float) -> None:
        if self._frontiers and not self._unseeked and now - self._began > self._isolation_limit_s:
            # Safe at any time once every partition is rewound: nothing handed over is
            # read again, and nothing not handed over was skipped.
            log.warning("isolating a decoding failure takes long; fetching normally again")
            self._frontiers.clear()
        if not self.isolating:
            self._steps.clear()
            self._failures.clear()
            log.info("decoding failure isolated; fetching normally again")

    def _roll_back(self, out: Batch, before: dict[TopicPartition, int]) -> None:
        for tp in out:
            if tp in before:
                self._next[tp] = before[tp]
            else:
                self._next.pop(tp, None)
            self._unseeked.add(tp)
            self._frontiers.setdefault(tp, self._frontier_now(tp))

    def _frontier_now(self, tp: TopicPartition) -> int:
        try:
            return self._end_offset(tp) or 0
        except (AssertionError, IllegalStateError):  # revoked meanwhile
            return 0

    async def _rewind(self) -> None:
        """Seek each partition left to rewind back to what was handed over last. One that
        cannot be rewound yet is tried again on the next call, and not read until then."""
        for tp in sorted(self._unseeked):
            generation = self._generation
            try:
                position = await self._position(tp)  # before _start_of, which may seek
                target = self._next.get(tp)
                if target is None:
                    target = await self._start_of(tp)
                if target is None or generation != self._generation:
                    continue
                if position != target:
                    self._consumer.seek(tp, target)
                    log.info(
                        "partition rewound",
                        extra={"partition": tp.partition, "position": position, "to": target},
                    )
            except IllegalStateError:  # revoked, and forget() not called (yet)
                self.forget([tp])
                continue
            except TimeoutError:
                continue
            self._next[tp] = target
            self._unseeked.discard(tp)

    async def _start_of(self, tp: TopicPartition) -> int | None:
        """Where ``tp`` started for this member: nothing was handed over since assignment."""
        try:
            async with asyncio.timeout(self._call_timeout_s):
                committed = await self._consumer.committed(tp)
                if committed is not None:
                    return int(committed)
                if self._reset == "earliest":
                    await self._consumer.seek_to_beginning(tp)
                elif self._reset == "latest":
                    # Records written between the assignment and now are not read again:
                    # with "latest" and no commit, where it started is not known.
                    await self._consumer.seek_to_end(tp)
                return int(await self._consumer.position(tp))
        except IllegalStateError:
            raise
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning("cannot find where a partition starts", extra={"error": exc})
            return None

    async def _position(self, tp: TopicPartition) -> int:
        async with asyncio.timeout(self._call_timeout_s):
            return int(await self._consumer.position(tp))

    async def _drain(
        self, tp: TopicPartition, out: list[FetchedRecord], budget: int, deadline: float
    ) -> None:
        """Read ``tp`` alone up to its frontier, within the budget and the deadline."""
        loop = asyncio.get_running_loop()
        while len(out) < budget and loop.time() < deadline:
            try:
                position = await self._position(tp)
            except IllegalStateError:  # revoked, and forget() not called (yet)
                self.forget([tp])
                break
            except TimeoutError:
                break
            if position >= self._frontiers.get(tp, position):
                self._frontiers.pop(tp, None)
                self._steps.pop(tp, None)
                break
            wait_ms = max(1, int(min(deadline - loop.time(), self._call_timeout_s) * 1000))
            out.extend(await self._probe(tp, position, budget - len(out), wait_ms))

    async def _probe(
        self, tp: TopicPartition, position: int, room: int, wait_ms: int
    ) -> list[FetchedRecord]:
        k = min(self._steps.get(tp, room), room)
        try:
            batch = await self._consumer_getmany(tp, timeout_ms=wait_ms, max_records=k)
        except Exception as exc:
            if not is_decoding_failure(exc):
                raise
            return await self._after_failure(tp, position, k, exc)
        got = self._hand_over(batch).get(tp, [])
        if got:
            self._steps[tp] = min(2 * k, self._poll_records)
            self._failures.pop(tp, None)
        return got

    async def _after_failure(
        self, tp: TopicPartition, position: int, k: int, exc: Exception
    ) -> list[FetchedRecord]:
        if k > 1:
            self._steps[tp] = k // 2  # the position did not move: the failure is within k
            return []
        at, count = self._failures.get(tp, (position, 0))
        count = count + 1 if at == position else 1
        self._failures[tp] = (position, count)
        if count < 2:
            return []  # once is no proof: the next probe fetches it again
        return await self._recover(tp, position, count, exc)

    async def _recover(
        self, tp: TopicPartition, position: int, count: int, exc: Exception
    ) -> list[FetchedRecord]:
        """The client fails at ``position`` again and again: hand over what is there."""
        generation = self._generation
        raw = await self._fetch_raw(tp, position)
        if generation != self._generation or tp not in self._consumer.assignment():
            return []  # a rebalance came in between: the next owner starts from a commit
        found = None if raw is None else locate(raw[0], position, raw[1], self._read_committed)
        if found is not None and not found.pieces and found.resume_at <= position:
            found = None  # the bytes show no way forward
        if found is None:
            if count < _BLIND_AFTER:
                return []  # the raw fetch may do better next time
            problem = "the client failed on it; its bytes could not be read"
            found = Located((Piece(position, None, problem),), position + 1, explained=False)
        # Every piece is at or after the position, and resume_at is past the last one.
        failure = f"{type(exc).__name__}: {exc}"[:160]
        records = [_from_piece(tp, p, found.explained, failure) for p in found.pieces]
        self._consumer.seek(tp, found.resume_at)
        self._next[tp] = found.resume_at
        self._failures.pop(tp, None)
        self._steps[tp] = 1  # the rest of a poisoned batch fails at once: start small
        log.warning(
            "undecodable records handed over",
            extra={
                "partition": tp.partition,
                "offsets": [r.offset for r in records if r.undecodable is not None],
                "resume_at": found.resume_at,
                "explained": found.explained,
                "error": failure,
            },
        )
        return records

    async def _fetch_raw(
        self, tp: TopicPartition, offset: int
    ) -> tuple[bytes, list[tuple[int, int]]] | None:
        """The bytes a fetch at ``offset`` returns, and the aborted transactions in them."""
        client = self._consumer._client
        node = client.cluster.leader_for_partition(tp)
        if node is None or node < 0:
            client.force_metadata_update()
            return None
        size = self._fetch_bytes
        request = FetchRequest(
            0, 1, size, int(self._read_committed), [(tp.topic, [(tp.partition, offset, size)])]
        )
        try:
            async with asyncio.timeout(self._call_timeout_s):
                response = await client.send(node, request)
        except (KafkaError, OSError, TimeoutError) as error:
            log.warning("raw fetch failed", extra={"error": error})
            return None
        return _partition_data(response, tp)


class _Forgetting(ConsumerRebalanceListener):  # type: ignore[misc]
    """What a partition's tracking said before a rebalance is wrong after it: another
    member may have read further, or this one may read again from a commit."""

    def __init__(self, fetcher: SafeFetcher, inner: Any) -> None:
        self._fetcher = fetcher
        self._inner = inner

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        self._fetcher.forget(revoked)
        if self._inner is not None:
            await _maybe_awaited(self._inner.on_partitions_revoked(revoked))

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        self._fetcher.forget(assigned)
        if self._inner is not None:
            await _maybe_awaited(self._inner.on_partitions_assigned(assigned))


async def _maybe_awaited(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


def is_decoding_failure(exc: BaseException) -> bool:
    """Whether an exception out of ``getmany`` comes from decoding a fetched record."""
    if isinstance(exc, CorruptRecordException | UnsupportedCodecError):
        return True
    if isinstance(exc, KafkaError) or not isinstance(exc, Exception):
        return False
    if isinstance(exc, UnicodeDecodeError):
        return True
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in _DECODING_CODE:
            return True
        tb = tb.tb_next
    return False


def _setting(consumer: AIOKafkaConsumer, name: str) -> str:
    value = getattr(consumer, name, None)
    if not isinstance(value, str):
        raise TypeError(f"cannot read the consumer's {name.lstrip('_')} (aiokafka changed?)")
    return value


def _converted(m: Any) -> FetchedRecord:
    headers = m.headers
    timestamp = m.timestamp
    return FetchedRecord(
        m.topic,
        m.partition,
        m.offset,
        -1 if timestamp is None else timestamp,
        m.timestamp_type or 0,
        m.key,
        m.value,
        # aiokafka decoded each name from UTF-8 strictly, so encoding gives its bytes back.
        tuple([(name.encode(), value) for name, value in headers]) if headers else (),
    )


def _from_piece(tp: TopicPartition, piece: Piece, explained: bool, failure: str) -> FetchedRecord:
    problem = piece.problem
    if problem is not None and not explained:
        problem = f"{problem} ({failure})"
    r = piece.record
    if r is None:
        return FetchedRecord(tp.topic, tp.partition, piece.offset, -1, 0, None, None, (), problem)
    timestamp_type = r.timestamp_type if r.timestamp >= 0 else 0  # as aiokafka reports it
    return FetchedRecord(
        tp.topic,
        tp.partition,
        r.offset,
        r.timestamp,
        timestamp_type,
        r.key,
        r.value,
        r.headers,
        problem,
    )


def _partition_data(
    response: Any, tp: TopicPartition
) -> tuple[bytes, list[tuple[int, int]]] | None:
    for topic, partitions in response.topics:
        if topic != tp.topic:
            continue
        for partition, error_code, _highwater, *rest in partitions:
            if partition != tp.partition:
                continue
            if error_code != 0:
                log.warning("raw fetch refused", extra={"error_code": error_code})
                return None
            # The layout aiokafka's fetcher reads (Fetcher._proc_fetch_request).
            if response.API_VERSION >= 11:
                aborted = rest[2]
            elif response.API_VERSION >= 4:
                aborted = rest[-2]
            else:
                aborted = None
            entries = [(int(pid), int(first)) for pid, first in aborted or ()]
            return bytes(rest[-1] or b""), entries
    return None
