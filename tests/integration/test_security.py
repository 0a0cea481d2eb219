"""Invariants 5 and 6 end to end: only authenticated, allowed, valid events advance runs.

Every test here runs the real daemon against real Kafka and Postgres with a producers
file and signatures required.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from matcher_producer import CompletionEvent as ProducerEvent
from matcher_producer import KafkaRecord, SigningKey, encode, sign_record
from prometheus_client import REGISTRY

from matcher.config import Settings
from matcher.kafka.topics import ensure_topics
from tests.support.assertions import env_flag, eventually
from tests.support.db import rows, scalar
from tests.support.kafka import produce_raw, read_resumes, started, within
from tests.support.processes import DaemonProcess, process_env, run_cli, running_daemon
from tests.support.producers import K1, K2, STRANGER, producers_file, signed, wait_for


def _metric(reason: str) -> float:
    value = REGISTRY.get_sample_value("matcher_events_rejected_total", {"reason": reason})
    return value or 0.0


async def _dead_letters(settings: Settings, topic: str, want: int) -> list[dict[str, bytes]]:
    consumer = AIOKafkaConsumer(**settings.kafka_client_options(), group_id=None)
    found: list[dict[str, bytes]] = []
    async with started(consumer):
        partitions = [TopicPartition(topic, p) for p in range(settings.topic_partitions)]
        consumer.assign(partitions)
        await within(consumer.seek_to_beginning(*partitions))
        deadline = time.monotonic() + 30
        while len(found) < want and time.monotonic() < deadline:
            for records in (await within(consumer.getmany(timeout_ms=200))).values():
                found.extend(dict(r.headers) for r in records)
    return found


def _logged(daemon: DaemonProcess, *parts: str) -> Callable[[], bool]:
    """Whether the daemon printed a line containing every one of ``parts``."""

    def check() -> bool:
        return any(all(part in line for part in parts) for line in list(daemon.lines))

    return check


async def test_every_reason_code_is_quarantined_and_advances_nothing(secure: Settings) -> None:
    dead_letter_topic = secure.events_topic + ".dlq"
    await ensure_topics(secure.kafka_client_options(), [dead_letter_topic], partitions=6)
    secure = secure.model_copy(update={"dead_letter_topic": dead_letter_topic})
    crafted: dict[str, tuple[ProducerEvent, KafkaRecord]] = {
        "unknown_producer": signed(STRANGER, source="mallory-svc"),
        "bad_signature": signed(STRANGER),
        "expired_timestamp": signed(timestamp=int(time.time()) - 600),
        "tenant_not_allowed": signed(tenant="globex"),
        "type_not_allowed": signed(type="job.progress"),
        "schema_invalid": signed(data={"rows": "many"}),
        "too_large": signed(data={"rows": 1, "pad": "x" * 9000}),
    }
    good_event, good_record = signed(structured=True)
    for event, _ in crafted.values():
        wait_for(secure, event)
    # The wrong-tenant event's correlation id is also awaited by a run of that tenant.
    wait_for(secure, crafted["tenant_not_allowed"][0], tenant="globex")
    wait_for(secure, good_event)
    # The reasons this test provokes (the gate's own are tested at the unit level).
    reasons = (*crafted, "malformed")
    before = {reason: _metric(reason) for reason in reasons}

    key = b"one-partition"  # all on one partition, the good one last
    messages = [(key, r.headers, r.value) for _, r in crafted.values()]
    messages.insert(3, (key, [("content-type", b"application/cloudevents+json")], b"\x00{"))
    messages.append((key, good_record.headers, good_record.value))
    async with running_daemon(secure):
        await produce_raw(secure, messages)
        [resume] = await read_resumes(secure, at_least=1)
        await eventually(
            lambda: scalar(secure, "SELECT count(*) FROM matcher.quarantine") == len(reasons)
        )
        letters = await _dead_letters(secure, dead_letter_topic, len(reasons))

    assert resume.event is not None
    assert resume.event.id == good_event.id
    quarantined = rows(secure, "SELECT reason, producer, tenant FROM matcher.quarantine")
    assert sorted(q["reason"] for q in quarantined) == sorted(reasons)
    assert scalar(secure, "SELECT count(*) FROM matcher.waits WHERE state <> 'waiting'") == 1
    assert scalar(secure, "SELECT count(*) FROM matcher.inbox") == 1
    for reason in reasons:
        assert _metric(reason) - before[reason] == 1, reason
    assert sorted(h["matcher-reason"].decode() for h in letters) == sorted(reasons)


@pytest.mark.smoke
async def test_a_producer_cannot_resolve_another_tenants_wait(secure: Settings) -> None:
    event, record = signed(tenant="globex")  # validly signed, wrong tenant
    wait_for(secure, event, tenant="globex")
    after, after_record = signed(correlation_id=event.correlation_id, tenant="acme")
    wait_for(secure, after)
    async with running_daemon(secure):
        await produce_raw(
            secure,
            [
                (b"k", record.headers, record.value),
                (b"k", after_record.headers, after_record.value),
            ],
        )
        [resume] = await read_resumes(secure, at_least=1)
    assert resume.tenant == "acme"
    [globex_wait] = rows(secure, "SELECT state FROM matcher.waits WHERE tenant = 'globex'")
    assert globex_wait["state"] == "waiting"
    assert scalar(secure, "SELECT reason FROM matcher.quarantine") == "tenant_not_allowed"


def _reloading_daemon(secure: Settings) -> DaemonProcess:
    """A daemon on the producers file, signatures required, reloading it every 0.2 s."""
    env = process_env(secure)
    env.update(
        MATCHER_ALLOW_UNSIGNED="false",
        MATCHER_PRODUCERS_FILE=str(secure.producers_file),
        MATCHER_PRODUCERS_RELOAD_INTERVAL_S="0.2",
    )
    daemon = DaemonProcess(env)
    daemon.wait_ready()
    return daemon


async def test_registry_reload_rotation_and_replay(secure: Settings, tmp_path: Path) -> None:
    daemon = _reloading_daemon(secure)

    async def deliver(key: str) -> ProducerEvent:
        event, record = signed(key)
        wait_for(secure, event)
        await produce_raw(secure, [(None, record.headers, record.value)])
        return event

    def stored(event: ProducerEvent) -> Callable[[], bool]:
        def check() -> bool:
            return bool(
                scalar(
                    secure,
                    "SELECT (SELECT count(*) FROM matcher.inbox WHERE event_id = %s)"
                    " + (SELECT count(*) FROM matcher.quarantine WHERE event_id = %s)",
                    [event.id, event.id],
                )
            )

        return check

    try:
        early_k2 = await deliver(K2)  # k2 is not registered yet
        await eventually(stored(early_k2))
        assert scalar(secure, "SELECT reason FROM matcher.quarantine") == "bad_signature"

        producers_file(tmp_path, {"k1": K1, "k2": K2})  # rotation: both keys listed
        await eventually(lambda: "producer registry reloaded" in daemon.output, timeout=10)
        for key in (K1, K2):
            accepted = await deliver(key)
            await eventually(stored(accepted))
            assert (
                scalar(
                    secure, "SELECT count(*) FROM matcher.inbox WHERE event_id = %s", [accepted.id]
                )
                == 1
            )

        producers_file(tmp_path, {"k2": K2}, broken=True)  # a broken edit...
        await eventually(lambda: "not reloaded" in daemon.output, timeout=10)
        daemon.process.send_signal(signal.SIGHUP)  # ...and a SIGHUP on it
        # The SIGHUP's own reload (not the file watcher's), refused like the first.
        await eventually(
            _logged(daemon, "producer registry not reloaded", "why=SIGHUP"),
            timeout=10,
            what="the SIGHUP reload",
        )
        assert not _logged(daemon, "producer registry reloaded", "why=SIGHUP")()
        still = await deliver(K1)  # the last good registry (with k1) is still in force
        await eventually(stored(still))
        assert (
            scalar(secure, "SELECT count(*) FROM matcher.inbox WHERE event_id = %s", [still.id])
            == 1
        )

        producers_file(tmp_path, {"k2": K2})  # k1 retired
        await eventually(lambda: daemon.output.count("producer registry reloaded") >= 2, timeout=10)
        retired = await deliver(K1)
        await eventually(stored(retired))
        assert (
            scalar(
                secure, "SELECT reason FROM matcher.quarantine WHERE event_id = %s", [retired.id]
            )
            == "bad_signature"
        )

        # Replay: the early k2 event passes now (judged as of its arrival) and resolves.
        [row] = rows(secure, "SELECT id FROM matcher.quarantine WHERE event_id = %s", [early_k2.id])
        replayed = run_cli(secure, "quarantine", "replay", str(row["id"]), "--json")
        assert replayed.returncode == 0, replayed.stderr
        assert json.loads(replayed.stdout) == [
            {"id": row["id"], "result": "accepted", "detail": ""}
        ]
        again = run_cli(secure, "quarantine", "replay", str(row["id"]))
        assert again.returncode == 1  # already replayed
        still_bad = run_cli(secure, "quarantine", "replay", "--reason", "bad_signature", "--json")
        assert [o["result"] for o in json.loads(still_bad.stdout)] == ["bad_signature"]
        listed = run_cli(secure, "quarantine", "list", "--json")
        assert {q["event_id"]: q["replay_result"] for q in json.loads(listed.stdout)} == {
            early_k2.id: "accepted",
            retired.id: None,
        }
        resumes = await read_resumes(secure, at_least=4)
        assert early_k2.id in {r.event.id for r in resumes if r.event}
    finally:
        assert daemon.terminate() == 0, daemon.output


@pytest.mark.timeout(120)
async def test_a_reload_of_a_file_that_is_not_utf8_keeps_the_last_good_registry(
    secure: Settings, tmp_path: Path
) -> None:
    """A Latin-1 byte in the producers file once ended the registry loop, and with it the
    daemon; now the file watcher and SIGHUP both refuse it, and k1 stays in force."""
    daemon = _reloading_daemon(secure)
    try:
        producers_file(tmp_path, {"k2": K2}, latin1=True)  # loaded, it would retire k1
        await eventually(
            _logged(daemon, "producer registry not reloaded", "not valid UTF-8", "offset"),
            timeout=10,
            what="the file watcher's refusal",
        )
        daemon.process.send_signal(signal.SIGHUP)
        await eventually(
            _logged(daemon, "producer registry not reloaded", "why=SIGHUP", "not valid UTF-8"),
            timeout=10,
            what="the SIGHUP reload's refusal",
        )
        assert daemon.process.poll() is None, daemon.output
        event, record = signed(K1)
        wait_for(secure, event)
        await produce_raw(secure, [(None, record.headers, record.value)])
        count = "SELECT count(*) FROM matcher.inbox WHERE event_id = %s"
        await eventually(lambda: scalar(secure, count, [event.id]) == 1, what="k1 accepted")
        producers_file(tmp_path, {"k1": K1, "k2": K2})  # fixed: the watch still works
        await eventually(_logged(daemon, "producer registry reloaded"), timeout=10)
    finally:
        assert daemon.terminate() == 0, daemon.output


async def test_replaying_a_duplicate_is_recognised(secure: Settings) -> None:
    event, record = signed(K1)
    wait_for(secure, event)
    # The same event twice: once with a stranger's signature, once properly.
    bad = sign_record(
        replace(record, headers=[h for h in record.headers if not h[0].startswith("webhook-")]),
        event.id,
        [SigningKey.parse("x", STRANGER)],
    )
    # And another event under its id, with the stranger's signature: a producer's bug.
    other = replace(event, data={"rows": 8})
    reused = sign_record(encode(other), other.id, [SigningKey.parse("x", STRANGER)])
    async with running_daemon(secure):
        await produce_raw(
            secure,
            [
                (b"k", bad.headers, bad.value),
                (b"k", record.headers, record.value),
                (b"k", reused.headers, reused.value),
            ],
        )
        await read_resumes(secure, at_least=1)
    # Judged with the stranger's key added, the quarantined copy is valid, but a duplicate.
    extra = secure.producers_file.parent / "with-stranger.toml"  # type: ignore[union-attr]
    extra.write_text(
        secure.producers_file.read_text()  # type: ignore[union-attr]
        + f'\n[[producers."billing-svc".keys]]\nid = "x"\nhmac_secret = "{STRANGER}"\n'
    )
    result = run_cli(
        secure.model_copy(update={"producers_file": extra}),
        "quarantine",
        "replay",
        "--reason",
        "bad_signature",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    same, conflicting = json.loads(result.stdout)
    assert (same["result"], same["detail"]) == ("duplicate", "")
    assert conflicting["result"] == "duplicate"
    assert "another event is stored under this id" in conflicting["detail"]
    assert scalar(secure, "SELECT count(*) FROM matcher.resolutions") == 1
    stored = "SELECT data FROM matcher.inbox WHERE event_id = %s"
    assert scalar(secure, stored, [event.id]) == {"rows": 7}


def _mutations(
    rng: random.Random, count: int
) -> list[tuple[bytes | None, list[tuple[str, bytes]], bytes]]:
    """Random and mutated messages: flipped bytes, garbled or missing headers, invalid
    UTF-8, huge values, truncations, pure noise."""
    out: list[tuple[bytes | None, list[tuple[str, bytes]], bytes]] = []
    for n in range(count):
        _, record = signed(structured=rng.random() < 0.5, correlation_id=f"fuzz-{n % 50}")
        headers = list(record.headers)
        value = bytearray(record.value)
        for _ in range(rng.randint(1, 4)):
            choice = rng.randrange(8)
            if choice == 0 and value:
                value[rng.randrange(len(value))] = rng.randrange(256)
            elif choice == 1 and headers:
                name, _ = headers.pop(rng.randrange(len(headers)))
                headers.append((name, bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))))
            elif choice == 2 and headers:
                headers.pop(rng.randrange(len(headers)))
            elif choice == 3:
                value = bytearray(rng.randbytes(rng.randint(0, 300)))
            elif choice == 4:
                value = value[: rng.randint(0, len(value))]
            elif choice == 5:
                value += b"\xff\xfe\xc3\x28" * rng.randint(1, 4)
            elif choice == 6:
                headers.append(
                    (
                        rng.choice(["ce_tenant", "webhook-signature", "ce_id", "x"]),
                        rng.randbytes(12),
                    )
                )
            else:
                value = bytearray(b"{" * rng.randint(1, 20000))  # deep or huge JSON
        key = rng.choice([None, b"", rng.randbytes(8)])
        out.append((key, headers, bytes(value)))
    return out


async def test_fuzzed_messages_never_stall_crash_or_advance(secure: Settings) -> None:
    count = env_flag("MATCHER_TEST_FUZZ_MESSAGES", 2000)
    rng = random.Random(20261130)
    for n in range(50):
        wait_for(
            secure,
            ProducerEvent(
                source="s", type="job.completed", tenant="acme", correlation_id=f"fuzz-{n}"
            ),
        )
    sentinel, sentinel_record = signed(structured=False)
    wait_for(secure, sentinel)
    messages = _mutations(rng, count)
    messages.append((b"last", sentinel_record.headers, sentinel_record.value))
    async with running_daemon(secure) as task:
        await produce_raw(secure, messages)
        resumes = await read_resumes(secure, at_least=1, timeout=120)
        assert not task.done(), "the daemon stopped"
    resolved = [r.event.id for r in resumes if r.event]
    # A mutation may leave a message intact (e.g. it only dropped an unused header): such
    # a message is a valid event and may resolve its wait. Anything else may not.
    valid_ids = {sentinel.id}
    for _, headers, _ in messages[:-1]:
        names = dict(headers)
        if names.get("webhook-id"):
            valid_ids.add(names["webhook-id"].decode("utf-8", "replace"))
    assert sentinel.id in resolved
    assert set(resolved) <= valid_ids
    total = scalar(secure, "SELECT count(*) FROM matcher.quarantine") + scalar(
        secure, "SELECT count(*) FROM matcher.inbox"
    )
    assert total == len(messages)  # every record is accounted for: stored or quarantined
    reasons = {r["reason"] for r in rows(secure, "SELECT DISTINCT reason FROM matcher.quarantine")}
    assert {"malformed", "bad_signature", "too_large"} <= reasons  # the fuzz reached the gate
