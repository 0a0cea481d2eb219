"""Every explain verdict, produced by a real scenario on the real services (invariant 8)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from matcher_producer import CompletionEvent as ProducerEvent
from matcher_producer import SigningKey, encode, sign_record

from matcher.admin.explain import explain_run
from matcher.config import Settings
from matcher.domain.explain import Explanation, Verdict
from matcher.domain.waits import WaitSpec
from matcher.kafka.lag import crc32_partition, event_key, key_partitions
from matcher.sdk import cancel_wait, register_wait
from tests.support.assertions import eventually
from tests.support.db import rematch_all, scalar
from tests.support.kafka import produce, produce_raw, read_resumes, started, within
from tests.support.processes import process_env, run_cli, running_daemon
from tests.support.records import event


def _register(settings: Settings, run: str, correlation: str, **extra: Any) -> Any:
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        return register_wait(
            conn,
            WaitSpec.model_validate(
                {
                    "tenant": "acme",
                    "run_id": run,
                    "position": extra.pop("position", 0),
                    "event_types": ["job.completed", "job.failed"],
                    "correlation_id": correlation,
                    **extra,
                }
            ),
        )


async def _group_until(
    settings: Settings, ready: Callable[[dict[str, Any]], bool], what: str, timeout: float = 30
) -> None:
    """Until the daemons' consumer group, as the group coordinator describes it, is
    ``ready``: Kafka's own view of who has joined, not a guess at how long a join takes."""
    admin = AIOKafkaAdminClient(**settings.kafka_client_options())
    await within(admin.start())
    group: dict[str, Any] = {}
    try:
        async with asyncio.timeout(timeout):
            while True:
                [response] = await within(admin.describe_consumer_groups([settings.consumer_group]))
                [group] = response.to_object()["groups"]
                if ready(group):
                    return
                await asyncio.sleep(0.1)  # the poll's pace; the deadline bounds it
    except TimeoutError:
        raise AssertionError(f"consumer group not {what} within {timeout}s: {group}") from None
    finally:
        await within(admin.close())


async def _joined(settings: Settings) -> None:
    """The daemon is a member of its group and the group is stable (partitions assigned)."""
    await _group_until(settings, lambda g: g["state"] == "Stable" and bool(g["members"]), "joined")


async def _left(settings: Settings) -> None:
    """No member is left in the group: nobody reads the events topic."""
    await _group_until(settings, lambda g: not g["members"], "left")


async def _explain(settings: Settings, run: str) -> Explanation:
    async with await psycopg.AsyncConnection.connect(
        settings.database_url.get_secret_value(), autocommit=True
    ) as conn:
        return await explain_run(settings, conn, run)


async def test_resolved_by_event_names_the_event(settings: Settings) -> None:
    _register(settings, "r-ok", "c-ok")
    winner = event(correlation="c-ok")
    async with running_daemon(settings):
        await produce(settings, [winner])
        await read_resumes(settings, at_least=1)
    found = await _explain(settings, "r-ok")
    assert found.verdict is Verdict.RESOLVED_BY_EVENT
    assert found.evidence["event"]["id"] == winner.id
    assert found.evidence["event"]["partition"] is not None
    assert found.evidence["event"]["offset"] is not None
    assert found.evidence["resume"]["published"] is True


async def test_timed_out_and_cancelled_list_their_late_events(settings: Settings) -> None:
    _register(settings, "r-timeout", "c-timeout", deadline=datetime.now(UTC) + timedelta(seconds=1))
    cancelled = _register(settings, "r-cancel", "c-cancel")
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        cancel_wait(conn, cancelled.id)
    async with running_daemon(settings):
        await read_resumes(settings, at_least=2, timeout=30)
        late = [event(correlation="c-timeout"), event(correlation="c-cancel")]
        await produce(settings, late)
        await eventually(
            lambda: (
                scalar(settings, "SELECT count(*) FROM matcher.inbox WHERE status = 'late'") == 2
            )
        )
    timed_out = await _explain(settings, "r-timeout")
    assert timed_out.verdict is Verdict.TIMED_OUT
    assert [e["id"] for e in timed_out.evidence["late_events"]] == [late[0].id]
    assert any("came late" in r for r in timed_out.reasons)
    was_cancelled = await _explain(settings, "r-cancel")
    assert was_cancelled.verdict is Verdict.CANCELLED
    assert [e["id"] for e in was_cancelled.evidence["late_events"]] == [late[1].id]


