"""kcat, the librdkafka command-line client, as a producer: record batches, compression
codecs and a partitioner that are librdkafka's, not aiokafka's. Signed events it
publishes resolve their waits; a record it mangles is quarantined, and the partition
goes on.

kcat comes from scripts/install-kcat (Debian's package; installed when we may,
``make test`` runs it first); without it these tests fail with how to install it.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from matcher_producer import KafkaRecord
from prometheus_client import REGISTRY

from matcher.config import Settings
from tests.support.assertions import eventually
from tests.support.db import rows, scalar
from tests.support.kafka import read_resumes
from tests.support.processes import installed_tool, running_daemon
from tests.support.producers import signed, wait_for

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kcat() -> str:
    return installed_tool("install-kcat")


def _publish(kcat: str, settings: Settings, record: KafkaRecord, codec: str) -> None:
    """One record through kcat: its key, headers and value exactly as given."""
    headers = [arg for name, value in record.headers for arg in ("-H", f"{name}={value.decode()}")]
    key = [] if record.key is None else ["-k", record.key.decode()]
    subprocess.run(
        [
            kcat, "-P", "-b", settings.kafka_bootstrap_servers, "-t", settings.events_topic,
            "-z", codec, "-X", "enable.idempotence=true", "-X", "acks=all", "-D", "\x1e",
            *key, *headers,
        ],
        input=(record.value or b"") + b"\x1e", capture_output=True, timeout=60, check=True,
    )  # fmt: skip


def _published(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM matcher.resolutions WHERE published"))


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_signed_events_kcat_publishes_resolve_their_waits(
    kcat: str,
    secure: Settings,
    codec: str,
) -> None:
    events = [signed(structured=structured) for structured in (False, True)]
    for event, _ in events:
        wait_for(secure, event)
    async with running_daemon(secure):
        for _, record in events:
            _publish(kcat, secure, record, codec)
        await eventually(
            lambda: scalar(secure, "SELECT count(*) FROM matcher.resolutions WHERE published") == 2,
            timeout=60,
            what="both waits resolved and published",
        )
    resumes = await read_resumes(secure, at_least=2)
    assert {r.correlation_id for r in resumes} == {e.correlation_id for e, _ in events}
    assert scalar(secure, "SELECT count(*) FROM matcher.quarantine") == 0


async def test_a_record_kcat_mangles_is_quarantined_and_the_partition_goes_on(
    kcat: str,
    secure: Settings,
) -> None:
    """A header value changed after signing (kcat sends what it is given): refused with a
    reason, and the next record of the same key, intact, still resolves its wait."""
    mangled_event, record = signed(correlation_id=f"c-{uuid.uuid4().hex[:8]}")
    tampered = KafkaRecord(
        key=record.key,
        headers=[
            (name, b"other" if name == "ce_type" else value) for name, value in record.headers
        ],
        value=record.value,
    )
    good_event, good = signed(correlation_id=mangled_event.correlation_id)
    wait_for(secure, mangled_event)
    async with running_daemon(secure):
        _publish(kcat, secure, tampered, "none")
        _publish(kcat, secure, good, "none")
        await eventually(
            lambda: scalar(secure, "SELECT count(*) FROM matcher.resolutions WHERE published") == 1,
            timeout=60,
            what="the intact event's wait resolved",
        )
    assert scalar(secure, "SELECT reason FROM matcher.quarantine") == "bad_signature"
    assert scalar(secure, "SELECT resolved_by_event_id FROM matcher.waits") == good_event.id


def _received(result: str) -> float:
    value = REGISTRY.get_sample_value("matcher_events_received_total", {"result": result})
    return value or 0.0


async def test_a_replayed_record_and_a_reused_id_are_stored_once(
    kcat: str,
    secure: Settings,
) -> None:
    """kcat sends a captured signed record, then, once it is stored, the same record twice
    more and a second signed event that reuses its id under another correlation id (a
    wait registered for each): the id stays stored once, as the first record says, and
    the reuse resolves nothing (a duplicate is dropped, not read with another meaning)."""
    first, record = signed(correlation_id=f"c-{uuid.uuid4().hex[:8]}")
    reuse, reused = signed(id=first.id, correlation_id=f"c-{uuid.uuid4().hex[:8]}")
    wait_for(secure, first)
    wait_for(secure, reuse)
    async with running_daemon(secure):
        _publish(kcat, secure, record, "none")
        await eventually(lambda: _published(secure) == 1, timeout=60, what="the first resumed")
        duplicates = _received("duplicate")
        for sent in (record, reused, record):
            _publish(kcat, secure, sent, "none")
        await eventually(
            lambda: _received("duplicate") - duplicates == 3,
            timeout=60,
            what="the three later records counted as duplicates",
        )
    stored = rows(
        secure, "SELECT correlation_id FROM matcher.inbox WHERE event_id = %s", [first.id]
    )
    assert stored == [{"correlation_id": first.correlation_id}]
    assert scalar(secure, "SELECT count(*) FROM matcher.event_ids") == 1
    states = {
        r["correlation_id"]: r["state"]
        for r in rows(secure, "SELECT correlation_id, state FROM matcher.waits")
    }
    assert states == {first.correlation_id: "matched", reuse.correlation_id: "waiting"}
    assert scalar(secure, "SELECT count(*) FROM matcher.quarantine") == 0


async def test_trace_contexts_kcat_adds_are_kept_or_dropped_never_refusing(
    kcat: str,
    secure: Settings,
) -> None:
    """Trace headers added to signed records by an independent client: one valid
    traceparent is kept with its event; two that disagree, or a hostile one, are dropped;
    every event is stored and resolves its wait (the trace context is not authority)."""
    good = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    other = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    extra = [
        [("traceparent", good.encode())],
        [("traceparent", good.encode()), ("ce_traceparent", other.encode())],
        [("traceparent", b"00-\x1b[2J-not-a-trace")],
    ]
    events = [signed() for _ in extra]
    for event, _ in events:
        wait_for(secure, event)
    async with running_daemon(secure):
        for (_, record), added in zip(events, extra, strict=True):
            traced = KafkaRecord(record.key, [*record.headers, *added], record.value)
            _publish(kcat, secure, traced, "none")
        await eventually(lambda: _published(secure) == 3, timeout=60,
                         what="every traced event resolved its wait")  # fmt: skip
    assert scalar(secure, "SELECT count(*) FROM matcher.quarantine") == 0
    kept = {
        r["correlation_id"]: r["trace_parent"]
        for r in rows(secure, "SELECT correlation_id, trace_parent FROM matcher.inbox")
    }
    assert [kept[e.correlation_id] for e, _ in events] == [good, None, None]
