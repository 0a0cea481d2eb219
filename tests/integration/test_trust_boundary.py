"""The trust boundary, round 2: numbers, clocks and costs an outsider controls.

Each test plays one class of attack against the real daemon, the real ingress (a process),
real Kafka and real Postgres, as an outsider would: a number a double cannot hold, event
data echoed into a log by a database error, a delivery whose body arrives slowly at the
edge of the timestamp tolerance, crafted signatures against a producer with many keys,
connections that send nothing, and the console's and admin API's sessions and inputs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from matcher_producer import CompletionEvent as ProducerEvent
from matcher_producer import KafkaRecord, SigningKey, encode, sign_record

from matcher.config import Settings
from tests.support import webhooks as senders
from tests.support.assertions import eventually
from tests.support.db import rows, scalar
from tests.support.ingress import (
    HTTP_TIMEOUT,
    metrics_text,
    post,
    producers_file,
    running_ingress,
    wait_for,
)
from tests.support.kafka import produce_raw
from tests.support.processes import (
    DaemonProcess,
    process_env,
    run_cli,
    running_daemon,
)
from tests.support.services import Services, own_database, own_settings

pytestmark = pytest.mark.timeout(300)

INFINITY = b"2" + b"0" * 210 + b"e99"  # 2e309: no long exponent, no long run of digits
MARKER = "leak-canary-7f3a9c"  # event data that must never reach a log line


def _signed_binary(correlation: str, data: bytes, event_id: str | None = None) -> KafkaRecord:
    """A ce-svc event whose data is ``data`` exactly as written, signed by its key."""
    event = ProducerEvent(
        source="ce-svc",
        id=event_id or str(uuid.uuid4()),
        type="job.completed",
        tenant="acme",
        correlation_id=correlation,
        data=None,
    )
    record = encode(event)
    record = KafkaRecord(record.key, record.headers, data)
    key = SigningKey.parse("k1", senders.STANDARD_SECRET)
    return sign_record(record, event.id, [key])


# --- 1. numbers ---------------------------------------------------------------------------


async def test_a_number_a_double_cannot_hold_is_refused_and_explained(
    webhooks_secure: Settings,
) -> None:
    """2e309 written without a long exponent once parsed to Infinity: 202 at the ingress,
    then refused by Postgres and quarantined with no attributes, so explain said
    missing_signal. Now it is refused at the edge, and on Kafka quarantined with the
    correlation id it claimed, and explain names the refusal."""
    run_id = wait_for(webhooks_secure, "acme", "job.completed", "num-kafka")
    async with running_daemon(webhooks_secure):
        for data, correlation in [
            (b'{"n": ' + INFINITY + b"}", "num-kafka"),
            (b'{"n": 1' + b"0" * 5000 + b"}", "num-digits"),
        ]:
            record = _signed_binary(correlation, data)
            await produce_raw(webhooks_secure, [(record.key, record.headers, record.value)])
        await eventually(
            lambda: scalar(webhooks_secure, "SELECT count(*) FROM matcher.quarantine") == 2,
            what="both records quarantined",
        )
    found = rows(webhooks_secure, "SELECT correlation_id, reason, detail FROM matcher.quarantine")
    by_correlation = {r["correlation_id"]: r for r in found}
    assert set(by_correlation) == {"num-kafka", "num-digits"}
    assert all(r["reason"] == "malformed" for r in found)
    assert "beyond a double's range" in by_correlation["num-kafka"]["detail"]
    assert "5001 digits" in by_correlation["num-digits"]["detail"]
    explained = run_cli(webhooks_secure, "explain", run_id, "--json")
    assert explained.returncode == 0, explained.stderr
    body = json.loads(explained.stdout)
    assert body["verdict"] == "mismatch", body
    assert any("quarantined" in reason and "malformed" in reason for reason in body["reasons"])
    with running_ingress(webhooks_secure) as ingress:
        assert ingress.address is not None
        document = json.dumps(senders.openai_batch("batch_num")).encode()
        body_bytes = document.replace(b'"batch_num"}', b'"batch_num", "n": ' + INFINITY + b"}")
        assert INFINITY in body_bytes
        answer = post(
            ingress.address, "openai", senders.standard_request(body_bytes, "m-inf"), body_bytes
        )
        assert answer.status_code == 400, answer.text
        assert answer.json() == {"reason": "malformed"}


# --- 2. no event data in the logs --------------------------------------------------------


async def test_no_event_data_reaches_the_daemons_log(settings: Settings) -> None:
    """Hostile payloads, one of them refused by the database itself (a check constraint
    made for the test: its error's detail quotes the whole row). The daemon logs at DEBUG;
    the event data must appear on no line, and the refused record is quarantined with the
    attributes the gate read."""
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE matcher.inbox ADD CONSTRAINT test_refuses_marked "
            "CHECK (data::text NOT LIKE '%refuse-me%')"
        )
    daemon = DaemonProcess(process_env(settings, MATCHER_LOG_LEVEL="DEBUG"))
    try:
        daemon.wait_ready()
        marked = {"secret": MARKER, "why": "refuse-me"}
        hostile: list[tuple[bytes | None, list[tuple[str, bytes]], bytes]] = []
        for n, data in enumerate(
            [
                json.dumps(marked).encode(),  # refused by Postgres
                b'{"secret": "' + MARKER.encode() + b'", "n": ' + INFINITY + b"}",
                b'{"secret": "' + MARKER.encode() + b'" broken',
                b'{"secret": "' + MARKER.encode() + b'", "nul": "\\u0000"}',
                json.dumps({"secret": MARKER}).encode(),  # stored
            ]
        ):
            event = ProducerEvent(
                source="billing",
                id=f"leak-{n}",
                type="job.completed",
                tenant="acme",
                correlation_id=f"leak-{n}",
                data=None,
            )
            record = encode(event)
            hostile.append((record.key, record.headers, data))
        await produce_raw(settings, hostile)
        await eventually(
            lambda: (
                scalar(settings, "SELECT count(*) FROM matcher.quarantine") == 4
                and scalar(settings, "SELECT count(*) FROM matcher.inbox") == 1
            ),
            timeout=60,
            what="four quarantined, one stored",
        )
    finally:
        assert daemon.terminate() == 0, daemon.output
    refused = rows(
        settings,
        "SELECT reason, correlation_id, detail FROM matcher.quarantine "
        "WHERE detail LIKE 'refused by the database%%'",
    )
    assert len(refused) == 1, rows(settings, "SELECT * FROM matcher.quarantine")
    assert refused[0]["correlation_id"] == "leak-0"
    assert "test_refuses_marked" in refused[0]["detail"]
    assert MARKER not in refused[0]["detail"]
    assert "record refused by the database" in daemon.output
    leaking = [line for line in daemon.lines if MARKER in line]
    assert leaking == [], leaking


def test_no_event_data_reaches_the_ingress_log(webhooks_secure: Settings) -> None:
    with running_ingress(webhooks_secure, MATCHER_LOG_LEVEL="DEBUG") as ingress:
        assert ingress.address is not None
        for body in [
            b'{"secret": "' + MARKER.encode() + b'", "n": ' + INFINITY + b"}",
            b'{"secret": "' + MARKER.encode() + b'"',
            json.dumps({"type": "batch.completed", "secret": MARKER}).encode(),
            json.dumps(senders.openai_batch(MARKER)).encode(),
        ]:
            answer = post(ingress.address, "openai", senders.standard_request(body, "m"), body)
            assert answer.status_code in (202, 400), answer.text
            assert MARKER not in answer.text
    assert [line for line in ingress.lines if MARKER in line] == []


# --- 3. one clock for freshness ------------------------------------------------------------


def _slow_delivery(address: str, correlation: str, age_s: float, tail_after_s: float) -> int:
    """A signed delivery whose timestamp is ``age_s`` old when its first byte is sent, and
    whose last bytes follow ``tail_after_s`` later; its status."""
    body = json.dumps(senders.openai_batch(correlation)).encode()
    signed_at = datetime.fromtimestamp(time.time() - age_s, UTC)
    headers = senders.standard_request(body, f"m-{correlation}", when=signed_at)
    host, _, port = address.removeprefix("http://").partition(":")
    request = (
        b"POST /v1/webhooks/openai HTTP/1.1\r\nHost: x\r\n"
        + b"".join(n + b": " + v + b"\r\n" for n, v in headers)
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    with socket.create_connection((host, int(port)), timeout=20) as conn:
        conn.sendall(request[:-5])
        deadline = time.monotonic() + tail_after_s
        while (left := deadline - time.monotonic()) > 0:  # the attack is the delay itself
            conn.settimeout(left)
            with contextlib.suppress(TimeoutError):
                conn.recv(1)
        conn.settimeout(20)
        conn.sendall(request[-5:])
        return int(conn.recv(4096).split(b" ", 2)[1])


async def test_a_delivery_at_the_edge_of_the_tolerance_is_refused_or_stored_never_both(
    services: Services, db_url: str, tmp_path: Path
) -> None:
    """Timestamps around the edge of a 4 s tolerance, each body finished 1.5 s after its
    first byte. The ingress once judged at the first byte and the daemon at the broker's
    append time: such a delivery got 202 and was then quarantined as expired. Now every
    202 is stored and every refusal is not."""
    with own_settings(
        services,
        db_url,
        producers_file=producers_file(tmp_path),
        allow_unsigned=False,
        signature_tolerance_s=4.0,
        topic_partitions=1,
    ) as tight:
        with running_ingress(
            tight, MATCHER_INGRESS_MIN_BODY_RATE_BPS="0", MATCHER_SIGNATURE_TOLERANCE_S="4"
        ) as ingress:
            assert ingress.address is not None
            # 0 to 3.5 s old at the first byte (and up to a second more: the signed time is
            # whole seconds), 1.5 s more at the last: on both sides of the edge.
            ages = [0.25 * n for n in range(15)]
            address = ingress.address
            with ThreadPoolExecutor(len(ages)) as pool:
                statuses = list(
                    pool.map(
                        lambda n: _slow_delivery(address, f"edge_{n}", ages[n], 1.5),
                        range(len(ages)),
                    )
                )
            # A fresh one last: one partition, so once it is stored everything before it was
            # judged by the daemon.
            body = json.dumps(senders.openai_batch("edge_last")).encode()
            last = post(ingress.address, "openai", senders.standard_request(body, "m-l"), body)
            assert last.status_code == 202
        async with running_daemon(tight):
            await eventually(
                lambda: bool(
                    rows(tight, "SELECT 1 FROM matcher.inbox WHERE correlation_id = 'edge_last'")
                ),
                timeout=60,
                what="the last delivery stored",
            )
        stored = {
            r["correlation_id"] for r in rows(tight, "SELECT correlation_id FROM matcher.inbox")
        }
    accepted = {f"edge_{n}" for n, status in enumerate(statuses) if status == 202}
    refused = {f"edge_{n}" for n, status in enumerate(statuses) if status == 401}
    assert accepted | refused == {f"edge_{n}" for n in range(len(ages))}, statuses
    assert accepted, statuses  # the young ones pass: the test is not passing by refusing all
    assert refused, statuses
    assert stored - {"edge_last"} == accepted


# --- 4. bounded cost per unauthenticated record ------------------------------------------


def _ed25519_producer(keys: int) -> tuple[str, Ed25519PrivateKey]:
    """A CloudEvents producer "ed-svc" with ``keys`` Ed25519 keys; the last one signs."""
    private = [Ed25519PrivateKey.generate() for _ in range(keys)]
    lines = ['[producers."ed-svc"]', 'tenants = ["acme"]', 'types = ["job.completed"]']
    for n, key in enumerate(private):
        public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        lines += [
            '[[producers."ed-svc".keys]]',
            f'id = "k{n}"',
            f'ed25519_public_key = "whpk_{base64.b64encode(public).decode()}"',
        ]
    return "\n" + "\n".join(lines) + "\n", private[-1]


def test_a_producer_with_more_keys_than_the_bound_is_refused_at_start(
    settings: Settings, tmp_path: Path
) -> None:
    extra, _ = _ed25519_producer(32)
    bad = settings.model_copy(update={"producers_file": producers_file(tmp_path, extra)})
    answer = run_cli(bad, "run", timeout=60)
    assert answer.returncode != 0
    assert "32 keys; a producer has at most 4" in answer.stderr
    assert "Traceback" not in answer.stderr


def _cloudevent_request(
    key: Ed25519PrivateKey | None, correlation: str
) -> tuple[senders.Headers, bytes]:
    """A structured-mode request from ed-svc: signed by ``key``, or (None) carrying eight
    crafted Ed25519 signatures that pass every cheap check (a valid point, a canonical
    scalar) and verify under no key."""
    envelope = {
        "specversion": "1.0",
        "id": f"e-{correlation}",
        "source": "ed-svc",
        "type": "job.completed",
        "tenant": "acme",
        "correlationid": correlation,
        "data": {"ok": True},
    }
    body = json.dumps(envelope).encode()
    stamp = str(int(time.time())).encode()
    message = f"e-{correlation}".encode() + b"." + stamp + b"." + body
    if key is not None:
        signature = b"v1a," + base64.b64encode(key.sign(message))
    else:
        real = Ed25519PrivateKey.generate().sign(b"another message")
        crafted = [real[:32] + bytes([n]) + real[33:63] + b"\x00" for n in range(8)]
        signature = b" ".join(b"v1a," + base64.b64encode(c) for c in crafted)
    headers = [
        (b"content-type", b"application/cloudevents+json"),
        (b"webhook-id", f"e-{correlation}".encode()),
        (b"webhook-timestamp", stamp),
        (b"webhook-signature", signature),
    ]
    return headers, body


async def test_crafted_signatures_cost_a_bounded_amount_and_legitimate_traffic_passes(
    settings: Settings, tmp_path: Path
) -> None:
    """Four Ed25519 keys (the most a producer may have) and requests carrying eight
    crafted signatures each, twelve senders at once, beside a legitimate sender: each
    crafted request costs at most 16 verifications, judged off the event loop, so every
    legitimate request is accepted and its wait resolves."""
    extra, signer = _ed25519_producer(4)
    webhooks_secure = settings.model_copy(
        update={"producers_file": producers_file(tmp_path, extra), "allow_unsigned": False}
    )
    correlations = [f"ed-{n}" for n in range(30)]
    for correlation in correlations:
        wait_for(webhooks_secure, "acme", "job.completed", correlation)
    stop = threading.Event()

    def attack(address: str) -> int:
        refused = 0
        with httpx.Client(timeout=HTTP_TIMEOUT) as http:
            while not stop.is_set():
                headers, body = _cloudevent_request(None, f"x-{uuid.uuid4().hex[:8]}")
                answer = http.post(
                    f"{address}/v1/webhooks/ed-svc",
                    content=body,
                    headers=[(n.decode(), v.decode()) for n, v in headers],
                )
                assert answer.status_code == 401, answer.text
                refused += 1
        return refused

    async with running_daemon(webhooks_secure):
        with running_ingress(webhooks_secure) as ingress, ThreadPoolExecutor(12) as attackers:
            assert ingress.address is not None
            attacks = [attackers.submit(attack, ingress.address) for _ in range(12)]
            try:
                for correlation in correlations:
                    headers, body = _cloudevent_request(signer, correlation)
                    answer = post(ingress.address, "ed-svc", headers, body)
                    assert answer.status_code == 202, answer.text
            finally:
                stop.set()
            refused = sum(a.result() for a in attacks)
        assert refused > 0
        await eventually(
            lambda: (
                scalar(
                    webhooks_secure, "SELECT count(*) FROM matcher.waits WHERE state = 'matched'"
                )
                == len(correlations)
            ),
            timeout=60,
            what="every legitimate delivery resolved its wait",
        )


# --- 5. capacity that slow clients cannot take -------------------------------------------


class _SlowClients:
    """Connections that send almost nothing, reopened as they are closed: ``slowloris``
    ones trickle their headers, ``slow_bodies`` declare 100 kB and send one byte. They come
    from 127.0.0.2, another host as the ingress sees it, as an attacker's would."""

    def __init__(self, address: str, slowloris: int, slow_bodies: int) -> None:
        host, _, port = address.removeprefix("http://").partition(":")
        self._target = (host, int(port))
        self._stop = threading.Event()
        self.opened = 0
        self._threads = [
            threading.Thread(target=self._hold, args=(kind,), daemon=True)
            for kind in ["headers"] * slowloris + ["body"] * slow_bodies
        ]

    def __enter__(self) -> _SlowClients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)

    def _hold(self, kind: str) -> None:
        while not self._stop.is_set():
            with (
                contextlib.suppress(OSError),
                socket.create_connection(self._target, 5, ("127.0.0.2", 0)) as conn,
            ):
                self.opened += 1
                if kind == "body":
                    conn.sendall(
                        b"POST /v1/webhooks/openai HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\n"
                        b"Content-Length: 100000\r\n\r\n{"
                    )
                else:
                    conn.sendall(b"POST /v1/webhooks/openai HTTP/1.1\r\nHost: x\r\n")
                conn.settimeout(0.5)
                while not self._stop.is_set():  # a byte now and then, until it is closed
                    try:
                        if conn.recv(4096) == b"":
                            break
                    except TimeoutError:
                        conn.sendall(b"X-Slow: 1\r\n" if kind == "headers" else b" ")


