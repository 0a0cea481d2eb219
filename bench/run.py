"""The benchmark: matcher against this machine's limits and a peer, every figure in one run.

    python -m bench.run [--quick] [--out DIR]

Uses the services named by MATCHER_KAFKA_BOOTSTRAP_SERVERS and MATCHER_DATABASE_URL (the
Makefile points them at the devstack). Every figure is the median of --reps repetitions
after a warm-up; the same signed events (size, partitions) and the same schema serve all.
The last line printed is the path of the JSON results.

The full and quick runs also measure the daemon on a private 3-broker cluster (topics of
three replicas, min.insync.replicas 2) started after the single-broker throughput figures
and purged right after its own; Postgres stays the single server named above.

They end with the peers users would pick instead, each with its own server started and
stopped here: Temporal (bench/temporal_peer.py) and Restate (bench/restate_peer.py). The
smoke run skips them; a peer that cannot run leaves its figures null, with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from matcher_producer import CompletionEvent, SigningKey, encode, sign_record
from psycopg import sql
from psycopg.types.json import Jsonb
from rich.console import Console
from rich.progress import Progress

from bench import cpu, drift, jit, pressure, worker, write_path
from bench.cluster import ClusterUnavailable, private_cluster, replication
from bench.paced import PacedProducer, SignedEvent
from bench.peers import PAYLOAD
from bench.pipe import INSERT, event_of, inbox_rows, offsets, parse_record
from matcher.kafka.topics import EVENT_TOPIC_CONFIGS, delete_topics, ensure_topics
from matcher.store.migrate import migrate
from matcher.store.rematch import rematch_once

console = Console(stderr=True)
SECRET = "whsec_" + base64.b64encode(b"benchmark-hmac-secret-0123456789").decode()
PARTITIONS = 6


@dataclass
class Plan:
    n: int  # events per throughput measurement
    naive_n: int  # the naive design is slow; its rate needs fewer events
    reps: int
    rates: list[int]
    latency_s: float
    scale: list[int]
    dbos_n: int
    rf3: bool = True  # r_matcher on a 3-broker cluster too (a minute of JVM start-up)
    # The peers Temporal and Restate (bench/temporal_peer.py, bench/restate_peer.py): N
    # waits per throughput repetition, and the seconds of each latency run at plan.rates.
    peer_n: int = 0
    peer_latency_s: float = 1.0
    # Events per throughput run at scale (0: n). The quick run's n is measured in well
    # under a second, too short a window to tell a 20 % difference from noise.
    scale_n: int = 0
    # At most this many unrecorded windows at each latency rate before the measured ones,
    # until the broker's JIT compiler has settled (bench/jit.py).
    warm_windows: int = 6

    def steps(self) -> int:
        """The progress bar's steps: one per throughput repetition, latency rate and
        scale measurement; the cluster's start and each of its repetitions; each peer."""
        rf3 = 1 + self.reps if self.rf3 else 0
        peers = len(PEERS) if self.peer_n else 0
        return self.reps + rf3 + len(self.rates) + 2 * len(self.scale) + peers

    @property
    def scale_events(self) -> int:
        return self.scale_n or self.n


SMOKE = Plan(
    n=1200, naive_n=60, reps=1, rates=[200], latency_s=1, scale=[0, 2000], dbos_n=30,
    rf3=False, warm_windows=1,
)  # fmt: skip
QUICK = Plan(
    n=4000, naive_n=500, reps=3, rates=[500, 2000], latency_s=5, scale=[0, 100_000], dbos_n=300,
    scale_n=12_000,
    # The peers resume tens of waits per second: at 200 waits and a quarter second of
    # events per rate they took 2.7 of the quick run's 6.2 minutes.
    peer_n=100, peer_latency_s=0.1, warm_windows=4,
)  # fmt: skip
FULL = Plan(
    n=30_000, naive_n=3000, reps=3, rates=[500, 2000], latency_s=15,
    scale=[0, 100_000, 1_000_000, 10_000_000], dbos_n=2000, peer_n=1000, peer_latency_s=2,
)  # fmt: skip

# Each peer: its module (run as a process of its own, which starts and stops the peer's
# servers) and its throughput figures, null with a note when the peer could not run.
PEERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "temporal": ("bench.temporal_peer", ("r_temporal", "r_temporal_sws")),
    "restate": ("bench.restate_peer", ("r_restate", "r_restate_awakeable", "r_restate_early")),
}
# A peer process still running after this long is stopped (its whole process group).
PEER_TIMEOUT_S = 1800.0


@dataclass
class Results:
    plan: dict[str, Any]
    machine: dict[str, Any]
    runs: dict[str, list[float]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, float | None] = field(default_factory=dict)
    targets: dict[str, bool] = field(default_factory=dict)
    # Per repetition, paired by index: the spread of the ratios of two measured figures.
    ratio_runs: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Wall-clock seconds of each phase, in order: where a run's minutes go.
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # What Postgres wrote and spent per event in r_matcher and r_pipe (bench.write_path),
    # medians of the repetitions, and the targets on them.
    write_path: dict[str, dict[str, float | None]] = field(default_factory=dict)
    write_path_targets: dict[str, bool] = field(default_factory=dict)


