"""Attacks on the real daemon, black box: forged attributes, poison records, replays after
downtime, forged resumes, worker transactions, and the smaller ways in.

Every test runs the real daemon against real Kafka and Postgres with a producers file and
signatures required, and is bounded in time: a daemon that hangs or crash-loops fails the
test, it never hangs it. The assertions are about behaviour (what resolved, what was
stored, what was quarantined), not about reason codes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from matcher_producer import CompletionEvent as ProducerEvent
from matcher_producer import KafkaRecord, SigningKey, encode, sign_record
from prometheus_client import REGISTRY
from psycopg import sql as pgsql
from psycopg.rows import dict_row
from psycopg.types.json import JsonLoader

from matcher.config import ConfigError, Settings, load_settings
from matcher.daemon.app import StartupError
from matcher.domain.waits import WaitSpec
from matcher.kafka.topics import delete_topics, ensure_topics
from matcher.sdk import (
    LaunchSpec,
    advance,
    cancel_wait,
    parse_resume,
    record_job_id,
    record_launch,
    register_wait,
)
from matcher.store.maintenance import _forget_day_ids
from tests.support.assertions import env_flag, eventually
from tests.support.db import rows, scalar
from tests.support.kafka import produce_raw, read_resume_messages, read_resumes, started, within
from tests.support.processes import DaemonProcess, process_env, run_cli, running_daemon
from tests.support.records import RawHeaderName

K1 = "whsec_" + base64.b64encode(b"k1-secret-of-the-billing-service").decode()
K2 = "whsec_" + base64.b64encode(b"k2-secret-of-the-billing-service").decode()
TYPES = ["job.completed", "job.failed"]
Message = tuple[bytes | None, list[tuple[str, bytes]], bytes]


def _producers_file(directory: Path, keys: dict[str, str] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "producers.toml"
    key_lines = "\n".join(
        f'[[producers."billing-svc".keys]]\nid = "{k}"\nhmac_secret = "{v}"'
        for k, v in (keys or {"k1": K1}).items()
    )
    path.write_text(
        f"""