async def test_slow_clients_cannot_take_the_ingress_from_signed_senders(
    webhooks_secure: Settings,
) -> None:
    """Sixty connections trickling headers and thirty trickling bodies, reopened as fast
    as they are closed, against a bound of 40 connections and 4 slots: once, they held
    every slot and connection and signed requests got 503. Now bodies take a slot only
    when complete and new connections evict the longest-waiting ones: every signed
    request is accepted and its wait resolves."""
    correlations = [f"slow_{n}" for n in range(30)]
    for correlation in correlations:
        wait_for(webhooks_secure, "acme", "batch.completed", correlation)
    async with running_daemon(webhooks_secure):
        with running_ingress(
            webhooks_secure,
            MATCHER_INGRESS_MAX_CONNECTIONS="40",
            MATCHER_INGRESS_MAX_CONCURRENCY="4",
        ) as ingress:
            assert ingress.address is not None
            with _SlowClients(ingress.address, slowloris=60, slow_bodies=30) as attack:
                await eventually(lambda: attack.opened >= 90, what="the attack under way")
                for correlation in correlations:
                    body = json.dumps(senders.openai_batch(correlation)).encode()
                    headers = senders.standard_request(body, f"m-{correlation}")
                    answer = post(ingress.address, "openai", headers, body)
                    assert answer.status_code == 202, answer.text
            evicted = metrics_text(ingress.address)
        assert "matcher_ingress_connections_evicted_total" in evicted
        await eventually(
            lambda: (
                scalar(
                    webhooks_secure, "SELECT count(*) FROM matcher.waits WHERE state = 'matched'"
                )
                == len(correlations)
            ),
            timeout=60,
            what="every signed delivery resolved its wait",
        )


