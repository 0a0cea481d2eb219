"""From the events topic to judged records: fetch (the fetch wait told how many came),
judge (the gate), and pace a batch (take what arrives until its interval is out). The
ingest loop (``matcher.daemon.ingest``) hands what comes out to the batch writer."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from matcher.auth.gate import judge
from matcher.auth.policy import Policy
from matcher.auth.registry import Registry
from matcher.auth.registry_watch import RegistryHolder
from matcher.config import Settings
from matcher.domain.events import Rejection
from matcher.domain.records import IngestRecord
from matcher.kafka.binding import raw_record
from matcher.kafka.fetch import Batch, SafeFetcher
from matcher.kafka.fetch_wait import FlowFetchWait

# A batch whose keys and values add up to no more than this is judged on the event loop
# (a few milliseconds at most); a larger one in a worker thread.
INLINE_JUDGE_BYTES = 64 * 1024

# How long past its timeout a fetch made while a batch is paced may take before it is cut
# off (a busy machine's lateness; see Ingest._paced).
PACED_FETCH_GRACE_S = 0.1


def _payload_bytes(batch: Batch) -> int:
    return sum(
        len(m.value or b"") + len(m.key or b"") for messages in batch.values() for m in messages
    )


def to_ingest_records(batch: Batch, registry: Registry, policy: Policy) -> list[IngestRecord]:
    read_at = datetime.now(UTC)
    records: list[IngestRecord] = []
    for tp, messages in batch.items():
        for m in messages:
            raw = raw_record(m, read_at)
            verdict = (
                judge(raw, registry, policy)
                if m.undecodable is None
                else Rejection("undecodable", m.undecodable)
            )
            records.append(
                IngestRecord(
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=m.offset,
                    key=raw.key,
                    value=raw.value,
                    headers=raw.headers,
                    parsed=verdict,
                    arrived_at=raw.arrived_at,
                )
            )
    return records


def pacing_wait(last_began: float | None, now: float, interval_s: float) -> float:
    """How long a batch waits before its transaction begins: until ``interval_s`` after
    the one before began, or not at all if there was none. (A full batch does not wait
    either: the pacing stops taking records, and waiting, once the batch is full.)"""
    if last_began is None:
        return 0.0
    return min(interval_s, max(0.0, last_began + interval_s - now))


class Intake:
    """One consumer's way in: its fetch wait (set once the consumer exists), the registry
    and policy it judges by, and when the last batch began (on the event loop's clock)."""

    def __init__(self, settings: Settings, registry: RegistryHolder) -> None:
        self._settings = settings
        self._registry = registry
        self._policy: Policy = settings.policy()
        self.fetch_wait = FlowFetchWait(None, 0)  # the consumer's, once the loop makes it
        self.batch_began: float | None = None

    async def judged(self, batch: Batch) -> list[IngestRecord]:
        """The gate's verdicts on ``batch``. A small batch is judged here; a large one in
        a worker thread, so that the event loop (the group heartbeat, the relay, the
        admin probes) stays responsive however costly a batch is to read. The thread
        costs a hand-over each way, most of a small batch's judging time."""
        if not batch:
            return []
        registry = self._registry.current
        if _payload_bytes(batch) <= INLINE_JUDGE_BYTES:
            return to_ingest_records(batch, registry, self._policy)
        return await asyncio.to_thread(to_ingest_records, batch, registry, self._policy)

    async def fetch(
        self, fetcher: SafeFetcher, timeout_ms: int, max_records: int, bound_s: float | None = None
    ) -> Batch:
        """``getmany``, telling the fetch wait how many records came; given ``bound_s``,
        nothing (the call cancelled, which hands nothing over) if it is not back by then."""
        bound = asyncio.timeout(bound_s)  # None: no bound
        try:
            async with bound:
                batch = await fetcher.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except TimeoutError:
            if not bound.expired():  # the fetcher's own, not the bound's
                raise
            batch = {}
        self.fetch_wait.note(sum(map(len, batch.values())), asyncio.get_running_loop().time())
        return batch

    async def top_up(
        self,
        fetcher: SafeFetcher,
        batch: Batch,
        records: list[IngestRecord],
        wait_ms: int = 0,
        bound_s: float | None = None,
    ) -> None:
        """Add to ``batch`` (and its ``records``) what is fetched, up to the batch size:
        what is already there, or the first records within ``wait_ms`` (and, given
        ``bound_s``, nothing if the fetch is not back within it)."""
        room = self._settings.ingest_batch_max - len(records)
        if room <= 0:
            return
        more = await self.fetch(fetcher, wait_ms, room, bound_s)
        if not more:
            return
        records.extend(await self.judged(more))
        for tp, messages in more.items():
            batch.setdefault(tp, []).extend(messages)

    async def paced(self, fetcher: SafeFetcher, batch: Batch, records: list[IngestRecord]) -> None:
        """Hold ``batch`` until ``ingest_batch_interval_ms`` after the batch before it
        began, taking what arrives meanwhile. At 500 events/s a cycle takes about 1.5 ms,
        so without it nearly every event is a transaction (and a relay batch) of its
        own: CPU spent on cycles' fixed costs rather than on events.

        The wait is spent fetching, not sleeping: the client fetches a partition again
        only once what it holds of it has been taken, so a batch topped up once, at the
        end, would hold at most one fetch of each partition.

        Each fetch is bounded: once a rebalance has begun, aiokafka's ``getmany`` waits
        for the next assignment however short its timeout, and the revocation that
        must come first waits for the batch lock this batch holds. Cut off, the fetch
        hands nothing over and the batch goes as it is."""
        loop = asyncio.get_running_loop()
        s = self._settings
        wait = pacing_wait(self.batch_began, loop.time(), s.ingest_batch_interval_ms / 1000)
        deadline = loop.time() + wait
        # A full batch (a backlog) goes at once.
        while (left := deadline - loop.time()) > 0 and len(records) < s.ingest_batch_max:
            await self.top_up(
                fetcher, batch, records, wait_ms=max(1, round(left * 1000)),
                bound_s=left + PACED_FETCH_GRACE_S,
            )  # fmt: skip
        self.batch_began = loop.time()