[producers."billing-svc"]
tenants = ["acme", "other"]
types = ["job.completed", "job.failed"]
{key_lines}
"""
    )
    return path


@pytest.fixture
def secure(settings: Settings, tmp_path: Path) -> Settings:
    return settings.model_copy(
        update={
            "allow_unsigned": False,
            "producers_file": _producers_file(tmp_path),
            "max_event_bytes": 8192,
        }
    )


def _hex() -> str:
    return uuid.uuid4().hex[:10]


def _signed(
    *, structured: bool = False, timestamp: int | None = None, key: str = K1, **fields: Any
) -> tuple[ProducerEvent, KafkaRecord]:
    """A validly signed record of billing-svc (tenant acme unless told otherwise)."""
    values: dict[str, Any] = {
        "source": "billing-svc",
        "type": "job.completed",
        "tenant": "acme",
        "correlation_id": f"c-{_hex()}",
        "data": {"rows": 7},
    }
    values.update(fields)
    event = ProducerEvent(**values)
    record = sign_record(
        encode(event, structured=structured), event.id, [SigningKey.parse("k1", key)], timestamp
    )
    return event, record


def _message(record: KafkaRecord, key: bytes | None = None) -> Message:
    return (record.key if key is None else key, list(record.headers), record.value)


def _url(settings: Settings) -> str:
    return settings.database_url.get_secret_value()


def _spec(
    tenant: str,
    correlation_id: str,
    types: list[str] | None = None,
    *,
    run_id: str | None = None,
    position: int = 0,
) -> WaitSpec:
    return WaitSpec(
        id=uuid.uuid4(),
        tenant=tenant,
        run_id=run_id or f"run-{_hex()}",
        position=position,
        event_types=types or TYPES,
        correlation_id=correlation_id,
    )


def _wait(settings: Settings, spec: WaitSpec) -> str:
    with psycopg.connect(_url(settings), autocommit=True) as conn:
        return str(register_wait(conn, spec).id)


def _state(settings: Settings, wait_id: str) -> str | None:
    state = scalar(settings, "SELECT state FROM matcher.waits WHERE id = %s", [wait_id])
    return None if state is None else str(state)


def _resolved(settings: Settings, wait_id: str) -> bool:
    return _state(settings, wait_id) not in (None, "waiting")


def _outbox_rows(settings: Settings, wait_id: str) -> int:
    return int(
        scalar(settings, "SELECT count(*) FROM matcher.resolutions WHERE wait_id = %s", [wait_id])
    )


def _inbox(settings: Settings, event_id: str) -> list[dict[str, Any]]:
    return rows(
        settings,
        "SELECT tenant, type, correlation_id, external_job_id, kafka_partition, kafka_offset"
        " FROM matcher.inbox WHERE event_id = %s",
        [event_id],
    )


def _quarantined_at(settings: Settings, topic: str, partition: int, offset: int) -> int:
    return int(
        scalar(
            settings,
            "SELECT count(*) FROM matcher.quarantine"
            " WHERE kafka_topic = %s AND kafka_partition = %s AND kafka_offset = %s",
            [topic, partition, offset],
        )
    )


def _quarantined_with_key(settings: Settings, key: bytes) -> int:
    return int(
        scalar(settings, "SELECT count(*) FROM matcher.quarantine WHERE kafka_key = %s", [key])
    )


def _alive_and(task: asyncio.Task[None], check: Callable[[], bool]) -> Callable[[], bool]:
    """For ``eventually``: stop waiting as soon as the daemon has stopped, too."""
    return lambda: task.done() or check()


async def _reached(check: Callable[[], bool], timeout: float) -> bool:
    """Whether ``check`` holds within ``timeout`` (for a failure message of one's own)."""
    try:
        await eventually(check, timeout=timeout)
    except AssertionError:
        return False
    return True


def _rejected_total() -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "matcher_events_rejected":
            total += sum(
                s.value for s in metric.samples if s.name == "matcher_events_rejected_total"
            )
    return total


async def _raw_resumes(settings: Settings, run_id: str, timeout: float = 60) -> list[bytes]:
    """The resume messages of ``run_id`` exactly as published (bytes), from the beginning."""

    def of_run(value: bytes) -> bool:
        return bool(json.loads(value)["data"]["run_id"] == run_id)

    return await read_resume_messages(settings, at_least=1, timeout=timeout, keep=of_run)


async def _send_batch(
    settings: Settings,
    key: bytes,
    records: Sequence[tuple[list[tuple[str, bytes]], bytes | None]],
    compression: int = 0,
    *,
    keyless: bool = False,
) -> tuple[int, int]:
    """Send (headers, value) records as ONE record batch, built by aiokafka's pure-Python
    builder (which writes a ``RawHeaderName`` as its raw bytes, compresses as told: 1 is
    gzip, and, unlike ``send``, writes a record with no key and no value), to the
    partition the default partitioner gives ``key``; ``keyless``: the records carry no
    key. Return the (partition, offset) of its first record."""
    producer = AIOKafkaProducer(**settings.kafka_client_options(), acks="all")
    async with started(producer):
        partitions = sorted(await within(producer.partitions_for(settings.events_topic)))
        partition = DefaultPartitioner()(key, partitions, partitions)
        batch = producer.create_batch()
        batch._builder = _DefaultRecordBatchBuilderPy(
            magic=2,
            compression_type=compression,
            is_transactional=0,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=0,
            batch_size=64 * 1024 * 1024,
        )
        for headers, value in records:
            written = None if keyless else key
            assert (
                batch.append(timestamp=None, key=written, value=value, headers=headers) is not None
            )
        queued = await within(
            producer.send_batch(batch, settings.events_topic, partition=partition)
        )
        sent = await within(queued)
        return int(sent.partition), int(sent.offset)


# --- 1. Header case ----------------------------------------------------------------------

# The added header, and the wait the forgery would resolve (tenant, correlation, types):
# "A" and "B" stand for this test's two correlation ids.
HEADER_CASE_FORGERIES: dict[str, tuple[str, str, tuple[str, str, list[str]] | None]] = {
    "correlation": ("CE_CORRELATIONID", "B", ("acme", "B", TYPES)),
    "type": ("Ce_type", "job.failed", ("acme", "A", ["job.failed"])),
    "jobid": ("CE_JOBID", "forged", None),
    "tenant": ("CE_TENANT", "other", ("other", "A", TYPES)),
}


@pytest.mark.parametrize("forgery", list(HEADER_CASE_FORGERIES))
async def test_header_case_does_not_defeat_binary_signatures(
    secure: Settings, forgery: str
) -> None:
    """Attack: the binary-mode signature covers the exact-case ``ce_*`` headers, but the
    parser reads header names case-insensitively (the last one wins). A copy of a validly
    signed record with an added ``CE_CORRELATIONID``/``Ce_type``/``CE_JOBID``/``CE_TENANT``
    keeps a valid signature while the event says something else. Sent before the genuine
    record (same event id), it must neither resolve the forged target nor displace the
    genuine event."""
    async with asyncio.timeout(120):
        name, forged, target_spec = HEADER_CASE_FORGERIES[forgery]
        ids = {"A": f"a-{_hex()}", "B": f"b-{_hex()}"}
        event, record = _signed(correlation_id=ids["A"], job_id="job-genuine")
        # For the type forgery, A takes only the genuine type and the target only the forged.
        types_a = ["job.completed"] if forgery == "type" else TYPES
        spec_a = _spec("acme", ids["A"], types_a)
        wait_a = _wait(secure, spec_a)
        target = None
        if target_spec is not None:
            tenant, correlation, types = target_spec
            target = _wait(secure, _spec(tenant, ids[correlation], types))
        value = ids.get(forged, forged).encode()
        tampered: Message = (record.key, [*record.headers, (name, value)], record.value)

        async with running_daemon(secure) as task:
            await produce_raw(secure, [tampered, _message(record)])
            await eventually(
                _alive_and(
                    task,
                    lambda: (
                        _resolved(secure, wait_a)
                        or (target is not None and _resolved(secure, target))
                    ),
                ),
                timeout=60,
                what="the genuine wait (or the forged target) resolved",
            )
            assert not task.done(), "the daemon stopped"
            if target is not None:
                assert _state(secure, target) == "waiting", f"the forged {name} resolved a wait"
            await eventually(
                _alive_and(task, lambda: _resolved(secure, wait_a)),
                timeout=30,
                what="the genuine wait resolved",
            )
            assert _state(secure, wait_a) == "matched"
            # The tampered copy came first on the same partition: it has been judged.
            if target is not None:
                assert _state(secure, target) == "waiting", f"the forged {name} resolved a wait"
            resumes = await read_resumes(secure, at_least=1)

        stored = [
            {k: r[k] for k in ("tenant", "type", "correlation_id", "external_job_id")}
            for r in _inbox(secure, event.id)
        ]
        assert stored == [
            {
                "tenant": "acme",
                "type": "job.completed",
                "correlation_id": ids["A"],
                "external_job_id": "job-genuine",
            }
        ]
        mine = [r for r in resumes if r.run_id == spec_a.run_id]
        assert len(mine) == 1
        assert mine[0].event is not None
        assert mine[0].event.id == event.id
        assert mine[0].event.type == "job.completed"
        assert mine[0].event.external_job_id == "job-genuine"


# --- 2. Mode confusion -------------------------------------------------------------------


async def test_ce_headers_on_a_structured_record_forge_nothing(secure: Settings) -> None:
    """Attack: a structured-mode record is signed over its value only; ``ce_*`` headers
    added to a validly signed one are outside the signature, yet the CloudEvents SDK reads
    any record with a ``ce_`` header in binary mode, attributes from the headers. The copy
    (``ce_id`` = the genuine id, ``ce_source`` = its producer, and forged tenant, type,
    correlation id and job id) must be quarantined, and the genuine record must resolve
    its own wait."""
    async with asyncio.timeout(120):
        a, b = f"a-{_hex()}", f"b-{_hex()}"
        event, record = _signed(structured=True, correlation_id=a, job_id="job-genuine")
        spec_a = _spec("acme", a)
        wait_a = _wait(secure, spec_a)
        target = _wait(secure, _spec("other", b))
        forged_headers = [
            ("ce_source", b"billing-svc"),
            ("ce_id", event.id.encode()),
            ("ce_tenant", b"other"),
            ("ce_type", b"job.failed"),
            ("ce_correlationid", b.encode()),
            ("ce_jobid", b"forged"),
        ]
        key = f"mode-{_hex()}".encode()
        tampered: Message = (key, [*record.headers, *forged_headers], record.value)

        async with running_daemon(secure) as task:
            await produce_raw(secure, [tampered, _message(record, key)])
            await eventually(
                _alive_and(task, lambda: _resolved(secure, wait_a) or _resolved(secure, target)),
                timeout=60,
                what="the genuine wait (or the forged target) resolved",
            )
            assert not task.done(), "the daemon stopped"
            assert _state(secure, target) == "waiting", "the forged headers resolved a wait"
            await eventually(
                _alive_and(task, lambda: _resolved(secure, wait_a)),
                timeout=30,
                what="the genuine wait resolved",
            )
            assert _state(secure, target) == "waiting", "the forged headers resolved a wait"
            resumes = await read_resumes(secure, at_least=1)

        stored = [
            {k: r[k] for k in ("tenant", "type", "correlation_id", "external_job_id")}
            for r in _inbox(secure, event.id)
        ]
        assert stored == [
            {
                "tenant": "acme",
                "type": "job.completed",
                "correlation_id": a,
                "external_job_id": "job-genuine",
            }
        ]
        assert _quarantined_with_key(secure, key) == 1, "the tampered copy is not quarantined"
        mine = [r for r in resumes if r.run_id == spec_a.run_id]
        assert len(mine) == 1
        assert mine[0].event is not None
        assert mine[0].event.id == event.id


# --- 3. Poison records -------------------------------------------------------------------


def _poison(kind: str) -> tuple[list[tuple[str, bytes]], bytes]:
    """Headers and value of a record meant to make the daemon raise rather than reject."""
    if kind == "deep_json":
        _, record = _signed()
        return list(record.headers), b"[" * 700 + b"]" * 700
    if kind == "huge_timestamp":
        _, record = _signed()
        headers = [(n, b"1" * 400 if n == "webhook-timestamp" else v) for n, v in record.headers]
        return headers, record.value
    if kind == "lone_surrogate":
        # json.dumps writes the lone surrogate as the six ASCII characters \udc00.
        # In the type (an attribute read back for the quarantine row) and in the data.
        _, record = _signed(structured=True, type="job.\udc00", data={"note": "\udc00"})
        assert b"\\udc00" in record.value
        return list(record.headers), record.value
    if kind == "gzip_bomb":
        return [], bytes(1024 * 1024)
    assert kind == "non_utf8_header_name"
    _, record = _signed()
    return [*record.headers, (RawHeaderName(b"\xff\xfe"), b"x")], record.value


@pytest.mark.parametrize(
    "kind", ["deep_json", "huge_timestamp", "lone_surrogate", "non_utf8_header_name", "gzip_bomb"]
)
async def test_poison_records_do_not_stop_the_daemon(secure: Settings, kind: str) -> None:
    """Attack: a record built to make the gate raise instead of reject (JSON nested 700
    deep, a 400-digit webhook-timestamp, a lone surrogate escape in the data and in an
    attribute, a header name that is not UTF-8), or a compressed batch far larger than
    its bytes on the wire. The daemon must quarantine it and go on with the next record
    of the same partition."""
    secure = secure.model_copy(update={"max_batch_bytes": 2 * 1024 * 1024})
    async with asyncio.timeout(120):
        key = f"poison-{_hex()}".encode()
        headers, value = _poison(kind)
        sentinel, sentinel_record = _signed()
        wait = _wait(secure, _spec("acme", sentinel.correlation_id))

        async with running_daemon(secure) as task:
            coordinates: tuple[int, int] | None = None
            if kind == "non_utf8_header_name":
                coordinates = await _send_batch(secure, key, [(headers, value)])
                await produce_raw(secure, [_message(sentinel_record, key)])
            elif kind == "gzip_bomb":
                # 5 MiB of zeros as one gzip batch of ~5 KiB: over the daemon's bound (2 MiB).
                bomb = [(headers, value)] * 5
                coordinates = await _send_batch(secure, key, bomb, compression=1)
                await produce_raw(secure, [_message(sentinel_record, key)])
            else:
                await produce_raw(secure, [(key, headers, value), _message(sentinel_record, key)])
            await eventually(
                _alive_and(task, lambda: _resolved(secure, wait)),
                timeout=60,
                what="the sentinel's wait resolved",
            )
            assert not task.done(), "the daemon stopped"
            assert _state(secure, wait) == "matched"
            [where] = _inbox(secure, sentinel.id)
            if coordinates is None:
                # Sent just before the sentinel, by the same producer, to the same partition.
                coordinates = (where["kafka_partition"], where["kafka_offset"] - 1)
            assert where["kafka_partition"] == coordinates[0]
            assert _quarantined_at(secure, secure.events_topic, *coordinates) == 1, (
                "the poison record is not in the quarantine"
            )
            if kind == "gzip_bomb":
                reasons = rows(secure, "SELECT reason, detail FROM matcher.quarantine")
                assert [r["reason"] for r in reasons] == ["undecodable"] * 5, reasons
            assert not task.done(), "the daemon stopped"


# --- 4. Replay window --------------------------------------------------------------------


def _judged(s: Settings) -> int:
    return int(
        scalar(
            s,
            "SELECT (SELECT count(*) FROM matcher.inbox)"
            " + (SELECT count(*) FROM matcher.quarantine)",
        )
    )


# make test scales the outage down; make campaign runs it as the issue states it (the
# daemon down 10 minutes, the tolerance 5).
OUTAGE_S = float(env_flag("MATCHER_TEST_OUTAGE_S", 8))
TOLERANCE_S = float(env_flag("MATCHER_TEST_TOLERANCE_S", 3))


# Its own bound, past the scenario's (the session default of 300 s cut the campaign's
# 10-minute outage short and failed it).
@pytest.mark.timeout(OUTAGE_S + 180)
async def test_events_signed_while_the_daemon_was_down_are_accepted(secure: Settings) -> None:
    """Attack (on availability): the signature's timestamp is judged against the clock at
    processing time, so events that waited in Kafka longer than the tolerance while the
    daemon was down are all quarantined as replays. Judged at their arrival in Kafka
    (the topic's LogAppendTime), they are fresh and must all resolve their waits."""
    async with asyncio.timeout(OUTAGE_S + 150):
        s = secure.model_copy(update={"signature_tolerance_s": TOLERANCE_S})
        signed = [_signed() for _ in range(20)]
        waits = [_wait(s, _spec("acme", e.correlation_id)) for e, _ in signed]
        await produce_raw(s, [_message(r) for _, r in signed])
        # The scenario itself, not a wait for an outcome: the daemon is down this long.
        await asyncio.sleep(OUTAGE_S)
        async with running_daemon(s) as task:
            await eventually(
                _alive_and(task, lambda: _judged(s) >= 20), timeout=60, what="all 20 judged"
            )
            await _reached(lambda: all(_resolved(s, w) for w in waits), timeout=10)
            unresolved = [w for w in waits if not _resolved(s, w)]
            reasons = rows(
                s, "SELECT reason, count(*) AS n FROM matcher.quarantine GROUP BY reason"
            )
            assert not unresolved, f"{len(unresolved)} of 20 waits unresolved; {reasons}"


async def test_a_replay_is_judged_against_the_original_arrival(
    secure: Settings, tmp_path: Path
) -> None:
    """An event signed with a key the registry lacks, read after a backlog longer than
    the tolerance, is quarantined as bad_signature; once the key is added, a replay judges
    it as of its arrival at the broker (fresh then), not as of the quarantine (late)."""
    async with asyncio.timeout(120):
        s = secure.model_copy(update={"signature_tolerance_s": 2.0})
        event, record = _signed(key=K2)  # k2 is not registered yet
        wait = _wait(s, _spec("acme", event.correlation_id))
        await produce_raw(s, [_message(record)])
        await asyncio.sleep(4)  # the backlog: longer than the tolerance
        async with running_daemon(s):
            await eventually(lambda: _judged(s) == 1, what="the event judged")
        assert scalar(s, "SELECT reason FROM matcher.quarantine") == "bad_signature"
        with_k2 = _producers_file(tmp_path / "k2", {"k1": K1, "k2": K2})
        replayed = run_cli(
            s.model_copy(update={"producers_file": with_k2}),
            "quarantine",
            "replay",
            "--reason",
            "bad_signature",
            "--json",
        )
        assert replayed.returncode == 0, replayed.stderr
        assert [o["result"] for o in json.loads(replayed.stdout)] == ["accepted"]
        async with running_daemon(s):
            await eventually(
                lambda: _resolved(s, wait), what="the replayed event resolves its wait"
            )


async def test_a_topic_with_producer_timestamps_is_named_at_start(secure: Settings) -> None:
    """CreateTime is the producer's claim: freshness then falls back to the time of
    reading, and the daemon says so, with the fix, when it starts."""
    async with asyncio.timeout(120):
        topic = f"{secure.events_topic}.createtime"
        await ensure_topics(secure.kafka_client_options(), [topic], partitions=6)
        s = secure.model_copy(update={"events_topic": topic})
        try:
            daemon = DaemonProcess(process_env(s))
            try:
                await asyncio.to_thread(daemon.wait_ready)
                await eventually(lambda: "keeps producer timestamps" in daemon.output, timeout=30)
            finally:
                assert await asyncio.to_thread(daemon.terminate) == 0, daemon.output
            assert "matcher migrate` sets LogAppendTime" in daemon.output
        finally:
            await delete_topics(s.kafka_client_options(), [topic])


# --- 5. Forged resumes -------------------------------------------------------------------


def _try_advance(url: str, message: bytes) -> bool:
    """What a worker does with a resume message; refusing it by raising counts as no."""
    try:
        resume = parse_resume(message)
        with psycopg.connect(url) as conn:
            return advance(conn, resume)
    except Exception:
        return False


def _advance(url: str, message: bytes) -> bool:
    with psycopg.connect(url) as conn:
        return advance(conn, parse_resume(message))


def _position(settings: Settings, run_id: str) -> int | None:
    found = scalar(
        settings,
        "SELECT position FROM matcher.runs WHERE tenant = 'acme' AND run_id = %s",
        [run_id],
    )
    return None if found is None else int(found)


@pytest.mark.parametrize("forgery", ["forged", "altered_data", "other_run"])
async def test_forged_resumes_do_not_advance_runs(secure: Settings, forgery: str) -> None:
    """Attack: anyone who can write to the resume topic (or hand a worker a message) moves
    runs: ``advance`` trusts the message. A resume made up from scratch, the genuine one
    with its event data altered, and the genuine one pointed at another run waiting at the
    same position must all be refused; the genuine one, checked after them, still advances
    its run exactly once (had a forgery advanced the run, it could not)."""
    async with asyncio.timeout(120):
        event, record = _signed(data={"rows": 7})
        spec = _spec("acme", event.correlation_id, run_id=f"run-{_hex()}")
        other = _spec("acme", f"c-{_hex()}", run_id=f"other-{_hex()}")
        _wait(secure, spec)
        _wait(secure, other)
        async with running_daemon(secure):
            await produce_raw(secure, [_message(record)])
            genuine = (await _raw_resumes(secure, spec.run_id))[0]

        envelope = json.loads(genuine)
        data = envelope["data"]
        target = spec.run_id
        if forgery == "forged":
            now = datetime.now(UTC).isoformat()
            resolution = str(uuid.uuid4())
            envelope["id"] = resolution
            envelope["data"] = {
                **data,
                "resolution_id": resolution,
                "wait_id": str(uuid.uuid4()),
                "outcome": "event",
                "event": {
                    "source": "billing-svc",
                    "id": str(uuid.uuid4()),
                    "type": "job.completed",
                    "data": {"rows": 999_999},
                    "received_at": now,
                },
                "resolved_at": now,
            }
        elif forgery == "altered_data":
            data["event"]["data"] = {"rows": 999_999}
        else:
            data["run_id"] = envelope["subject"] = target = other.run_id
        url = _url(secure)
        before = _position(secure, target)
        forged = json.dumps(envelope).encode()
        assert await asyncio.to_thread(_try_advance, url, forged) is False, "a forgery advanced"
        assert _position(secure, target) == before, "the forged resume moved the run"
        assert await asyncio.to_thread(_advance, url, genuine) is True
        assert await asyncio.to_thread(_advance, url, genuine) is False
        assert _position(secure, spec.run_id) == 1


class _DecimalFloats(JsonLoader):
    """An application's own JSON loader for jsonb (Decimal floats, say)."""

    def load(self, data: Any) -> Any:
        return json.loads(bytes(data), parse_float=Decimal)


@pytest.mark.parametrize("worker", ["dict_rows", "decimal_json", "event_purged"])
async def test_a_genuine_resume_is_verified_whatever_the_workers_connection(
    secure: Settings, worker: str
) -> None:
    """A genuine resume must not be refused because of how the worker's connection reads
    rows or JSON, nor once its event has left the inbox (its day dropped); a forgery in the
    last case must still be refused (it is checked by the digest the janitor records before
    it drops the event's day)."""
    async with asyncio.timeout(120):
        event, record = _signed(data={"rows": 7, "ratio": 0.5})
        spec = _spec("acme", event.correlation_id, run_id=f"run-{_hex()}")
        _wait(secure, spec)
        async with running_daemon(secure):
            await produce_raw(secure, [_message(record)])
            genuine = (await _raw_resumes(secure, spec.run_id))[0]
            await _reached(
                lambda: bool(scalar(secure, "SELECT count(*) FROM matcher.resolutions"
                                    " WHERE published")),
                timeout=10,
            )  # fmt: skip
        url = _url(secure)
        if worker == "event_purged":
            await _purge_as_the_janitor(url)
            altered = json.loads(genuine)
            altered["data"]["event"]["data"] = {"rows": 8, "ratio": 0.5}
            assert await asyncio.to_thread(_try_advance, url, json.dumps(altered).encode()) is False

        def advance_with_the_workers_connection() -> bool:
            with psycopg.connect(url, row_factory=dict_row) as conn:
                if worker == "decimal_json":
                    conn.adapters.register_loader("jsonb", _DecimalFloats)
                    conn.adapters.register_loader("json", _DecimalFloats)
                return advance(conn, parse_resume(genuine))

        assert await asyncio.to_thread(advance_with_the_workers_connection) is True
        assert _position(secure, spec.run_id) == 1


async def _purge_as_the_janitor(url: str) -> None:
    """Every stored event gone, as when the janitor drops their days: first their ids
    forgotten and their resumes' digests recorded, a day at a time, then the rows."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'matcher.inbox'::regclass"
        )
        always = (datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC))
        for (name,) in await cur.fetchall():
            await _forget_day_ids(conn, pgsql.Identifier("matcher", name), *always)
        await conn.execute("DELETE FROM matcher.inbox")


# --- 6. Registration inside a worker's transaction ---------------------------------------

ISOLATION = {
    "read_committed": psycopg.IsolationLevel.READ_COMMITTED,
    "repeatable_read": psycopg.IsolationLevel.REPEATABLE_READ,
    "serializable": psycopg.IsolationLevel.SERIALIZABLE,
}


def _begin(url: str, isolation: psycopg.IsolationLevel) -> psycopg.Connection[Any]:
    """A worker's transaction, begun: its first statement (RR/SER: its snapshot) has run."""
    conn = psycopg.connect(url)
    conn.isolation_level = isolation
    conn.execute("SELECT 1")
    return conn


def _register_and_commit(conn: psycopg.Connection[Any], spec: WaitSpec) -> None:
    try:
        register_wait(conn, spec)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize("timing", ["before", "during", "after"])
@pytest.mark.parametrize("isolation", list(ISOLATION))
async def test_a_wait_registered_in_a_worker_transaction_resolves_once(
    secure: Settings, isolation: str, timing: str
) -> None:
    """Attack (on liveness): a worker registers its wait inside its own transaction, at
    any isolation level. Under REPEATABLE READ or SERIALIZABLE the transaction's snapshot
    may predate an event that ingest stored (as pending, no wait visible) meanwhile, so
    ``register_wait`` sees neither the event nor is seen by ingest: the wait must still
    resolve, once, whether the event came before, during or after the transaction."""
    async with asyncio.timeout(120):
        event, record = _signed()
        spec = _spec("acme", event.correlation_id)
        wait = str(spec.id)
        url = _url(secure)
        level = ISOLATION[isolation]

        def pending() -> bool:
            return bool(
                scalar(
                    secure,
                    "SELECT count(*) FROM matcher.inbox WHERE event_id = %s AND status = 'pending'",
                    [event.id],
                )
            )

        async with running_daemon(secure) as task:
            if timing == "before":
                await produce_raw(secure, [_message(record)])
                await eventually(_alive_and(task, pending), what="the event stored, pending")
                conn = await asyncio.to_thread(_begin, url, level)
                await asyncio.to_thread(_register_and_commit, conn, spec)
            elif timing == "during":
                conn = await asyncio.to_thread(_begin, url, level)
                try:
                    await produce_raw(secure, [_message(record)])
                    await eventually(_alive_and(task, pending), what="the event stored, pending")
                except BaseException:
                    await asyncio.to_thread(conn.close)
                    raise
                # Inside the snapshot taken before the event was stored.
                await asyncio.to_thread(_register_and_commit, conn, spec)
            else:
                conn = await asyncio.to_thread(_begin, url, level)
                await asyncio.to_thread(_register_and_commit, conn, spec)
                await produce_raw(secure, [_message(record)])
            await eventually(
                _alive_and(task, lambda: _state(secure, wait) == "matched"),
                timeout=20,
                what="the wait matched",
            )
            assert not task.done(), "the daemon stopped"
            resumes = await read_resumes(secure, at_least=1)
        assert _outbox_rows(secure, wait) == 1
        assert len([r for r in resumes if r.run_id == spec.run_id]) == 1


# --- 7. A long worker transaction --------------------------------------------------------


OPEN_TXN_S = float(env_flag("MATCHER_TEST_OPEN_TXN_S", 30))


def _hold_x(conn: psycopg.Connection[Any], url: str, holding: str, x: ProducerEvent) -> str:
    """What the worker's open transaction does to key X; returns X's wait id."""
    spec = _spec("acme", x.correlation_id)
    if holding == "registered":  # the wait itself, not committed yet
        return str(register_wait(conn, spec).id)
    if holding == "cancelling":  # a committed wait, its cancel not committed yet
        with psycopg.connect(url, autocommit=True) as other:
            wait_id = str(register_wait(other, spec).id)
        assert cancel_wait(conn, wait_id)
        return wait_id
    launch = record_launch(  # a job id recorded on the launch's wait, not committed yet
        conn, LaunchSpec(tenant="acme", run_id=spec.run_id, position=0, event_types=TYPES,
                         correlation_id=x.correlation_id)
    )  # fmt: skip
    conn.commit()
    conn.execute("SELECT 1")  # a transaction again, which record_job_id joins
    assert record_job_id(conn, launch.id, "job-x")
    return str(launch.wait_id)


@pytest.mark.parametrize("holding", ["registered", "cancelling", "job_id"])
async def test_a_long_worker_transaction_does_not_stall_other_keys(
    secure: Settings, holding: str
) -> None:
    """Attack (on liveness): a worker's transaction touches key X and stays open — having
    registered a wait (it held X's key lock until commit), cancelled one or recorded a job
    id (it holds X's wait row). Events for X in the middle of 1,000 events for other keys
    must not hold up those: their resumes are all published while it is still open.
    X's own event is settled once the transaction ends."""
    others_n = 1000
    hold_s = OPEN_TXN_S if holding == "registered" else 8.0
    async with asyncio.timeout(hold_s + 180):
        url = _url(secure)
        x_event, x_record = _signed()
        others = [_signed() for _ in range(others_n)]
        waits = [_wait(secure, _spec("acme", e.correlation_id)) for e, _ in others]
        messages = [_message(r) for _, r in others]
        messages.insert(others_n // 2, _message(x_record))

        def published() -> int:
            return int(
                scalar(
                    secure,
                    "SELECT count(*) FROM matcher.resolutions WHERE wait_id = ANY(%s::uuid[])"
                    " AND published",
                    [waits],
                )
            )

        async with running_daemon(secure) as task:
            conn = await asyncio.to_thread(_begin, url, psycopg.IsolationLevel.READ_COMMITTED)
            opened = time.monotonic()
            try:
                x_wait = await asyncio.to_thread(_hold_x, conn, url, holding, x_event)
                await produce_raw(secure, messages)
                await _reached(_alive_and(task, lambda: published() == others_n), timeout=60)
                stalled = others_n - published()
                assert not task.done(), "the daemon stopped"
                assert stalled == 0, f"{stalled} of {others_n} resumes of other keys unpublished"
                # The transaction stays open for the whole hold: nothing above waited for it.
                await asyncio.sleep(max(0.0, hold_s - (time.monotonic() - opened)))
                assert _state(secure, x_wait) in ("waiting", None)
            finally:
                await asyncio.to_thread(conn.commit)
                await asyncio.to_thread(conn.close)
            expected = "cancelled" if holding == "cancelling" else "matched"
            status = "late" if holding == "cancelling" else "consumed"

            def x_status() -> Any:
                return scalar(
                    secure, "SELECT status FROM matcher.inbox WHERE event_id = %s", [x_event.id]
                )

            await _reached(
                lambda: _state(secure, x_wait) == expected and x_status() == status, timeout=30
            )
            assert (_state(secure, x_wait), x_status()) == (expected, status)


# --- 8. Smaller ones ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["override", "environment"])
def test_an_empty_admin_token_is_refused(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Attack: ``MATCHER_ADMIN_TOKEN=""`` reads as "a token is set" to an operator and as
    no protection (or a token anyone can send) to the API. It must be refused at start."""
    monkeypatch.setenv("MATCHER_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    monkeypatch.setenv("MATCHER_DATABASE_URL", "postgresql://matcher@127.0.0.1:5432/matcher")
    if how == "environment":
        monkeypatch.setenv("MATCHER_ADMIN_TOKEN", "")
        with pytest.raises(ConfigError):
            load_settings()
    else:
        monkeypatch.delenv("MATCHER_ADMIN_TOKEN", raising=False)
        with pytest.raises(ConfigError):
            load_settings(admin_token="")


async def test_a_logged_attribute_cannot_forge_a_log_line(secure: Settings) -> None:
    """Attack: a quarantined record's attributes are logged; a ``ce_source`` holding a
    newline would start a line of the attacker's choosing in the text log."""
    async with asyncio.timeout(120):
        daemon = DaemonProcess(process_env(secure, MATCHER_LOG_FORMAT="text"))
        try:
            await asyncio.to_thread(daemon.wait_ready)
            _, record = _signed(source="billing-svc\nFORGED log line")
            key = f"log-{_hex()}".encode()
            await produce_raw(secure, [_message(record, key)])
            await eventually(
                lambda: _quarantined_with_key(secure, key) == 1, what="the record quarantined"
            )
        finally:
            code = await asyncio.to_thread(daemon.terminate)
        assert code == 0, daemon.output
        forged = [line for line in daemon.output.splitlines() if line.startswith("FORGED")]
        assert not forged, daemon.output


async def test_a_too_large_record_is_not_stored_whole(secure: Settings) -> None:
    """Attack (on storage): records over ``max_event_bytes`` are refused, yet the whole
    value is stored in the quarantine, so the limit does not bound what is written."""
    async with asyncio.timeout(120):
        _, record = _signed(data={"rows": 1, "pad": "x" * 65536})
        assert len(record.value) > 64 * 1024 > secure.max_event_bytes
        key = f"big-{_hex()}".encode()
        sentinel, sentinel_record = _signed()
        wait = _wait(secure, _spec("acme", sentinel.correlation_id))
        async with running_daemon(secure) as task:
            await produce_raw(secure, [_message(record, key), _message(sentinel_record, key)])
            await eventually(
                _alive_and(task, lambda: _resolved(secure, wait)), what="the sentinel resolved"
            )
            assert not task.done(), "the daemon stopped"
        [row] = rows(
            secure,
            "SELECT coalesce(octet_length(raw_value), 0) AS size FROM matcher.quarantine"
            " WHERE kafka_key = %s",
            [key],
        )
        stored, sent = int(row["size"]), len(record.value)
        assert stored <= sent // 4, f"{stored} bytes of a {sent}-byte record stored"


async def test_a_record_the_database_refuses_is_counted_as_rejected(secure: Settings) -> None:
    """Attack (on monitoring): data that passes the gate but that Postgres' jsonb refuses
    (a lone surrogate escape) is isolated and quarantined, but not counted in
    ``matcher_events_rejected_total``: rejections nobody is alerted to."""
    async with asyncio.timeout(120):
        event, record = _signed(data={"note": "\udc00"})
        assert b"\\udc00" in record.value
        key = f"refused-{_hex()}".encode()
        sentinel, sentinel_record = _signed()
        wait = _wait(secure, _spec("acme", sentinel.correlation_id))
        before = _rejected_total()
        async with running_daemon(secure) as task:
            await produce_raw(secure, [_message(record, key), _message(sentinel_record, key)])
            await eventually(
                _alive_and(task, lambda: _resolved(secure, wait)), what="the sentinel resolved"
            )
            assert not task.done(), "the daemon stopped"
            assert _quarantined_with_key(secure, key) == 1
            assert _inbox(secure, event.id) == []
            await eventually(
                lambda: _rejected_total() > before,
                timeout=5,
                what="matcher_events_rejected_total counted the refused record",
            )


async def test_a_missing_dead_letter_topic_is_refused_at_start(secure: Settings) -> None:
    """A dead-letter topic that does not exist made every batch with a rejected record
    wait ~40 s for its metadata; now the daemon names it and does not start."""
    async with asyncio.timeout(60):
        s = secure.model_copy(update={"dead_letter_topic": f"{secure.events_topic}.missing"})
        with pytest.raises(StartupError, match=r"\.missing do not exist: run `matcher migrate`"):
            async with running_daemon(s):
                pass


async def _dead_letter_copies(
    settings: Settings, topic: str, want: int, timeout: float = 30
) -> list[ConsumerRecord[bytes, bytes]]:
    """The copies on ``topic`` (one partition) from the beginning, once ``want`` are there
    (fewer if they do not come within ``timeout``)."""
    consumer = AIOKafkaConsumer(**settings.kafka_client_options(), group_id=None)
    found: list[ConsumerRecord[bytes, bytes]] = []
    async with started(consumer):
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await within(consumer.seek_to_beginning(partition))
        deadline = time.monotonic() + timeout
        while len(found) < want and time.monotonic() < deadline:
            for records in (await within(consumer.getmany(timeout_ms=200))).values():
                found.extend(records)
    return found


async def test_a_record_without_key_or_value_is_dead_lettered_and_the_copier_goes_on(
    secure: Settings,
) -> None:
    """Attack: one record with a null key and a null value (``kcat -Z``). It was
    quarantined, but its dead-letter copy is one the Kafka client refuses to send, and that
    ended the copier: every later copy was lost, and the daemon stopped with "a loop
    failed". Now it is copied (an empty value, ``matcher-null-value: true``), and so is
    the bad record after it."""
    async with asyncio.timeout(150):
        letters = f"{secure.events_topic}.dlq"
        await ensure_topics(secure.kafka_client_options(), [letters], partitions=1)
        s = secure.model_copy(update={"dead_letter_topic": letters})
        dropped = REGISTRY.get_sample_value("matcher_dead_letters_dropped_total") or 0.0
        junk: Message = (b"junk", [("content-type", b"application/cloudevents+json")], b"\x00{")
        async with running_daemon(s) as task:
            partition, offset = await _send_batch(s, b"null", [([], None)], keyless=True)
            await produce_raw(s, [junk])
            await eventually(
                _alive_and(task, lambda: scalar(s, "SELECT count(*) FROM matcher.quarantine") == 2),
                timeout=60,
                what="both records quarantined",
            )
            copies = await _dead_letter_copies(s, letters, want=2)
            assert not task.done(), "the daemon stopped"
        [null] = [c for c in copies if c.key is None]
        assert null.value == b""
        headers = dict(null.headers)
        assert headers["matcher-null-value"] == b"true"
        assert headers["matcher-origin"] == f"{s.events_topic}/{partition}/{offset}".encode()
        [after] = [c for c in copies if c.key == b"junk"]
        assert after.value == b"\x00{"
        assert "matcher-null-value" not in dict(after.headers)
        assert len(copies) == 2
        assert REGISTRY.get_sample_value("matcher_dead_letters_dropped_total") == dropped


async def test_a_failing_dead_letter_topic_does_not_stall_ingest(secure: Settings) -> None:
    """Attack (on availability): the dead-letter copy fails (its topic deleted under the
    running daemon); 20 invalid records and a valid one after them are still processed at
    once, and every invalid one is in quarantine."""
    async with asyncio.timeout(150):
        letters = f"{secure.events_topic}.dlq"
        await ensure_topics(secure.kafka_client_options(), [letters], partitions=1)
        s = secure.model_copy(update={"dead_letter_topic": letters})
        warm, warm_record = _signed()
        warm_wait = _wait(s, _spec("acme", warm.correlation_id))
        valid, valid_record = _signed()
        valid_wait = _wait(s, _spec("acme", valid.correlation_id))
        invalid: list[Message] = [
            (b"junk", [("content-type", b"application/cloudevents+json")], b"\x00{")
        ] * 20
        async with running_daemon(s) as task:
            await produce_raw(s, [_message(warm_record)])
            await eventually(_alive_and(task, lambda: _resolved(s, warm_wait)), timeout=60)
            assert not task.done(), "the daemon stopped before the dead-letter topic was deleted"
            await delete_topics(s.kafka_client_options(), [letters])
            started = time.monotonic()
            await produce_raw(s, [*invalid, _message(valid_record)])
            await eventually(
                _alive_and(task, lambda: _resolved(s, valid_wait)),
                timeout=10,
                what="20 invalid records and a valid one processed",
            )
            assert time.monotonic() - started < 10
            assert scalar(s, "SELECT count(*) FROM matcher.quarantine") == 20