async def test_missing_signal_then_waiting(settings: Settings) -> None:
    _register(settings, "r-missing", "c-missing")
    async with running_daemon(settings):
        await _joined(settings)  # the daemon reads every partition; nothing is lagging
        found = await _explain(settings, "r-missing")
        assert found.verdict is Verdict.MISSING_SIGNAL
        assert found.evidence["consumer_lag"]  # Kafka was asked

        # Position 0 is resolved by an event; position 1 waits on the same correlation id.
        await produce(settings, [event(correlation="c-missing")])
        await read_resumes(settings, at_least=1)
        _register(settings, "r-missing", "c-missing", position=1)
        found = await _explain(settings, "r-missing")
    assert found.verdict is Verdict.WAITING
    assert found.evidence["wait"]["position"] == 1
    assert found.evidence["related_events"][0]["status"] == "consumed"


async def test_mismatch_by_tenant_and_by_type(settings: Settings) -> None:
    _register(settings, "r-tenant", "c-tenant")
    _register(settings, "r-type", "c-type")
    async with running_daemon(settings):
        await produce(
            settings,
            [
                event(tenant="globex", correlation="c-tenant"),
                event(correlation="c-type", type_="job.progress"),
            ],
        )
        await eventually(lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 2)
        by_tenant = await _explain(settings, "r-tenant")
        by_type = await _explain(settings, "r-type")
    assert by_tenant.verdict is Verdict.MISMATCH
    assert by_tenant.evidence["mismatches"][0]["differs"] == "tenant"
    assert "tenant 'globex'" in by_tenant.reasons[0]
    assert by_type.verdict is Verdict.MISMATCH
    assert by_type.evidence["mismatches"][0]["differs"] == "type"


async def test_mismatch_by_signature_and_by_tenant_permission(
    settings: Settings, tmp_path: Path
) -> None:
    secret = "whsec_" + base64.b64encode(b"explain-secret-0123456789abcdefg").decode()
    producers = tmp_path / "producers.toml"
    producers.write_text(
        f"""
[producers."billing-svc"]
tenants = ["acme"]
types = ["job.completed"]
[[producers."billing-svc".keys]]
id = "k1"
hmac_secret = "{secret}"
"""
    )
    secure = settings.model_copy(update={"allow_unsigned": False, "producers_file": producers})
    _register(secure, "r-sig", "c-sig")
    _register(secure, "r-perm", "c-perm", tenant="globex")

    def signed(key: str, **fields: Any) -> tuple[bytes, list[tuple[str, bytes]], bytes]:
        e = ProducerEvent(source="billing-svc", type="job.completed", **fields)
        record = sign_record(encode(e), e.id, [SigningKey.parse("k", key)])
        return record.key, record.headers, record.value

    forged = "whsec_" + base64.b64encode(b"not-the-registered-key-at-all!!!").decode()
    async with running_daemon(secure):
        await produce_raw(
            secure,
            [
                signed(forged, tenant="acme", correlation_id="c-sig"),
                signed(secret, tenant="globex", correlation_id="c-perm"),
            ],
        )
        await eventually(lambda: scalar(secure, "SELECT count(*) FROM matcher.quarantine") == 2)
        bad_signature = await _explain(secure, "r-sig")
        not_allowed = await _explain(secure, "r-perm")
    assert bad_signature.verdict is Verdict.MISMATCH
    [mismatch] = bad_signature.evidence["mismatches"]
    assert mismatch["reason"] == "bad_signature"
    assert mismatch["quarantine_id"] > 0
    assert "signature was rejected" in bad_signature.reasons[0]
    assert not_allowed.verdict is Verdict.MISMATCH
    assert "not allowed to speak for tenant 'globex'" in not_allowed.reasons[0]