class Env:
    def __init__(self) -> None:
        self.kafka = os.environ["MATCHER_KAFKA_BOOTSTRAP_SERVERS"]
        self.admin_url = os.environ["MATCHER_DATABASE_URL"]
        self.template = f"bench_tpl_{uuid.uuid4().hex[:8]}"
        self.databases: list[str] = []
        self.preloaded: dict[int, str] = {}  # rows of history -> its template's name
        self.topics: list[str] = []
        # The extensions bench.write_path reads, and whether the phases' databases have them.
        self.extensions: dict[str, bool] = {}
        # The CPU of the Postgres and Kafka servers, where they run on this machine.
        self.server_cpu = cpu.server_readers(self.admin_url, self.kafka)
        # The broker's process, where its JIT compiler can be read (bench/jit.py).
        self.broker_jvm = jit.broker_jvm(self.kafka)
        self.workdir = Path(tempfile.mkdtemp(prefix="matcher-bench-"))
        self.producers_file = self.workdir / "producers.toml"
        self.producers_file.write_text(
            f'[producers."bench-svc"]\ntenants = ["acme"]\ntypes = ["job.completed"]\n'
            f'[[producers."bench-svc".keys]]\nid = "k1"\nhmac_secret = "{SECRET}"\n'
        )

    def url(self, name: str) -> str:
        return self.admin_url.rsplit("/", 1)[0] + "/" + name

    def admin(self, statement: sql.Composed) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(statement)

    def setup(self) -> None:
        self.admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        migrate(self.url(self.template))
        # Every phase's database is a copy of the template: the WAL and the server's time
        # per event are read there (bench.write_path).
        self.extensions = write_path.enable(self.url(self.template))

    def fresh_db(self, preload_rows: int = 0) -> str:
        """A new database for the next measurement, holding ``preload_rows`` of history
        (see preload); the previous one (measured and done with) is dropped first, so the
        tables of large runs do not pile up and autovacuum does not work through dozens
        of dead databases while we measure."""
        self._drop(self.databases)
        self.databases = []
        name = f"bench_{uuid.uuid4().hex[:10]}"
        template = self._template_with(preload_rows)
        # A preloaded template is copied file by file: WAL_LOG, the default, would write
        # all of a 10M-row template to the WAL again for every measurement.
        strategy = sql.SQL(" STRATEGY FILE_COPY" if preload_rows else "")
        self.admin(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}{}").format(
                sql.Identifier(name), sql.Identifier(template), strategy
            )
        )
        self.databases.append(name)
        return self.url(name)

    def _template_with(self, preload_rows: int) -> str:
        """The migrated template, or (made once per size, and kept until drop_preloaded)
        a copy of it holding ``preload_rows`` of history: preloading 10M rows takes
        minutes, copying them a fraction of that."""
        if preload_rows == 0:
            return self.template
        name = self.preloaded.get(preload_rows)
        if name is None:
            name = f"{self.template}_{preload_rows}"
            self.admin(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self.template)
                )
            )
            self.preloaded[preload_rows] = name
            preload(self.url(name), preload_rows)
        return name

    def drop_preloaded(self) -> None:
        """Drop the preloaded templates (and the database last cloned from one)."""
        self._drop([*self.databases, *self.preloaded.values()])
        self.databases = []
        self.preloaded = {}

    @contextlib.contextmanager
    def kafka_at(self, bootstrap: str) -> Iterator[None]:
        """Inside the block, topics, producers, consumers and daemons use the Kafka at
        ``bootstrap``; the databases stay this Postgres's. The topics made there are left
        to that Kafka's owner (the private cluster is purged with them)."""
        kafka, topics = self.kafka, self.topics
        self.kafka, self.topics = bootstrap, []
        try:
            yield
        finally:
            self.kafka, self.topics = kafka, topics

    async def cleanup(self) -> None:
        await delete_topics({"bootstrap_servers": self.kafka}, self.topics)
        self._drop([*self.databases, *self.preloaded.values(), self.template])

    def _drop(self, names: list[str]) -> None:
        for name in names:
            self.admin(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    async def topic(self, kind: str) -> str:
        name = f"bench.{uuid.uuid4().hex[:8]}.{kind}"
        configs = {name: EVENT_TOPIC_CONFIGS} if kind == "events" else None
        await ensure_topics(
            {"bootstrap_servers": self.kafka}, [name], partitions=PARTITIONS, configs=configs
        )
        self.topics.append(name)
        return name


Step = Callable[[str], None]  # advances the progress bar, with what was just measured
CpuUse = dict[str, float]  # process -> microseconds of CPU per event


def signed_events(count: int) -> list[SignedEvent]:
    """(correlation id, key, headers, value) of ``count`` signed binary-mode events."""
    key = [SigningKey.parse("k1", SECRET)]
    out = []
    for _ in range(count):
        correlation = uuid.uuid4().hex
        event = CompletionEvent(
            source="bench-svc", type="job.completed", tenant="acme",
            correlation_id=correlation, job_id=f"job-{correlation[:8]}", data=PAYLOAD,
        )  # fmt: skip
        record = sign_record(encode(event), event.id, key)
        out.append((correlation, record.key, record.headers, record.value))
    return out


async def produce_all(
    env: Env, topic: str, events: list[tuple[str, bytes, list[tuple[str, bytes]], bytes]]
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=env.kafka, enable_idempotence=True, acks="all", linger_ms=5,
        max_batch_size=256 * 1024,
    )  # fmt: skip
    await producer.start()
    try:
        futures = [await producer.send(topic, v, key=k, headers=h) for _, k, h, v in events]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def register_waits(url: str, correlations: list[str]) -> None:
    """The waits, registered (and checked against stored events, as the daemon's rematch
    pass does) before the run, as waits registered well before their events would be."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO matcher.waits (id, tenant, run_id, position, event_types, correlation_id)"
            " SELECT gen_random_uuid(), 'acme', 'run-' || c, 0, ARRAY['job.completed'], c"
            " FROM unnest(%s::text[]) AS c",
            [correlations],
        )
        while (await rematch_once(conn, limit=5000)).keys:
            pass


async def register_fan_in_waits(url: str, correlations: list[str]) -> None:
    """``register_waits`` for fan-in: a wait for all of two events, one per pair of
    correlations (its conditions as register_wait_v2 writes them)."""
    pairs = [correlations[i : i + 2] for i in range(0, len(correlations) - 1, 2)]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "WITH fan_in AS ("
            "  INSERT INTO matcher.waits (id, tenant, run_id, position, event_types,"
            "                             correlation_id, needed)"
            "  SELECT gen_random_uuid(), 'acme', 'run-' || a, 0, ARRAY['job.completed'], a, 2"
            "  FROM unnest(%s::text[], %s::text[]) AS p(a, b)"
            "  RETURNING id, correlation_id"
            ") INSERT INTO matcher.waits (id, tenant, run_id, position, event_types,"
            "                             correlation_id, group_id, condition_index)"
            " SELECT gen_random_uuid(), 'acme', 'run-' || f.correlation_id, 0,"
            "        ARRAY['job.completed'], c.correlation, f.id, c.n"
            " FROM fan_in AS f JOIN unnest(%s::text[], %s::text[]) AS p(a, b)"
            "   ON p.a = f.correlation_id"
            " CROSS JOIN LATERAL (VALUES (p.a, 0), (p.b, 1)) AS c(correlation, n)",
            [[a for a, _ in pairs], [b for _, b in pairs]] * 2,
        )
        while (await rematch_once(conn, limit=5000)).keys:
            pass


def preload(url: str, rows: int) -> None:
    """``rows`` old resolved waits and consumed events, as months of history would leave."""
    if rows == 0:
        return
    with psycopg.connect(url, autocommit=True) as conn:
        # Spread over the days a default dedupe window keeps, as steady traffic would be.
        conn.execute("SELECT matcher.ensure_inbox_partitions(now() - interval '14 days', now())")
        conn.execute(
            "INSERT INTO matcher.waits (id, tenant, run_id, position, event_types,"
            " correlation_id, state, created_at, resolved_at, resolution,"
            " resolved_by_producer, resolved_by_event_id)"
            " SELECT gen_random_uuid(), 'acme', 'old-' || g, 0, ARRAY['job.completed'],"
            " 'old-corr-' || g, 'matched', now() - interval '2 days', now() - interval '2 days',"
            " 'event', 'old-svc', 'old-' || g FROM generate_series(1, %s) AS g",
            [rows],
        )
        conn.execute(
            "INSERT INTO matcher.inbox (producer, event_id, tenant, type, correlation_id,"
            " external_job_id, received_at, kafka_topic, kafka_partition, kafka_offset, data,"
            " status, status_at) SELECT 'old-svc', 'old-' || g, 'acme', 'job.completed',"
            " 'old-corr-' || g, 'job-' || g, now() - make_interval(days => 1 + g %% 14), 'old',"
            " g %% 6, g, %s::jsonb, 'consumed', now() - make_interval(days => 1 + g %% 14)"
            " FROM generate_series(1, %s) AS g",
            [json.dumps(PAYLOAD), rows],
        )
        # Each stored event's claimed id, as ingest leaves them.
        conn.execute(
            "INSERT INTO matcher.event_ids (producer, event_id, received_at)"
            " SELECT producer, event_id, received_at FROM matcher.inbox"
            " WHERE producer = 'old-svc'"
        )
        conn.execute("VACUUM ANALYZE matcher.waits")
        conn.execute("VACUUM ANALYZE matcher.inbox")
        conn.execute("VACUUM ANALYZE matcher.event_ids")


async def consume(
    env: Env,
    topic: str,
    want: int,
    handle: Callable[[AIOKafkaConsumer, list[Any]], Awaitable[None]],
    max_records: int = 500,
) -> float:
    """Consume ``want`` records in batches through ``handle``; return the elapsed seconds."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=env.kafka, group_id=f"bench-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=max_records,
    )  # fmt: skip
    await consumer.start()
    try:
        seen = 0
        started = None
        while seen < want:
            batch = await consumer.getmany(timeout_ms=1000, max_records=max_records)
            records = [r for rs in batch.values() for r in rs]
            if not records:
                continue
            started = started or time.perf_counter()
            await handle(consumer, records)
            seen += len(records)
        return time.perf_counter() - (started or time.perf_counter())
    finally:
        await consumer.stop()


async def r_kafka(env: Env, topic: str, n: int) -> float:
    async def handle(consumer: AIOKafkaConsumer, records: list[Any]) -> None:
        for r in records:
            parse_record(r)
        await consumer.commit(offsets(records))

    return n / await consume(env, topic, n, handle)