def test_a_body_that_trickles_is_cut_off_at_the_minimum_rate(webhooks_secure: Settings) -> None:
    with running_ingress(webhooks_secure) as ingress:
        assert ingress.address is not None
        host, _, port = ingress.address.removeprefix("http://").partition(":")
        with socket.create_connection((host, int(port)), timeout=20) as conn:
            began = time.monotonic()
            conn.sendall(
                b"POST /v1/webhooks/openai HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
            )
            answer = conn.recv(4096)
            took = time.monotonic() - began
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        assert took < 5, took  # the read timeout is 10 s: the rate ended it first


# --- 6, 7. console sessions, sign-in, the admin token, replay ids, redirects --------------

TOKEN = "trust-boundary-admin-token-0123456789"


@pytest.fixture(scope="module")
def admin(services: Services, template_db: str) -> Iterator[tuple[str, Settings]]:
    with own_database(services, template_db) as url, own_settings(services, url) as settings:
        daemon = DaemonProcess(process_env(settings, MATCHER_ADMIN_TOKEN=TOKEN))
        daemon.wait_ready()
        try:
            yield daemon.admin_url(), settings
        finally:
            assert daemon.terminate() == 0, daemon.output


def _sign_in(http: httpx.Client) -> str:
    answer = http.post("/console/sign-in", data={"token": TOKEN, "next": "/console"})
    assert answer.status_code == 303, answer.text
    cookie = http.cookies.get("matcher_console")
    assert cookie
    return cookie