async def test_backlog_while_the_daemon_is_stopped(settings: Settings) -> None:
    _register(settings, "r-lag", "c-lag")
    async with running_daemon(settings):
        await _joined(settings)  # the group exists, with the daemon in it
    await _left(settings)
    # The daemon is down: events pile up unread, and a deadline passes unswept.
    _register(settings, "r-sweep", "c-sweep", deadline=datetime.now(UTC) - timedelta(seconds=3))
    await produce(settings, [event(correlation="c-lag")] + [event() for _ in range(30)])
    lagging = await _explain(settings, "r-lag")
    assert lagging.verdict is Verdict.BACKLOG
    # aiokafka (produce) partitions with murmur2, as the Java client does.
    [partition] = [
        p["partition"] for p in lagging.evidence["key_partitions"] if "murmur2" in p["partitioners"]
    ]
    assert lagging.evidence["consumer_lag"][str(partition)] > 0
    assert f"consumer lag on partition {partition}, where murmur2" in " ".join(lagging.reasons)
    unswept = await _explain(settings, "r-sweep")
    assert unswept.verdict is Verdict.BACKLOG
    assert unswept.evidence["sweeper_behind_s"] >= 3

    async with running_daemon(settings):
        await read_resumes(settings, at_least=2)
    assert (await _explain(settings, "r-lag")).verdict is Verdict.RESOLVED_BY_EVENT
    assert (await _explain(settings, "r-sweep")).verdict is Verdict.TIMED_OUT


async def test_unpublished_resume_is_reported(settings: Settings) -> None:
    early = event(correlation="c-unpub")
    async with running_daemon(settings):
        await produce(settings, [early])
        await eventually(lambda: scalar(settings, "SELECT count(*) FROM matcher.inbox") == 1)
    _register(settings, "r-unpub", "c-unpub")
    assert await rematch_all(settings) == 1  # resolved by the rematch pass, while no relay runs
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        conn.execute(
            "UPDATE matcher.waits SET resolved_at = now() - interval '1 minute',"
            " created_at = now() - interval '2 minutes' WHERE resolution_id IS NOT NULL"
        )
    found = await _explain(settings, "r-unpub")
    assert found.verdict is Verdict.RESOLVED_BY_EVENT
    assert found.evidence["resume"]["published"] is False
    assert found.evidence["resume"]["unpublished_for_s"] >= 60


def test_cli_explain(settings: Settings) -> None:
    _register(settings, "r-cli", "c-cli")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "matcher", "explain", *args],
            env=process_env(settings),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    as_json = cli("r-cli", "--json")
    assert as_json.returncode == 0, as_json.stderr
    body = json.loads(as_json.stdout)
    assert body["verdict"] == "missing_signal"
    assert body["evidence"]["wait"]["correlation_id"] == "c-cli"
    text = cli("r-cli", "--tenant", "acme")
    assert "missing_signal" in text.stdout
    assert "nothing with correlation id 'c-cli' has arrived" in text.stdout
    # A value in a reason is escaped once, as in a table: not repr'd, then escaped again.
    _register(settings, "r-cli-esc", "c\x1b[2J\\x")
    hostile = cli("r-cli-esc", "--tenant", "acme")
    assert "nothing with correlation id 'c\\x1b[2J\\\\x' has arrived" in hostile.stdout
    assert "\x1b" not in hostile.stdout
    unknown = cli("no-such-run")
    assert unknown.returncode == 1
    assert "no waits for run" in unknown.stderr


def _correlation_where_partitioners_differ(tenant: str, partitions: int) -> str:
    """A correlation id whose key CRC32 and murmur2 put on different partitions."""
    for n in range(1000):
        found = key_partitions(tenant, f"c-crc-{n}", partitions)
        if found["crc32"] not in (found["murmur2"], found["fnv1a"]):
            return f"c-crc-{n}"
    raise AssertionError("no such correlation id")


