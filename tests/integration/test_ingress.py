"""`matcher ingress` as a real process, in front of real Kafka and the real daemon.

Senders are independent clients: the `standardwebhooks` and `svix` packages sign,
`stripe` signs Stripe's header, curl and httpx post, raw sockets play the slow client.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from matcher.config import Settings
from tests.support import webhooks as senders
from tests.support.assertions import eventually
from tests.support.db import rows
from tests.support.ingress import HTTP_TIMEOUT, host_port, ingress_env, post, wait_for
from tests.support.kafka import read_resumes, started
from tests.support.processes import IngressProcess, running_daemon

pytestmark = pytest.mark.timeout(240)


def _events(settings: Settings) -> list[dict[str, Any]]:
    return rows(settings, "SELECT producer, event_id, correlation_id FROM matcher.inbox")


@pytest.mark.smoke
async def test_webhooks_from_three_kinds_of_sender_resume_their_runs(
    webhooks_secure: Settings, ingress: IngressProcess
) -> None:
    address = ingress.address
    assert address is not None
    runs = {
        wait_for(webhooks_secure, "acme", "batch.completed", "batch_abc"),
        wait_for(webhooks_secure, "acme", "github.workflow_run.completed", "30433642"),
        wait_for(webhooks_secure, "globex", "payment_intent.succeeded", "pi_9"),
    }
    async with running_daemon(webhooks_secure):
        openai = senders.body_bytes(senders.openai_batch("batch_abc"))
        response = post(address, "openai", senders.standard_request(openai, "msg_1"), openai)
        assert response.status_code == 202, response.text
        github = senders.body_bytes(senders.github_workflow_run(30433642))
        assert _curl(address, "github", senders.github_request(github), github) == 202
        stripe_body = senders.body_bytes(senders.stripe_event("pi_9", tenant="globex"))
        response = post(address, "stripe", senders.stripe_request(stripe_body), stripe_body)
        assert response.status_code == 202, response.text
        resumes = await read_resumes(webhooks_secure, at_least=3)
        assert {r.run_id for r in resumes} == runs
        # A redelivery (svix signs it this time) is 202 again, and a duplicate downstream.
        again = senders.standard_request(openai, "msg_1", library="svix")
        assert post(address, "openai", again, openai).status_code == 202
        await eventually(lambda: _duplicates(webhooks_secure) >= 1, what="the redelivery seen")
    assert sorted((e["producer"], e["event_id"]) for e in _events(webhooks_secure)) == [
        ("github", "30433642-1-completed"), ("openai", "msg_1"), ("stripe", "evt_s1"),
    ]  # fmt: skip


@pytest.mark.parametrize("structured", [False, True])
async def test_cloudevents_over_http_from_the_cloudevents_sdk(
    webhooks_secure: Settings, ingress: IngressProcess, structured: bool
) -> None:
    address = ingress.address
    assert address is not None
    correlation = "job é 7"  # percent-encoded in binary mode's header
    run_id = wait_for(webhooks_secure, "acme", "job.completed", correlation)
    async with running_daemon(webhooks_secure):
        headers, body = senders.cloudevent_request(correlation, "ce-1", structured=structured)
        response = post(address, "ce-svc", headers, body)
        assert response.status_code == 202, response.text
        resumes = await read_resumes(webhooks_secure, at_least=1)
        assert [r.run_id for r in resumes] == [run_id]
        # Posted to a plain-webhook producer's URL: not its format.
        refused = post(address, "openai", headers, body).json()
        if structured:
            assert refused == {
                "reason": "unsupported_media_type",
                "detail": "the body must be JSON: content-type application/json",
            }
        else:
            assert refused == {"reason": "ambiguous"}  # its detail would quote the request


def test_the_command_fails_in_one_line(webhooks_secure: Settings, ingress: IngressProcess) -> None:
    env = ingress_env(webhooks_secure)
    env.pop("MATCHER_PRODUCERS_FILE")
    done = subprocess.run(
        [sys.executable, "-m", "matcher", "ingress"], env=env, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("matcher: configuration error: MATCHER_PRODUCERS_FILE")
    assert "Traceback" not in done.stderr
    busy = ingress.address.removeprefix("http://") if ingress.address else ""
    done = subprocess.run(
        [sys.executable, "-m", "matcher", "ingress", "--address", busy],
        env=ingress_env(webhooks_secure), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"matcher: cannot listen on {busy}" in done.stderr
    assert "Traceback" not in done.stderr
    latin1 = (
        webhooks_secure.producers_file.with_name("latin1.toml")
        if webhooks_secure.producers_file
        else None
    )
    assert latin1 is not None
    latin1.write_bytes(b"# caf\xe9\n")  # valid TOML, but not UTF-8
    done = subprocess.run(
        [sys.executable, "-m", "matcher", "ingress"],
        env=dict(ingress_env(webhooks_secure), MATCHER_PRODUCERS_FILE=str(latin1)),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"matcher: cannot start: producers file {latin1}: not valid UTF-8: byte 0xe9 at"
        " offset 5 (invalid continuation byte)"
    )


def _logged(process: IngressProcess, *parts: str) -> bool:
    return any(all(part in line for part in parts) for line in list(process.lines))


async def _eventually_logged(process: IngressProcess, *parts: str) -> None:
    await eventually(lambda: _logged(process, *parts), timeout=10, what=" and ".join(parts))


@pytest.mark.timeout(120)
async def test_a_reload_of_a_file_that_is_not_utf8_keeps_the_registry_and_the_watch(
    webhooks_secure: Settings,
) -> None:
    """The ingress's reload watch once died, unlogged, on a Latin-1 byte: later edits were
    ignored and the next SIGHUP killed the process. Now the file is refused and logged,
    openai stays registered, and both the watch and SIGHUP go on."""
    path = webhooks_secure.producers_file
    assert path is not None
    process = IngressProcess(
        ingress_env(webhooks_secure, MATCHER_PRODUCERS_RELOAD_INTERVAL_S="0.2")
    )
    try:
        address = process.wait_listening()
        process.wait_ready()
        without_openai = senders.PRODUCERS_TOML.replace('producers."openai"', 'producers."gone"')
        path.write_bytes(b"# caf\xe9\n" + without_openai.encode())  # Latin-1: not UTF-8
        await _eventually_logged(process, "producer registry not reloaded", "not valid UTF-8")
        process.process.send_signal(signal.SIGHUP)
        await _eventually_logged(process, "not reloaded", "SIGHUP", "not valid UTF-8")
        assert process.process.poll() is None, process.output
        body = senders.body_bytes(senders.openai_batch("batch_utf8"))
        response = post(address, "openai", senders.standard_request(body, "msg_u1"), body)
        assert response.status_code == 202, response.text  # the last good registry
        path.write_text(without_openai)  # a good edit: the watch still takes it
        await _eventually_logged(process, "producer registry reloaded")
        response = post(address, "openai", senders.standard_request(body, "msg_u2"), body)
        assert response.status_code == 404, response.text
        process.process.send_signal(signal.SIGHUP)  # still handled, not the default action
        await _eventually_logged(process, "producer registry reloaded", "SIGHUP")
    finally:
        assert process.stop() == 0, process.output


def _zero_outcomes(address: str, producer: str) -> set[str]:
    prefix = "matcher_ingress_requests_total{"
    return {
        line.split('outcome="', 1)[1].split('"', 1)[0]
        for line in httpx.get(f"{address}/metrics", timeout=HTTP_TIMEOUT).text.splitlines()
        if line.startswith(prefix) and f'producer="{producer}"' in line and line.endswith(" 0.0")
    }


@pytest.mark.timeout(120)
async def test_every_registered_producer_has_its_outcomes_at_zero_from_load_and_reload(
    webhooks_secure: Settings,
) -> None:
    """A share or a rate over a series that appears only at its first request misses that
    request: each producer's outcomes are there at 0 from its registration, at start and
    when a reload brings it."""
    path = webhooks_secure.producers_file
    assert path is not None
    process = IngressProcess(
        ingress_env(webhooks_secure, MATCHER_PRODUCERS_RELOAD_INTERVAL_S="0.2")
    )
    try:
        address = process.wait_listening()
        process.wait_ready()
        for producer in ("openai", "github", "stripe", "ce-svc"):
            assert {"accepted", "dropped", "bad_signature"} <= _zero_outcomes(address, producer)
        assert _zero_outcomes(address, "github-ci") == set()
        added = senders.PRODUCERS_TOML.split('[producers."openai"]')[0]  # ce-svc's table
        path.write_text(senders.PRODUCERS_TOML + added.replace('"ce-svc"', '"github-ci"'))
        await eventually(
            lambda: "bad_signature" in _zero_outcomes(address, "github-ci"),
            timeout=20,
            what="github-ci's outcomes after the reload",
        )
        assert "dropped" in _zero_outcomes(address, "github-ci")
    finally:
        assert process.stop() == 0, process.output


def _duplicates(settings: Settings) -> int:
    found = rows(
        settings,
        "SELECT count(*) AS n FROM matcher.inbox WHERE producer = 'openai' AND event_id = 'msg_1'",
    )
    # The row stays one; the daemon counts the second copy as a duplicate.
    assert found[0]["n"] == 1
    return _metric(settings, "matcher_events_received_total", 'result="duplicate"')


def _metric(settings: Settings, name: str, labels: str) -> int:
    del settings
    from prometheus_client import REGISTRY

    total = 0.0
    for family in REGISTRY.collect():
        for sample in family.samples:
            rendered = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
            if sample.name == name and labels in rendered:
                total += sample.value
    return int(total)


def _curl(address: str, producer: str, headers: senders.Headers, body: bytes) -> int:
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed (apt-get install curl)", pytrace=False)
    args = [curl, "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20",
            "--data-binary", "@-", f"{address}/v1/webhooks/{producer}"]  # fmt: skip
    for name, value in headers:
        args[1:1] = ["-H", f"{name.decode()}: {value.decode()}"]
    done = subprocess.run(args, input=body, capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_refusals_carry_a_status_and_a_reason_and_nothing_else(
    webhooks_secure: Settings, ingress: IngressProcess
) -> None:
    address = ingress.address
    assert address is not None
    body = senders.body_bytes(senders.openai_batch("<script>alert(1)</script>"))
    cases = [
        ("openai", senders.standard_request(body, "m", secret="whsec_QUJDREVGR0g="), body, 401,
         "bad_signature"),
        ("nobody", senders.standard_request(body, "m"), body, 404, "unknown_producer"),
        ("openai", [(b"content-type", b"text/plain")], body, 415, "unsupported_media_type"),
        ("stripe", senders.stripe_request(senders.body_bytes(senders.stripe_event("p", "initech"))),
         senders.body_bytes(senders.stripe_event("p", "initech")), 403, "tenant_not_allowed"),
        ("openai", senders.standard_request(b"{}", "m"), b"{}", 400, "unmappable"),
        ("openai", senders.standard_request(b"{nope", "m"), b"{nope", 400, "malformed"),
    ]  # fmt: skip
    for producer, headers, content, status, reason in cases:
        response = post(address, producer, headers, content)
        assert (response.status_code, response.json()["reason"]) == (status, reason), producer
        # A detail where it is safe (matcher's words, the mapping, a verified sender's own
        # values), never one that could quote an unauthenticated request.
        assert set(response.json()) <= {"reason", "detail"}
        assert ("detail" in response.json()) == (reason not in {"malformed", "unknown_producer"})
        assert "script" not in response.text
        assert response.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in ingress.output  # bodies are never logged
    metrics = httpx.get(f"{address}/metrics", timeout=HTTP_TIMEOUT).text
    assert (
        'matcher_ingress_requests_total{outcome="bad_signature",producer="openai"} 1.0' in metrics
    )
    assert 'producer="_unknown"' in metrics
    assert "nobody" not in metrics


def test_too_large_is_refused_before_the_body_is_read(
    webhooks_secure: Settings, ingress: IngressProcess
) -> None:
    host, port = host_port(ingress)
    limit = webhooks_secure.max_event_bytes
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/webhooks/openai HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (limit + 1)
        )  # and no body at all: the answer comes from the declared length
        assert b" 413 " in conn.recv(4096).split(b"\r\n")[0] + b" "
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/webhooks/openai HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"x" * 65536
        answer = b""
        sent = 0
        while sent <= limit + len(chunk):  # chunked: counted while it arrives
            try:
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                break
            sent += len(chunk)
        answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:100]


def test_a_slow_client_cannot_hold_a_connection(
    webhooks_secure: Settings, ingress: IngressProcess
) -> None:
    host, port = host_port(ingress)
    # Headers one byte at a time: the connection is closed at the read timeout (2 s here).
    with socket.create_connection((host, port), timeout=10) as conn:
        started_at = time.monotonic()
        closed = False
        for byte in b"POST /v1/webhooks/openai HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100:
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if _closed(conn, 0.2):
                closed = True
                break
        assert closed
        assert time.monotonic() - started_at < 8
    # A body that trickles: 408 at the read timeout.
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/webhooks/openai HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]


def _closed(conn: socket.socket, wait_s: float) -> bool:
    conn.settimeout(wait_s)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    finally:
        conn.settimeout(10)


def test_overload_and_drain(webhooks_secure: Settings) -> None:
    process = IngressProcess(
        ingress_env(webhooks_secure, MATCHER_INGRESS_MAX_CONCURRENCY="1",
                     MATCHER_INGRESS_READ_TIMEOUT_S="20")
    )  # fmt: skip
    address = process.wait_listening()
    process.wait_ready()
    host, port = host_port(process)
    # A burst of complete requests on connections opened first: one slot judges and
    # forwards one at a time (milliseconds each, Kafka's acknowledgement included); the
    # rest are answered 503 at once, and none is lost.
    requests = []
    for n in range(30):
        body = senders.body_bytes(senders.openai_batch(f"batch_burst_{n}"))
        requests.append(_raw_request(body, senders.standard_request(body, f"msg_burst_{n}")))
    connections = [socket.create_connection((host, port), timeout=20) for _ in requests]
    try:
        for conn, request in zip(connections, requests, strict=True):
            conn.sendall(request)
        answers = [conn.recv(4096) for conn in connections]
    finally:
        for conn in connections:
            conn.close()
    statuses = sorted(answer.split(b" ", 2)[1] for answer in answers)
    assert set(statuses) == {b"202", b"503"}, statuses
    busy = next(a for a in answers if a.startswith(b"HTTP/1.1 503"))
    assert b'{"reason":"overloaded","detail":"every slot is busy"}' in busy
    assert b"retry-after: 1" in busy.lower()
    # A body still arriving holds no slot, and a drain lets it finish.
    body = senders.body_bytes(senders.openai_batch("batch_drain"))
    request = _raw_request(body, senders.standard_request(body, "msg_drain"))
    with socket.create_connection((host, port), timeout=20) as slow:
        slow.sendall(request[:-10])
        other = post(address, "openai", senders.standard_request(body, "m2"), body)
        assert other.status_code == 202
        process.process.send_signal(signal.SIGTERM)  # drains: the slow request still ends
        wait_until(lambda: "draining in-flight requests" in process.output)
        slow.sendall(request[-10:])
        answer = slow.recv(4096)
        assert answer.startswith(b"HTTP/1.1 202"), answer[:200]
    assert process.stop() == 0, process.output


def _raw_request(body: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    return (
        b"POST /v1/webhooks/openai HTTP/1.1\r\nHost: x\r\n"
        + b"".join(n + b": " + v + b"\r\n" for n, v in headers)
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


def _metrics(address: str) -> bytes:
    return httpx.get(f"{address}/metrics", timeout=HTTP_TIMEOUT).content


def wait_until(check: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_kafka_unavailable_is_503_with_retry_after(webhooks_secure: Settings) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{unused.getsockname()[1]}"
    process = IngressProcess(
        ingress_env(
            webhooks_secure, MATCHER_KAFKA_BOOTSTRAP_SERVERS=dead, MATCHER_STARTUP_TIMEOUT_S="1"
        )
    )
    try:
        address = process.wait_listening()
        assert httpx.get(f"{address}/readyz", timeout=HTTP_TIMEOUT).status_code == 503
        body = senders.body_bytes(senders.openai_batch("batch_x"))
        response = post(address, "openai", senders.standard_request(body, "m1"), body)
        assert response.status_code == 503
        assert response.json() == {"reason": "kafka_unavailable", "detail": "not acknowledged"}
        assert response.headers["retry-after"] == "5"
    finally:
        assert process.stop() == 0, process.output


async def test_a_compromised_ingress_cannot_advance_a_run(webhooks_secure: Settings) -> None:
    """Whatever writes to the events topic in the ingress's name, the daemon verifies."""
    run_id = wait_for(webhooks_secure, "acme", "batch.completed", "batch_forged")
    body = senders.body_bytes(senders.openai_batch("batch_forged"))
    forged = senders.standard_request(body, "msg_forged", secret="whsec_QUJDREVGR0g=")
    headers = [("matcher_webhook", b"openai")] + [(n.decode(), v) for n, v in forged]
    async with running_daemon(webhooks_secure):
        producer = AIOKafkaProducer(**webhooks_secure.kafka_client_options())
        async with started(producer):
            await producer.send_and_wait(
                webhooks_secure.events_topic, body, key=b"acme\x1fbatch_forged", headers=headers
            )
        await eventually(
            lambda: bool(rows(webhooks_secure, "SELECT 1 FROM matcher.quarantine")),
            what="the forged record quarantined",
        )
    found = rows(webhooks_secure, "SELECT reason, producer FROM matcher.quarantine")
    assert found == [{"reason": "bad_signature", "producer": "openai"}]
    waits = rows(webhooks_secure, "SELECT state FROM matcher.waits WHERE run_id = %s", (run_id,))
    assert waits == [{"state": "waiting"}]
    await asyncio.sleep(0)