def _csrf(page: str) -> str:
    marker = 'name="csrf" value="'
    return page.split(marker, 1)[1].split('"', 1)[0]


def test_signing_out_ends_the_session_wherever_it_was_copied(
    admin: tuple[str, Settings],
) -> None:
    url, _ = admin
    with (
        httpx.Client(base_url=url, timeout=HTTP_TIMEOUT) as owner,
        httpx.Client(base_url=url, timeout=HTTP_TIMEOUT) as thief,
    ):
        cookie = _sign_in(owner)
        thief.cookies.set("matcher_console", cookie, path="/console")
        assert thief.get("/console/runs").status_code == 200  # the copy works, for now
        page = owner.get("/console").text
        out = owner.post("/console/sign-out", data={"csrf": _csrf(page)})
        assert out.status_code == 303
        stolen = thief.get("/console/runs")
        assert stolen.status_code == 303, "a copied cookie outlived its sign-out"
        assert stolen.headers["location"].startswith("/console/sign-in")


def test_a_weak_admin_token_is_refused_at_start(settings: Settings) -> None:
    for weak in ("x", "a" * 64, "short-token"):
        answer = subprocess_run_daemon(settings, weak)
        assert answer.returncode == 2, answer.stderr
        assert "MATCHER_ADMIN_TOKEN: is too weak" in answer.stderr
        if len(weak) > 1:  # never echoed (one character is in every word)
            assert weak not in answer.stderr
        assert "Traceback" not in answer.stderr