async def r_pg(env: Env, records: list[Any]) -> float:
    url = env.fresh_db()
    batches = [inbox_rows(records[i : i + 500]) for i in range(0, len(records), 500)]
    async with await psycopg.AsyncConnection.connect(url) as conn:
        started = time.perf_counter()
        for columns in batches:
            await conn.execute(INSERT, columns)
            await conn.commit()
        return len(records) / (time.perf_counter() - started)


async def r_pipe(
    env: Env,
    topic: str,
    n: int,
    cpu_use: CpuUse | None = None,
    wal_use: dict[str, float] | None = None,
) -> float:
    """Kafka to Postgres with nothing in between: a batch read, inserted, committed, and
    its offsets committed. ``cpu_use`` gets the CPU per event of each process, from the
    first batch on (the client is this process); ``wal_use``, what Postgres wrote and
    spent per event (bench.write_path), until its connection is gone."""
    url = env.fresh_db()
    wal_before = write_path.read(url, before=True) if wal_use is not None else None
    meter = cpu.Meter({**env.server_cpu, "client": cpu.own_cpu_s}, time.perf_counter)
    async with await psycopg.AsyncConnection.connect(url) as conn:

        async def handle(consumer: AIOKafkaConsumer, records: list[Any]) -> None:
            if not meter.started:
                meter.start()
            await conn.execute(INSERT, inbox_rows(records))
            await conn.commit()
            await consumer.commit(offsets(records))

        rate = n / await consume(env, topic, n, handle)
        if cpu_use is not None:
            cpu_use.update(meter.stop().us_per_event(n))
    if wal_before is not None and wal_use is not None:
        wal_use.update(write_path.measure(url, wal_before, n))
    return rate


async def r_naive(env: Env, topic: str, events: list[Any], n: int) -> float:
    """One transaction and one offset commit per event, one query per step."""
    url = env.fresh_db()
    await register_waits(url, [c for c, *_ in events])

    async with await psycopg.AsyncConnection.connect(url) as conn:

        async def handle(consumer: AIOKafkaConsumer, records: list[Any]) -> None:
            for r in records:
                e = event_of(r)
                cur = await conn.execute(
                    "SELECT id, run_id FROM matcher.waits WHERE tenant = %s AND correlation_id = %s"
                    " AND state = 'waiting' FOR UPDATE",
                    [e.tenant, e.correlationid],
                )
                wait = await cur.fetchone()
                await conn.execute(
                    "INSERT INTO matcher.inbox (producer, event_id, tenant, type, correlation_id,"
                    " kafka_topic, kafka_partition, kafka_offset, data, status)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    [
                        e.source,
                        e.id,
                        e.tenant,
                        e.type,
                        e.correlationid,
                        r.topic,
                        r.partition,
                        r.offset,
                        Jsonb(e.data),
                        "consumed" if wait else "pending",
                    ],
                )
                if wait:
                    await conn.execute(
                        "UPDATE matcher.waits SET state = 'matched', resolved_at = now(),"
                        " resolution = 'event', resolution_id = gen_random_uuid(),"
                        " outcome = 'event' WHERE id = %s AND state = 'waiting'",
                        [wait[0]],
                    )
                    await conn.execute(
                        "INSERT INTO matcher.resume_queue (wait_id) VALUES (%s)", [wait[0]]
                    )
                await conn.commit()
                await consumer.commit(offsets([r]))

        return n / await consume(env, topic, n, handle, max_records=50)


def _daemon_env(env: Env, url: str, events_topic: str, resume_topic: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("MATCHER_")}
    out.update(
        MATCHER_KAFKA_BOOTSTRAP_SERVERS=env.kafka, MATCHER_DATABASE_URL=url,
        MATCHER_EVENTS_TOPIC=events_topic, MATCHER_RESUME_TOPIC=resume_topic,
        MATCHER_CONSUMER_GROUP=f"bench-{uuid.uuid4().hex[:8]}",
        MATCHER_PRODUCERS_FILE=str(env.producers_file), MATCHER_ADMIN_ADDRESS="127.0.0.1:0",
        MATCHER_LOG_LEVEL="WARNING",
        # The events are signed once and replayed by every measurement of the run, which
        # lasts longer than the default 5-minute timestamp tolerance.
        MATCHER_SIGNATURE_TOLERANCE_S="86400",
    )  # fmt: skip
    return out