async def _backlog_on_the_crc32_partition(settings: Settings, send: Any) -> None:
    """With the daemon stopped, an event placed as librdkafka places it (CRC32) is unread
    on a partition murmur2 would not pick: explain says backlog there, not missing_signal."""
    correlation = _correlation_where_partitioners_differ("acme", settings.topic_partitions)
    _register(settings, "r-crc", correlation)
    async with running_daemon(settings):
        await _joined(settings)  # the group exists, with the daemon in it
    await _left(settings)  # the daemon is down: what is sent now stays unread
    key = event_key("acme", correlation)
    expected = crc32_partition(key, settings.topic_partitions)
    assert await send(key, expected) == expected
    found = await _explain(settings, "r-crc")
    assert found.verdict is Verdict.BACKLOG, found.reasons
    assert any(
        r.startswith(f"consumer lag on partition {expected}, where CRC32 (librdkafka's default")
        for r in found.reasons
    ), found.reasons
    crc = [p for p in found.evidence["key_partitions"] if "crc32" in p["partitioners"]]
    assert crc == [{"partition": expected, "partitioners": ["crc32"], "lag": 1}]

    # The CLI and the API give the same answer (one explanation_body).
    cli = run_cli(settings, "explain", "r-crc", "--json")
    assert cli.returncode == 0, cli.stderr
    body = json.loads(cli.stdout)
    assert body["verdict"] == "backlog"
    assert {"partition": expected, "partitioners": ["crc32"], "lag": 1} in body["evidence"][
        "key_partitions"
    ]


async def test_backlog_on_the_partition_librdkafka_picks(settings: Settings) -> None:
    """The record goes to the CRC32 partition explicitly (zlib.crc32 of the key modulo the
    partition count, as librdkafka's consistent_random partitioner computes it)."""

    async def send(key: bytes, partition: int) -> int:
        value = json.dumps({"ok": True}).encode()
        headers = [
            ("ce_specversion", b"1.0"),
            ("ce_id", b"evt-crc"),
            ("ce_source", b"billing"),
            ("ce_type", b"job.completed"),
            ("ce_tenant", b"acme"),
            ("ce_correlationid", key.split(b"\x1f", 1)[1]),
            ("content-type", b"application/json"),
        ]
        producer = AIOKafkaProducer(**settings.kafka_client_options(), acks="all")
        async with started(producer):
            sent = await within(
                producer.send_and_wait(
                    settings.events_topic, value, key=key, headers=headers, partition=partition
                )
            )
        return int(sent.partition)

    await _backlog_on_the_crc32_partition(settings, send)


async def test_backlog_of_an_event_sent_by_confluent_kafka(settings: Settings) -> None:
    """A record placed by librdkafka itself (confluent-kafka, default partitioner): our
    CRC32 partition is the one it picked, and explain finds the backlog there."""
    import confluent_kafka  # a test dependency: librdkafka partitions as its users see it

    async def send(key: bytes, partition: int) -> int:
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": settings.kafka_bootstrap_servers, "acks": "all"}
        )
        placed: list[int] = []

        def delivered(error: Any, message: Any) -> None:
            assert error is None, error
            placed.append(message.partition())

        producer.produce(
            settings.events_topic,
            value=json.dumps({"ok": True}).encode(),
            key=key,
            headers=[
                ("ce_specversion", b"1.0"),
                ("ce_id", b"evt-rdkafka"),
                ("ce_source", b"billing"),
                ("ce_type", b"job.completed"),
                ("ce_tenant", b"acme"),
                ("ce_correlationid", key.split(b"\x1f", 1)[1]),
                ("content-type", b"application/json"),
            ],
            on_delivery=delivered,
        )
        assert await asyncio.to_thread(producer.flush, 30) == 0
        [where] = placed
        return int(where)

    await _backlog_on_the_crc32_partition(settings, send)