def subprocess_run_daemon(settings: Settings, token: str) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "matcher", "run"],
        env=process_env(settings, MATCHER_ADMIN_TOKEN=token),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_replay_ids_beyond_bigint_are_a_bad_request(admin: tuple[str, Settings]) -> None:
    url, _ = admin
    with httpx.Client(base_url=url, timeout=HTTP_TIMEOUT) as http:
        _sign_in(http)
        csrf = _csrf(http.get("/console/quarantine").text)
        for bad in (str(2**63), "-1", "0", "99999999999999999999999999"):
            answer = http.post("/console/quarantine/replay", data={"csrf": csrf, "ids": bad})
            assert answer.status_code == 400, (bad, answer.status_code)


def test_the_admin_server_builds_no_redirect_from_host(admin: tuple[str, Settings]) -> None:
    url, _ = admin
    answer = httpx.get(
        f"{url}/v1/waits/",
        headers={"Host": "evil.example", "Authorization": f"Bearer {TOKEN}"},
        timeout=HTTP_TIMEOUT,
    )
    assert answer.status_code == 404
    assert "location" not in answer.headers


# Last: it spends this address's attempts on the module's daemon.
def test_sign_in_is_throttled_per_address(admin: tuple[str, Settings]) -> None:
    url, _ = admin
    with httpx.Client(base_url=url, timeout=HTTP_TIMEOUT) as http:
        answers = [
            http.post("/console/sign-in", data={"token": f"guess-{n}", "next": "/console"})
            for n in range(12)
        ]
        statuses = [a.status_code for a in answers]
        assert statuses[:10] == [401] * 10, statuses
        assert statuses[10:] == [429, 429], statuses
        assert int(answers[-1].headers["retry-after"]) >= 1
        # Throttled, the right token is not even compared: no oracle for the guesser.
        right = http.post("/console/sign-in", data={"token": TOKEN, "next": "/console"})
        assert right.status_code == 429
        bearer = http.get("/v1/waits", headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 429