class Daemon:
    """``matcher run`` (or, given ``argv``, the pipe's floor: bench.pipe) as a process."""

    def __init__(self, environment: dict[str, str], argv: list[str] | None = None) -> None:
        self.process = subprocess.Popen(
            argv or [sys.executable, "-m", "matcher", "run"], env=environment,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def peak_rss(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        self.process.terminate()
        _, errors = self.process.communicate(timeout=60)
        # -SIGTERM: a daemon of a group that finished the work before it had even started
        # (it had not yet installed its handler); nothing of its was measured.
        if self.process.returncode not in (0, -signal.SIGTERM):
            raise RuntimeError(f"daemon exited {self.process.returncode}: {errors[-2000:]}")


def _all_published(conn: psycopg.Connection[Any], want: int) -> bool:
    """Whether ``want`` resumes are published: two probes of small tables per poll (no wait
    open, no resume queued), so that polling every 20 ms does not take the database's CPU
    from the daemon it measures."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM matcher.open_waits),"
        " EXISTS (SELECT 1 FROM matcher.resume_queue)"
    ).fetchone()
    if row is None or row[0] or row[1]:
        return False
    # Every wait resolved and no resume queued: confirm once with an exact count.
    exact = conn.execute("SELECT count(*) FROM matcher.resolutions WHERE published").fetchone()
    return exact is not None and exact[0] >= want


def _first_stored(url: str, topic: str) -> float:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM min(received_at)) FROM matcher.inbox WHERE kafka_topic = %s",
            [topic],
        ).fetchone()
    if row is None or row[0] is None:
        raise RuntimeError("the daemon stored nothing")
    return float(row[0])


def _stored_count(conn: psycopg.Connection[Any]) -> int | None:
    """How many events are stored, once there is one (None before): the CPU meter of a
    throughput run starts with the first stored batch, as its clock does."""
    row = conn.execute("SELECT count(*) FROM matcher.inbox HAVING count(*) > 0").fetchone()
    return None if row is None else int(row[0])


async def r_matcher(
    env: Env,
    topic: str,
    events: list[Any],
    preload_rows: int = 0,
    daemons: int = 1,
    cpu_use: CpuUse | None = None,
    kept: dict[str, str] | None = None,
    fan_in: bool = False,
    wal_use: dict[str, float] | None = None,
) -> tuple[float, int]:
    """The daemon end to end: (events/s until every resume is published, peak RSS bytes of
    the largest daemon). ``daemons`` processes share the work as one consumer group.
    ``fan_in``: the events' waits are fan-in waits, all of two events each (one resume
    per two events).
    ``kept`` gets the run's database URL and resume topic.
    ``cpu_use`` gets the CPU per event of each process, from the first stored batch on
    (the events stored before the meter started are not counted in it; it stays empty
    when the first batch held them all).
    ``wal_use`` gets what Postgres wrote and spent per event (bench.write_path), from
    after the waits' registration until the daemons' connections are gone."""
    url = env.fresh_db(preload_rows)
    correlations = [c for c, *_ in events]
    if fan_in:
        await register_fan_in_waits(url, correlations)
    else:
        await register_waits(url, correlations)
    want = len(events) // 2 if fan_in else len(events)
    wal_before = write_path.read(url, before=True) if wal_use is not None else None
    resumes = await env.topic("resumes")
    if kept is not None:  # for the worker's measurement after this one
        kept.update(url=url, resumes=resumes)
    environment = _daemon_env(env, url, topic, resumes)
    running = [Daemon(environment) for _ in range(daemons)]
    meter = cpu.Meter(
        {
            **env.server_cpu,
            "daemon": lambda: cpu.processes_cpu_s(d.process.pid for d in running),
            "bench": cpu.own_cpu_s,
        },
        time.perf_counter,
    )
    try:
        stored_at_start = await _until_published(url, want, running, meter)
        finished = time.time()
        counted = len(events) - (stored_at_start or len(events))
        if cpu_use is not None and counted > 0:
            cpu_use.update(meter.stop().us_per_event(counted))
        rss = max(daemon.peak_rss() for daemon in running)
    finally:
        for daemon in running:
            daemon.stop()
    if wal_before is not None and wal_use is not None:  # the daemons' backends gone first
        wal_use.update(write_path.measure(url, wal_before, len(events)))
    # Timed like r_kafka and r_pipe: from the first batch consumed (the first inbox row's
    # transaction), not from process start, so the group join is excluded for all of them.
    return len(events) / (finished - _first_stored(url, topic)), rss


async def _until_published(
    url: str, want: int, running: list[Daemon], meter: cpu.Meter
) -> int | None:
    """Poll until ``want`` resumes are published, starting ``meter`` with the first stored
    batch; the events stored by then (None: the first poll found them all published)."""
    stored_at_start: int | None = None
    with psycopg.connect(url, autocommit=True) as conn:
        write_path.untracked(conn)  # its polls are no part of the daemon's server time
        while not _all_published(conn, want):
            if stored_at_start is None:
                stored_at_start = _stored_count(conn)
                if stored_at_start is not None:
                    meter.start()
            refused = conn.execute("SELECT count(*) FROM matcher.quarantine").fetchone()
            if refused and refused[0]:
                raise RuntimeError(f"{refused[0]} benchmark events were quarantined")
            for daemon in running:
                if daemon.process.poll() is not None:
                    raise RuntimeError(
                        "daemon died: "
                        + (daemon.process.stderr.read() if daemon.process.stderr else "")
                    )
            await asyncio.sleep(0.02)
    return stored_at_start


async def r_worker(env: Env, url: str, resume_topic: str, want: int) -> float:
    """The resume worker (``matcher worker``, bench.worker's one-row handler) on the
    resumes r_matcher published: runs advanced per second, each with its handler's row in
    the advance's transaction, from the first row written (the group join left out)."""
    worker.create_steps_table(url)
    process = Daemon(worker.worker_env(env.kafka, url, resume_topic), worker.worker_argv())

    def alive() -> None:
        if process.process.poll() is not None:
            raise RuntimeError(f"worker exited {process.process.returncode}")

    try:
        return await worker.advanced_per_second(url, want, alive)
    finally:
        process.stop()


# The percentiles each latency run reports, of the whole path and of each of its stages.
PERCENTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
# The stages of event published -> resume published, told apart by the timestamp matcher
# keeps: the inbox row's received_at is when the ingest transaction began. (The relay
# keeps no time of its claim since migration 0026: its mark is the queue row's delete.)
STAGES = ("stored", "published")
# Each latency run first sends this many seconds of events at its rate, not counted.
WARM_UP_S = 1.0
# Each repetition of the Kafka floor's latency run lasts at most this long.
FLOOR_S = 2.0
# The latency targets (event published -> resume published, p99) at these rates.
LATENCY_TARGETS_MS = {500: 30.0, 2000: 60.0}


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        name: 1000 * ordered[min(len(ordered) - 1, int(p * len(ordered)))]
        for name, p in PERCENTILES.items()
    }


def _stage_times(url: str) -> dict[str, float]:
    """Per correlation id: when the ingest transaction that stored its event began (epoch
    seconds)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT i.correlation_id, extract(epoch FROM i.received_at)"
            " FROM matcher.inbox AS i WHERE i.consumed_by IS NOT NULL"
        ).fetchall()
    return {row[0]: float(row[1]) for row in rows}


async def _resumes_until(
    consumer: AIOKafkaConsumer, into: dict[str, float], done: Callable[[], bool], timeout_s: float
) -> None:
    """Read resumes (correlation id -> the resume's timestamp) until ``done()``."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        for records in (await consumer.getmany(timeout_ms=200)).values():
            for r in records:
                into[json.loads(r.value)["data"]["correlation_id"]] = r.timestamp / 1000


@dataclass
class Window:
    """One latency window: when each event was sent and its resume published (correlation
    id -> epoch seconds, the warm-up's too), and what the machine did meanwhile."""

    sent: dict[str, float]
    resumed: dict[str, float]
    cores: dict[str, float]
    waited: dict[str, float]
    jit_pct: float | None


async def _window(
    env: Env,
    rate: int,
    events: list[SignedEvent],
    topics: tuple[str, str],
    server: Daemon,
    ready: Callable[[], bool] | None = None,
) -> Window:
    """``events`` sent to ``topics[0]`` at ``rate``/s while ``server`` (the daemon, or the
    pipe's floor) turns them into resumes on ``topics[1]``; stops ``server`` when done.

    The clock starts once a first event's resume has come back (the server has joined its
    group and every stage has run once: a condition, not a guessed sleep), and ``ready()``
    says so too (the resume worker has handled that first resume)."""
    resumed: dict[str, float] = {}
    first, *rest = events
    # Each process is stopped however the run ends, the last started first.
    async with contextlib.AsyncExitStack() as started:
        started.callback(server.stop)
        producer = PacedProducer(env.kafka, topics[0])
        started.callback(producer.close)
        resumes = AIOKafkaConsumer(
            topics[1], bootstrap_servers=env.kafka, group_id=None, auto_offset_reset="earliest",
        )  # fmt: skip
        await resumes.start()
        started.push_async_callback(resumes.stop)
        meter = cpu.Meter(
            {
                **env.server_cpu,
                "daemon": lambda: cpu.process_cpu_s(server.process.pid),
                # The load generator and the resume reader.
                "bench": lambda: cpu.own_cpu_s() + cpu.process_cpu_s(producer.pid),
            },
            time.perf_counter,
        )
        stalls = pressure.Stalls(time.perf_counter)
        await producer.send_now(first)
        await _resumes_until(resumes, resumed, lambda: bool(resumed), 60)
        if not resumed:
            raise RuntimeError("no resume was published within 60 s of the first event")
        await _until_ready(ready, 60)
        # The broker's JIT compiler threads, apart: they are part of the broker's CPU.
        compiling = jit.CompilerMeter(env.broker_jvm, time.perf_counter) if env.broker_jvm else None
        if compiling:
            compiling.start()
        meter.start()
        stalls.start()
        sent = await producer.paced(rest, rate)
        await _resumes_until(resumes, resumed, lambda: len(resumed) > len(rest), 60)
        cores = meter.stop().cores()
        waited = stalls.stop()
        compiled = compiling.stop_pct() if compiling else None
    return Window(sent, resumed, cores | {"total": sum(cores.values())}, waited, compiled)


async def _until_ready(ready: Callable[[], bool] | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while ready is not None and not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready within {timeout_s:.0f} s of the first resume")
        await asyncio.sleep(0.05)


def _window_figures(window: Window, whole: list[float]) -> dict[str, Any]:
    """The figures every latency window reports, of ``whole`` (the measured events'
    latencies in the order sent)."""
    figures: dict[str, Any] = {f"{k}_ms": v for k, v in _percentiles(whole).items()}
    # Whether the window kept up with its rate (bench.drift): ``whole`` is in send order.
    figures["drift_ms"] = drift.drift_ms(whole)
    figures |= window.waited  # how long the disk and the CPU kept tasks waiting meanwhile
    if window.jit_pct is not None:  # the compiler's share of a core (bench/jit.py)
        figures["kafka_jit_pct"] = window.jit_pct
    step = max(1, len(whole) // 1000)
    return figures | {
        # What each process used of the machine while the events were sent and resumed.
        "cpu_cores": window.cores,
        # Of every event sent, the warm-up's too: a resume lost there is lost all the same.
        "received": sum(1 for correlation in window.sent if correlation in window.resumed),
        "sent": len(window.sent),
        "measured": len(whole),
        "samples_ms": [1000 * x for x in sorted(whole)[::step]],
    }


async def latency(env: Env, rate: int, seconds: float, preload_rows: int = 0) -> dict[str, Any]:
    """Events published at ``rate``/s for ``seconds``; published-to-resume-published
    percentiles, of the whole path and of its stages (see STAGES).

    After the first event's resume (see _window), a further WARM_UP_S of events at the
    same rate are sent and not counted: in a daemon's first half-second at a new rate its
    connections still prepare their statements and its fetches and batches find their
    size, and stalls of 100-300 ms there made the p99 of a whole run depend on its first
    moments."""
    url = env.fresh_db(preload_rows)
    warm = int(rate * WARM_UP_S)
    events = signed_events(1 + warm + int(rate * seconds))
    await register_waits(url, [c for c, *_ in events])
    topics = await env.topic("events"), await env.topic("resumes")
    daemon = Daemon(_daemon_env(env, url, *topics))
    window = await _window(env, rate, events, topics, daemon)
    whole, parts = _by_stage(list(window.sent.items())[warm:], window.resumed, _stage_times(url))
    figures = _window_figures(window, whole)
    for name, values in parts.items():
        figures |= {f"{name}_{k}_ms": v for k, v in _percentiles(values).items()}
    return figures


async def worker_latency(env: Env, rate: int, seconds: float) -> dict[str, float]:
    """The daemon and the resume worker together, events at ``rate``/s for ``seconds``
    (WARM_UP_S not counted, as latency() counts): resume published (its Kafka timestamp)
    -> the handler's row written, and event sent -> the handler's row written."""
    url = env.fresh_db()
    worker.create_steps_table(url)
    warm = int(rate * WARM_UP_S)
    events = signed_events(1 + warm + int(rate * seconds))
    await register_waits(url, [c for c, *_ in events])
    topics = await env.topic("events"), await env.topic("resumes")
    daemon = Daemon(_daemon_env(env, url, *topics))
    process = Daemon(worker.worker_env(env.kafka, url, topics[1]), worker.worker_argv())
    try:
        window = await _window(
            env, rate, events, topics, daemon, ready=lambda: worker.steps_written(url) > 0
        )
        want = len(window.sent)
        await _until_ready(lambda: worker.steps_written(url) >= want, 60)
    finally:
        process.stop()
    measured = dict(list(window.sent.items())[warm:])
    after_resume, end_to_end = worker.latencies_ms(measured, window.resumed, worker.step_times(url))
    if len(after_resume) < len(measured):
        raise RuntimeError(f"{len(measured) - len(after_resume)} steps missing at {rate}/s")
    return {f"{k}_ms": v for k, v in _percentiles(after_resume).items()} | {
        f"e2e_{k}_ms": v for k, v in _percentiles(end_to_end).items()
    }


async def pipe_latency(env: Env, rate: int, seconds: float) -> dict[str, Any]:
    """The pipe's floor under matcher's latency (bench.pipe): the same events at the same
    rate through a loop that stores each batch and publishes a resume per event, measured
    as latency() measures matcher (WARM_UP_S not counted). Its process is reported as the
    daemon in ``cpu_cores``."""
    url = env.fresh_db()
    warm = int(rate * WARM_UP_S)
    events = signed_events(1 + warm + int(rate * seconds))
    topics = await env.topic("events"), await env.topic("resumes")
    pipe = Daemon(
        _daemon_env(env, url, *topics),
        [sys.executable, "-m", "bench.pipe", env.kafka, url, *topics],
    )
    window = await _window(env, rate, events, topics, pipe)
    measured = list(window.sent.items())[warm:]
    resumed = window.resumed
    return _window_figures(window, [resumed[c] - at for c, at in measured if c in resumed])


def _by_stage(
    sent: list[tuple[str, float]],
    resumed: dict[str, float],
    stages: dict[str, float],
) -> tuple[list[float], dict[str, list[float]]]:
    """Each resumed event's latency (in the order sent), and its parts by stage (STAGES):
    sent -> stored, stored -> resume published."""
    whole: list[float] = []
    parts: dict[str, list[float]] = {name: [] for name in STAGES}
    for correlation, sent_at in sent:
        if correlation not in resumed:
            continue
        whole.append(resumed[correlation] - sent_at)
        stored = stages[correlation]
        parts["stored"].append(stored - sent_at)
        parts["published"].append(resumed[correlation] - stored)
    return whole, parts


async def kafka_latency(env: Env, rate: int, seconds: float) -> dict[str, float]:
    """The floor under matcher's latency: the same events at the same rate from the same
    producer to a plain read_committed consumer, sent -> fetched, nothing in between.
    Measured as matcher's is: the first WARM_UP_S of events at the rate are not counted."""
    topic = await env.topic("events")
    warm = int(rate * WARM_UP_S)
    events = signed_events(1 + warm + int(rate * seconds))
    producer = PacedProducer(env.kafka, topic)
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=env.kafka, group_id=None, auto_offset_reset="earliest",
        isolation_level="read_committed",
    )  # fmt: skip
    try:
        await consumer.start()
    except BaseException:
        producer.close()
        raise
    fetched: dict[bytes, float] = {}
    first_fetched, all_fetched = asyncio.Event(), asyncio.Event()

    async def read() -> None:
        while True:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                now = time.time()
                for r in records:
                    fetched[r.key] = now
            first_fetched.set()
            if len(fetched) >= len(events):
                all_fetched.set()

    reader = asyncio.create_task(read())
    try:
        first = events[0]
        await producer.send_now(first)
        async with asyncio.timeout(60):
            while first[1] not in fetched:
                first_fetched.clear()
                await first_fetched.wait()
        sent = await producer.paced(events[1:], rate)
        await asyncio.wait_for(all_fetched.wait(), 60)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        producer.close()
        await consumer.stop()
    keys = {c: k for c, k, *_ in events}
    return _percentiles([fetched[keys[c]] - at for c, at in list(sent.items())[warm:]])


def r_dbos(env: Env, count: int) -> float:
    url = env.fresh_db()
    out = subprocess.run(
        [sys.executable, "-m", "bench.dbos_peer", url, str(count)],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return count / float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


class PeerFailed(Exception):
    """A peer's process failed or timed out; the message says how (for the notes)."""


def _run_peer(module: str, args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``python -m module args`` in a process group of its own and return the JSON of
    its last line. On timeout the whole group (the peer's servers too) is stopped."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, errors = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.communicate(timeout=30)
                break
            except subprocess.TimeoutExpired:
                continue
        raise PeerFailed(f"still running after {timeout:.0f}s, stopped") from None
    finally:
        # Whatever the peer left behind in its group (it stops its servers itself).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    lines = out.strip().splitlines()
    if process.returncode != 0 or not lines:
        tail = (errors.strip().splitlines() or ["no output"])[-1]
        raise PeerFailed(f"exited {process.returncode}: {tail[-500:]}")
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except ValueError as exc:
        raise PeerFailed(f"printed no JSON: {lines[-1][-200:]}") from exc
    return result


def _measure_peers(plan: Plan, results: Results, step: Step) -> None:
    """Each peer in its own process, one after the other, on this machine while Kafka and
    Postgres idle. A peer that cannot run leaves its figures null, with a note saying why."""
    if not plan.peer_n:
        results.notes.append("temporal, restate: not measured (this plan runs no peers)")
        return
    for name, (module, _figures) in PEERS.items():
        workdir = Path(tempfile.mkdtemp(prefix=f"matcher-bench-{name}-"))
        args = [
            "--n", str(plan.peer_n), "--reps", str(plan.reps),
            "--rates", ",".join(str(r) for r in plan.rates),
            "--latency-s", str(plan.peer_latency_s), "--workdir", str(workdir),
        ]  # fmt: skip
        started = time.monotonic()
        try:
            out = _run_peer(module, args, PEER_TIMEOUT_S)
        except PeerFailed as exc:
            out = {"unavailable": str(exc)}
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            results.phase_seconds[f"peer {name}"] = round(time.monotonic() - started, 1)
        if "unavailable" in out:
            why = out["unavailable"]
            console.print(f"[yellow]{name} not measured, its figures are null:[/] {why}")
            results.notes.append(f"{name}: not measured: {why}")
        else:
            results.runs.update(out["runs"])
            results.notes.extend(out.get("notes", []))
        step(f"peer {name}")
    results.notes.append(PEER_NOTE)


PEER_NOTE = (
    "temporal, restate: measured after matcher's figures, one peer at a time, with Kafka and"
    " Postgres idle beside them; each peer's throughput is N waits resumed by N events sent"
    " CONCURRENCY (64) at a time, timed from the first event sent to the last workflow"
    " completed by the peer server's own clock; latency is one run per rate (event sent ->"
    " workflow completed). Temporal: `temporal server start-dev` (SQLite in a file) and the"
    " temporalio worker in the load generator's process; Restate: restate-server (single node,"
    " RocksDB) and the restate-sdk service over HTTP/2 (hypercorn), runs suspended before"
    " their events arrive."
)


WRITE_PATH_MISSING = {
    "pg_stat_statements": "write_path: server_us_per_event not measured (pg_stat_statements"
    " could not be created in the benchmark's databases: the server must preload it, and"
    " the role create it)",
    "pg_walinspect": "write_path: wal_records_per_event, wal_bytes_per_event and"
    " wal_fpi_bytes_per_event not measured (pg_walinspect could not be created in the"
    " benchmark's databases, or the role may not read the WAL); wal_lsn_bytes_per_event is"
    " measured all the same",
}


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


@dataclass
class Workload:
    """The signed events on their topics, produced once and read by every measurement."""

    events: list[SignedEvent]
    topic: str
    naive_events: list[SignedEvent]  # a prefix of ``events``: the naive design is slow
    naive_topic: str
    records: list[Any]  # as a consumer sees them, for the no-Kafka measurement
    scale_events: list[SignedEvent]  # ``events`` itself unless the plan asks for more
    scale_topic: str


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


async def _prepare_workload(env: Env, plan: Plan) -> Workload:
    events = signed_events(plan.n)
    topic = await env.topic("events")
    await produce_all(env, topic, events)
    naive_events = events[: plan.naive_n]
    naive_topic = await env.topic("events")
    await produce_all(env, naive_topic, naive_events)
    records: list[Any] = []
    await consume(env, topic, plan.n, lambda _c, rs: _collect(records, rs))
    scale_events, scale_topic = events, topic
    if plan.scale_events != plan.n:
        scale_events = signed_events(plan.scale_events)
        scale_topic = await env.topic("events")
        await produce_all(env, scale_topic, scale_events)
    return Workload(events, topic, naive_events, naive_topic, records, scale_events, scale_topic)


async def _throughput_repetition(
    env: Env, plan: Plan, work: Workload, runs: dict[str, list[float]]
) -> None:
    """One of every throughput figure, appended to ``runs``."""
    runs.setdefault("r_kafka", []).append(await r_kafka(env, work.topic, plan.n))
    runs.setdefault("r_pg", []).append(await r_pg(env, work.records))
    pipe_cpu: CpuUse = {}
    pipe_wal: dict[str, float] = {}
    runs.setdefault("r_pipe", []).append(
        await r_pipe(env, work.topic, plan.n, pipe_cpu, wal_use=pipe_wal)
    )
    write_path.record(runs, "pipe", pipe_wal)
    runs.setdefault("r_naive", []).append(
        await r_naive(env, work.naive_topic, work.naive_events, plan.naive_n)
    )
    matcher_cpu: CpuUse = {}
    kept: dict[str, str] = {}
    matcher_wal: dict[str, float] = {}
    rate, rss = await r_matcher(
        env, work.topic, work.events, cpu_use=matcher_cpu, kept=kept, wal_use=matcher_wal
    )
    runs.setdefault("r_matcher", []).append(rate)
    write_path.record(runs, "matcher", matcher_wal)
    worker_rate = await r_worker(env, kept["url"], kept["resumes"], len(work.events))
    runs.setdefault("r_worker", []).append(worker_rate)
    fan_in_rate, _ = await r_matcher(env, work.topic, work.events, fan_in=True)
    runs.setdefault("r_matcher_fan_in", []).append(fan_in_rate)
    for name, use in (("pipe", pipe_cpu), ("matcher", matcher_cpu)):
        for process, us in use.items():
            runs.setdefault(f"cpu_{name}_{process}_us_per_event", []).append(us)
    runs.setdefault("rss_bytes", []).append(float(rss))
    runs.setdefault("r_dbos", []).append(r_dbos(env, plan.dbos_n))
    for daemons in (2, 3):
        rate, rss = await r_matcher(env, work.topic, work.events, daemons=daemons)
        runs.setdefault(f"r_matcher_{daemons}_daemons", []).append(rate)
        runs["rss_bytes"].append(float(rss))


async def _measure_throughput(
    env: Env, plan: Plan, work: Workload, runs: dict[str, list[float]], step: Step
) -> None:
    # Warm-up (not recorded), then the repetitions, interleaved so drift hits all alike.
    await r_kafka(env, work.topic, plan.n)
    await r_matcher(env, work.topic, work.events[: plan.n // 4])
    for _ in range(plan.reps):
        await _throughput_repetition(env, plan, work, runs)
        step(f"throughput, repetition {len(runs['r_kafka'])} of {plan.reps}")


async def _measure_rf3(env: Env, plan: Plan, work: Workload, results: Results, step: Step) -> None:
    """r_matcher and r_kafka again on a private 3-broker cluster, with the same events,
    repetitions and method (a warm-up, then medians), as r_matcher_kafka_rf3 and
    r_kafka_rf3: what Kafka's replication costs end to end. A cluster that does not start
    leaves them null, with a note saying why; the run goes on."""
    if not plan.rf3:
        results.notes.append("r_matcher_kafka_rf3: not measured (this plan starts no cluster)")
        return
    started = time.monotonic()
    progressed = 0
    try:
        with private_cluster() as bootstrap, env.kafka_at(bootstrap):
            progressed += 1
            step(f"3-broker cluster up in {time.monotonic() - started:.0f}s")
            topic = await env.topic("events")
            replicas, min_insync = await replication(bootstrap, topic, PARTITIONS)
            await produce_all(env, topic, work.events)
            await r_kafka(env, topic, plan.n)
            await r_matcher(env, topic, work.events[: plan.n // 4])
            for rep in range(plan.reps):
                results.runs.setdefault("r_kafka_rf3", []).append(await r_kafka(env, topic, plan.n))
                rate, _rss = await r_matcher(env, topic, work.events)
                results.runs.setdefault("r_matcher_kafka_rf3", []).append(rate)
                progressed += 1
                step(f"3-broker cluster, repetition {rep + 1} of {plan.reps}")
    except ClusterUnavailable as exc:
        console.print(f"[yellow]no 3-broker cluster, its figures are null:[/] {exc}")
        results.notes.append(
            f"r_matcher_kafka_rf3: not measured, the 3-broker cluster did not start: {exc}"
        )
        for _ in range(1 + plan.reps - progressed):
            step("3-broker cluster: not measured")
        return
    results.notes.append(
        f"r_matcher_kafka_rf3, r_kafka_rf3: on a private cluster of {bootstrap.count(',') + 1}"
        f" brokers and a dedicated controller on this machine, the topics with {replicas}"
        f" replicas and min.insync.replicas={min_insync} (producers and the daemon use"
        " acks=all); Postgres is the same single server (no standby) as for r_matcher, so"
        " matcher_rf3_over_single isolates Kafka's replication. Measured after the"
        " single-broker figures, not interleaved with them; the cluster's idle Postgres runs"
        " beside it, unused."
    )


async def _measure_latency(
    env: Env, plan: Plan, results: Results, samples: dict[str, list[float]], step: Step
) -> None:
    """Latency percentiles at each of the plan's rates, of the whole path and of its
    stages, beside the Kafka floor at the same rate; the last repetition's samples kept
    for the plot, and a note for each rate at which a window fell behind or began behind
    (bench.drift)."""
    runs, notes = results.runs, results.notes
    for rate in plan.rates:
        if warmed := await _warm_broker(env, rate, plan.warm_windows):
            notes.append(jit.warm_up_note(rate, warmed, plan.warm_windows))
            runs[f"warm_up_windows_{rate}"] = [float(len(warmed))]
        elif plan.warm_windows:
            notes.append(
                f"latency at {rate}/s: measured without a warm-up for the broker's JIT"
                " compiler, which could not be read (no HotSpot JVM found on this machine"
                " listening on the broker's port, or its process not readable by this user)"
            )
        # Matcher's windows alternate with the pipe's floor (bench.pipe), so that each
        # pair sees the same machine: it is not the same from one minute to the next.
        found, floors = [], []
        for _ in range(plan.reps):
            found.append(await latency(env, rate, plan.latency_s))
            floors.append(await pipe_latency(env, rate, plan.latency_s))
        _record_windows(runs, f"latency_{rate}", f"cpu_latency_{rate}", found)
        _record_windows(runs, f"latency_pipe_{rate}", f"cpu_latency_pipe_{rate}", floors)
        notes += _floor_notes(rate, floors)
        for _ in range(plan.reps):
            floor = await kafka_latency(env, rate, min(plan.latency_s, FLOOR_S))
            for k, v in floor.items():
                runs.setdefault(f"latency_kafka_{rate}_{k}_ms", []).append(v)
        if rate == plan.rates[0]:  # the resume worker beside the daemon, at the first rate
            for _ in range(plan.reps):
                figures = await worker_latency(env, rate, plan.latency_s)
                for k, v in figures.items():
                    runs.setdefault(f"worker_latency_{rate}_{k}", []).append(v)
        samples[str(rate)] = found[-1]["samples_ms"]
        notes += drift.behind_notes(
            rate, [f["drift_ms"] for f in found], [f["p50_ms"] for f in found]
        )
        lost = sum(f["sent"] - f["received"] for f in found)
        if lost:
            raise RuntimeError(f"{lost} resumes missing at {rate}/s")
        step(f"latency at {rate}/s")


def _record_windows(
    runs: dict[str, list[float]], prefix: str, cpu_prefix: str, found: list[dict[str, Any]]
) -> None:
    """Each window's figures as runs (``<prefix>_<figure>``), its processes' cores too."""
    for k in found[0]:
        if (k.endswith("_ms") and k != "samples_ms") or k.endswith("_pct"):
            runs.setdefault(f"{prefix}_{k}", []).extend(f[k] for f in found if k in f)
    for f in found:
        for process, cores in f["cpu_cores"].items():
            runs.setdefault(f"{cpu_prefix}_{process}_cores", []).append(cores)


def _floor_notes(rate: int, floors: list[dict[str, Any]]) -> list[str]:
    """A note when the pipe's own p99 missed matcher's latency target at ``rate``: that
    minute, a loop doing far less than matcher missed it too."""
    target = LATENCY_TARGETS_MS.get(rate)
    if target is None:
        return []
    missed = [f"{f['p99_ms']:.1f}" for f in floors if f["p99_ms"] > target]
    if not missed:
        return []
    return [
        f"latency at {rate}/s: the pipe's floor (bench/pipe.py) read a p99 over the"
        f" {target:.0f} ms target in {len(missed)} of {len(floors)} windows"
        f" ({', '.join(missed)} ms): on that machine, a loop that only stores and"
        " republishes each event missed it too"
    ]


async def _warm_broker(env: Env, rate: int, most: int) -> list[float]:
    """Unrecorded latency windows at ``rate`` until one finds the broker's JIT compiler
    settled (bench/jit.py), at most ``most`` of them; the compiler's share of a core in
    each. None are run when the compiler cannot be read (see jit.broker_jvm)."""
    shares: list[float] = []
    while env.broker_jvm is not None and len(shares) < most:
        share = (await latency(env, rate, jit.WARM_WINDOW_S)).get("kafka_jit_pct")
        if share is None:
            break  # the broker went out of reach: measure as it is
        shares.append(share)
        if jit.settled(share):
            break
    return shares


def scale_order(rows: int, rep: int) -> tuple[int, int]:
    """The two throughput runs of a repetition at ``rows`` stored, the empty database's and
    the stored one's, in alternating order: a machine that drifts (it does, by tens of
    per cent within a run) then favours neither, as it did when every empty run came
    first and the 10M-row runs half an hour later."""
    return (0, rows) if rep % 2 == 0 else (rows, 0)


async def _measure_scale(
    env: Env, plan: Plan, work: Workload, results: Results, step: Step
) -> None:
    """Throughput and p99 latency with each of the plan's numbers of waits already stored.
    Each throughput run at a size is paired with one on an empty database beside it, and
    ``scale_<rows>_over_0`` is the median of the pairs' ratios (their spread in
    ``ratio_runs``); ``scale_0_r_matcher`` is the median of all the empty runs."""
    runs = results.runs
    for rows in plan.scale:
        if rows:
            for rep in range(plan.reps):
                rate: dict[int, float] = {}
                for size in scale_order(rows, rep):
                    rate[size], _rss = await r_matcher(
                        env, work.scale_topic, work.scale_events, preload_rows=size
                    )
                runs.setdefault("scale_0_r_matcher", []).append(rate[0])
                runs.setdefault(f"scale_{rows}_r_matcher", []).append(rate[rows])
                results.ratio_runs.setdefault(f"scale_{rows}_over_0", []).append(
                    rate[rows] / rate[0]
                )
        step(f"scale {rows:,}: throughput")
        found = [
            await latency(env, plan.rates[0], plan.latency_s, preload_rows=rows)
            for _ in range(plan.reps)
        ]
        runs.setdefault(f"scale_{rows}_p99_ms", []).extend(f["p99_ms"] for f in found)
        # Beside each p99, how long the disk held every task up in the same window.
        stalled = [f["io_stall_ms"] for f in found if "io_stall_ms" in f]
        if stalled:
            runs.setdefault(f"scale_{rows}_io_stall_ms", []).extend(stalled)
        env.drop_preloaded()  # a 10M-row template is gigabytes of disk
        step(f"scale {rows:,}: latency")


RF3_FIGURES = ("r_matcher_kafka_rf3", "r_kafka_rf3")


def _figures(runs: dict[str, list[float]], samples: dict[str, list[float]]) -> dict[str, Any]:
    figures: dict[str, Any] = {
        k: _median(v) for k, v in runs.items() if not k.startswith("write_path_")
    }
    figures["rss_peak_bytes"] = max(runs["rss_bytes"])
    for name in RF3_FIGURES:  # null when the cluster was not measured
        figures.setdefault(name, None)
    for _module, names in PEERS.values():  # null when the peer did not run
        for name in names:
            figures.setdefault(name, None)
    figures["latency_samples_ms"] = samples
    return figures


def _ratios(
    plan: Plan, figures: dict[str, Any], paired: dict[str, list[float]]
) -> dict[str, float]:
    """The ratios of medians; at scale and of the latency floor, the median of the paired
    runs' ratios."""
    m = figures["r_matcher"]
    return {
        "matcher_over_pipe": m / figures["r_pipe"],
        "matcher_over_min_kafka_pg": m / min(figures["r_kafka"], figures["r_pg"]),
        "matcher_over_naive": m / figures["r_naive"],
        "matcher_over_dbos": m / figures["r_dbos"],
        "worker_over_matcher": figures["r_worker"] / m,
        "fan_in_over_matcher": figures["r_matcher_fan_in"] / m,
        "matcher_2_daemons_over_1": figures["r_matcher_2_daemons"] / m,
        "matcher_3_daemons_over_1": figures["r_matcher_3_daemons"] / m,
        **{
            f"scale_{rows}_over_0": _median(paired[f"scale_{rows}_over_0"])
            for rows in plan.scale
            if rows
        },
        # How far matcher's tail is above the pipe's floor on the same machine (bench.pipe),
        # the median of the pairs of windows (_ratio_runs: only rates the floor was run at).
        **{
            name: _median(pairs)
            for name, pairs in paired.items()
            if name.endswith("_p99_over_pipe")
        },
    }


def _peer_ratios(plan: Plan, figures: dict[str, Any]) -> dict[str, float | None]:
    """r_matcher over each peer's throughput, and each peer's p99 over matcher's at each
    rate; null where the peer was not measured."""
    out: dict[str, float | None] = {}
    m = figures["r_matcher"]
    for _module, names in PEERS.values():
        for name in names:
            peer = figures.get(name)
            out[f"matcher_over_{name.removeprefix('r_')}"] = None if not peer else m / peer
    for peer in PEERS:
        for rate in plan.rates:
            theirs = figures.get(f"{peer}_latency_{rate}_p99_ms")
            ours = figures.get(f"latency_{rate}_p99_ms")
            key = f"{peer}_p99_over_matcher_{rate}"
            out[key] = None if theirs is None or not ours else theirs / ours
    return out


def _rf3_ratio(figures: dict[str, Any]) -> float | None:
    """r_matcher on the 3-broker cluster over r_matcher on the single broker (medians)."""
    rf3 = figures["r_matcher_kafka_rf3"]
    return None if rf3 is None else float(rf3 / figures["r_matcher"])


def _ratio_runs(runs: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each repetition's ratio: the n-th cluster figure over the n-th single-broker one,
    and the p99 of matcher's n-th latency window over the pipe's window beside it."""
    pairs = zip(runs.get("r_matcher_kafka_rf3", []), runs["r_matcher"], strict=False)
    rf3 = [cluster / single for cluster, single in pairs]
    out = {"matcher_rf3_over_single": rf3} if rf3 else {}
    for key, floors in runs.items():
        if key.startswith("latency_pipe_") and key.endswith("_p99_ms"):
            rate = key.removeprefix("latency_pipe_").removesuffix("_p99_ms")
            pairs = zip(runs[f"latency_{rate}_p99_ms"], floors, strict=True)
            out[f"latency_{rate}_p99_over_pipe"] = [ours / floor for ours, floor in pairs]
    return out


def _targets(plan: Plan, figures: dict[str, Any], ratios: dict[str, float]) -> dict[str, bool]:
    """The targets on a 2-core machine; a peer's target is unmet when it was not measured."""
    biggest = max(plan.scale)
    rate = plan.rates[0]
    ours = figures["r_matcher"]

    def times(peer: float | None, factor: float) -> bool:
        return peer is not None and ours >= factor * peer

    restate = [figures.get(n) for n in ("r_restate", "r_restate_awakeable")]
    fastest_restate = max((r for r in restate if r is not None), default=None)
    scale_p99 = figures.get(f"scale_{biggest}_p99_ms", 1e9)
    return {
        "r_matcher >= 0.7 x r_pipe": ratios["matcher_over_pipe"] >= 0.7,
        "r_matcher >= 0.35 x min(r_kafka, r_pg)": ratios["matcher_over_min_kafka_pg"] >= 0.35,
        "r_matcher >= 10 x r_naive": ratios["matcher_over_naive"] >= 10,
        "r_matcher >= 30 x r_dbos": ratios["matcher_over_dbos"] >= 30,
        "r_worker >= 0.5 x r_matcher": ratios["worker_over_matcher"] >= 0.5,
        "r_matcher >= 100 x r_temporal": times(figures.get("r_temporal"), 100),
        "r_matcher >= 15 x r_restate (its faster mode)": times(fastest_restate, 15),
        **{
            f"p99 <= {target:.0f} ms at {rate}/s": figures.get(f"latency_{rate}_p99_ms", 1e9)
            <= target
            for rate, target in LATENCY_TARGETS_MS.items()
        },
        f"r_matcher with {biggest:,} rows >= 0.8 x empty": (
            ratios.get(f"scale_{biggest}_over_0", 0.0) >= 0.8  # unmet when not measured
        ),
        f"p99 at {rate}/s with {biggest:,} rows <= 2 x empty": (
            scale_p99 <= 2 * figures.get("scale_0_p99_ms", 0)
        ),
        "daemon peak RSS <= 150 MB": figures["rss_peak_bytes"] <= 150 * 1024 * 1024,
    }


@contextlib.asynccontextmanager
async def _timed(phases: dict[str, float], name: str) -> AsyncIterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        phases[name] = round(time.monotonic() - started, 1)


async def run(plan: Plan, out_dir: Path) -> Path:
    env = Env()
    env.setup()
    results = Results(plan=asdict(plan), machine=_machine())
    samples: dict[str, list[float]] = {}
    try:
        with Progress(console=console, transient=False) as progress:
            task = progress.add_task("benchmark", total=plan.steps())

            def step(text: str) -> None:
                progress.update(task, advance=1, description=text)

            phases = results.phase_seconds
            async with _timed(phases, "prepare"):
                work = await _prepare_workload(env, plan)
            async with _timed(phases, "throughput"):
                await _measure_throughput(env, plan, work, results.runs, step)
            async with _timed(phases, "rf3"):
                await _measure_rf3(env, plan, work, results, step)
            async with _timed(phases, "latency"):
                await _measure_latency(env, plan, results, samples, step)
            async with _timed(phases, "scale"):
                await _measure_scale(env, plan, work, results, step)
            async with _timed(phases, "peers"):
                _measure_peers(plan, results, step)
    finally:
        await env.cleanup()

    results.figures = _figures(results.runs, samples)
    results.ratio_runs.update(_ratio_runs(results.runs))
    ratios = _ratios(plan, results.figures, results.ratio_runs)
    results.targets = _targets(plan, results.figures, ratios)
    results.ratios = {
        **ratios,
        "matcher_rf3_over_single": _rf3_ratio(results.figures),
        **_peer_ratios(plan, results.figures),
    }
    results.write_path = write_path.summary(results.runs, _median)
    results.write_path_targets = write_path.targets(
        results.write_path, ratios.get("matcher_over_pipe")
    )
    results.notes += [
        WRITE_PATH_MISSING[name] for name, usable in env.extensions.items() if not usable
    ]
    from bench.report import write_reports

    return write_reports(results.__dict__, out_dir)


async def _collect(into: list[Any], records: list[Any]) -> None:
    into.extend(records)


class _NewTopicNoise(logging.Filter):
    """Drops the fetcher's NOT_LEADER error for a topic created an instant before: the
    resume consumer starts while the broker still elects the new partitions' leaders (its
    metadata already names one), retries, and loses nothing; the latency run checks that
    every resume arrived."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.getMessage().startswith("Failed fetch offsets")
            and "NotLeaderForPartitionError" in record.getMessage()
        )


def main() -> None:
    logging.getLogger("aiokafka.consumer.fetcher").addFilter(_NewTopicNoise())
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer events and a smaller scale (about 5 minutes with the peers)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny: proves the harness works")
    parser.add_argument(
        "--out", default=None, help="results directory (default bench/results/<time>)"
    )
    parser.add_argument(
        "--reps", type=int, default=None, help="repetitions per figure (at least 3)"
    )
    args = parser.parse_args()
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.reps:
        plan.reps = max(3, args.reps)
    out = Path(args.out or f"bench/results/{time.strftime('%Y%m%d-%H%M%S')}")
    path = asyncio.run(run(plan, out))
    print(path)


if __name__ == "__main__":
    main()