async def test_svix_spelled_headers_and_a_unix_seconds_time_reach_the_run(
    webhooks_secure: Settings, ingress: IngressProcess
) -> None:
    """What Svix-based senders send by default (svix-id, svix-timestamp, svix-signature,
    signed by the svix package) is accepted; Stripe's created (Unix seconds) is the event's
    time."""
    address = ingress.address
    assert address is not None
    runs = {
        wait_for(webhooks_secure, "acme", "batch.completed", "batch_svix"),
        wait_for(webhooks_secure, "acme", "payment_intent.succeeded", "pi_time"),
    }
    async with running_daemon(webhooks_secure):
        body = senders.body_bytes(senders.openai_batch("batch_svix"))
        signed = senders.standard_request(body, "msg_svix", library="svix")
        response = post(address, "openai", senders.svix_spelled(signed), body)
        assert response.status_code == 202, response.text
        stripe_body = senders.body_bytes(senders.stripe_event("pi_time"))
        response = post(address, "stripe", senders.stripe_request(stripe_body), stripe_body)
        assert response.status_code == 202, response.text
        resumes = await read_resumes(webhooks_secure, at_least=2)
        assert {r.run_id for r in resumes} == runs
    stored = rows(
        webhooks_secure,
        "SELECT extract(epoch FROM occurred_at)::bigint AS t FROM matcher.inbox "
        "WHERE producer = 'stripe'",
    )
    assert stored == [{"t": senders.STRIPE_CREATED}]
