"""The ingress's refusal records without I/O: the recorder's bounds, explain's words on
refusals (a hint, never a verdict), and answers that never reflect an unauthenticated
request."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from matcher.auth.registry import Registry, parse_registry
from matcher.config import IngressSettings
from matcher.domain.events import RefusedDelivery
from matcher.domain.explain import ExplainFacts, Verdict, explain
from matcher.domain.waits import Wait, WaitState
from matcher.ingress.app import IngressState, create_app
from matcher.ingress.metrics import REFUSALS_UNRECORDED
from matcher.ingress.refusals import CLAIMS_MAX_BODY_BYTES, FLUSH_ROWS, RefusalRecorder
from tests.support import webhooks as senders

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def registry() -> Registry:
    return parse_registry(senders.PRODUCERS_TOML, Path("."))


def _app(registry: Registry, written: list[dict[str, Any]]) -> Any:
    async def write(batch: list[dict[str, Any]]) -> int:
        written.extend(batch)
        return len(batch)

    async def send(key: bytes, value: bytes, headers: Any) -> datetime:
        return datetime.now(UTC)

    async def reachable() -> bool:
        return True

    recorder = RefusalRecorder(write, 20.0)
    state = IngressState(
        settings=IngressSettings(kafka_bootstrap_servers="localhost:9092"),
        registry=lambda: registry,
        send=send,
        kafka_reachable=reachable,
        stopping=asyncio.Event(),
        refusals=recorder,
    )
    app = create_app(state)
    app.state.recorder = recorder
    return app


def _unstorable_unless_cleaned() -> dict[str, str]:
    return {"correlation_id": "c\x00d", "tenant": "acme"}


async def test_claims_are_read_off_the_event_loop_and_only_from_small_bodies(
    registry: Registry,
) -> None:
    """An unsigned body is parsed for claims in a worker thread, when the batch is written,
    and only up to CLAIMS_MAX_BODY_BYTES: a flood of bad signatures cannot stall the loop."""
    written: list[dict[str, Any]] = []
    app = _app(registry, written)
    small = senders.body_bytes(senders.openai_batch("batch_small"))
    padded = senders.openai_batch("batch_big")
    padded["pad"] = "x" * CLAIMS_MAX_BODY_BYTES
    big = senders.body_bytes(padded)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://i"
    ) as client:
        for body in (small, big):
            signed = senders.standard_request(body, "m", secret="whsec_QUJDREVGR0g=")
            headers = {k.decode(): v.decode() for k, v in signed}
            answer = await client.post("/v1/webhooks/openai", content=body, headers=headers)
            assert answer.status_code == 401
    assert written == []  # nothing read yet: offer queues, the flush reads
    loop_thread = threading.current_thread()
    seen_in: list[threading.Thread] = []
    recorder: RefusalRecorder = app.state.recorder

    def claims() -> dict[str, str]:
        seen_in.append(threading.current_thread())
        return {}

    recorder.offer("webhook", "openai", "bad_signature", "d", 401, claims)
    await recorder.flush()
    assert seen_in
    assert seen_in[0] is not loop_thread
    assert written[0]["correlation_id"] == "batch_small"
    assert "correlation_id" not in written[1]  # over the bound: recorded without claims


async def test_a_flush_writes_in_chunks_and_counts_what_was_not_written() -> None:
    calls: list[int] = []

    async def write(batch: list[dict[str, Any]]) -> int:
        calls.append(len(batch))
        return len(batch) - 1 if len(calls) == 2 else len(batch)  # the second chunk: one lost

    recorder = RefusalRecorder(write, 10_000.0)
    before = REFUSALS_UNRECORDED._value.get()
    for _ in range(FLUSH_ROWS * 2 + 5):
        assert recorder.offer("webhook", "p", "bad_signature", "d", 401, dict)
    await recorder.flush()
    assert calls == [FLUSH_ROWS, FLUSH_ROWS, 5]
    assert REFUSALS_UNRECORDED._value.get() - before == 1


async def test_an_unstorable_value_is_cleaned_not_a_lost_batch() -> None:
    written: list[dict[str, Any]] = []

    async def write(batch: list[dict[str, Any]]) -> int:
        written.extend(batch)
        return len(batch)

    recorder = RefusalRecorder(write, 100.0)
    recorder.offer("webhook", "p", "bad_signature", "a\x00b", 401, _unstorable_unless_cleaned)
    recorder.offer("webhook", "p", "bad_signature", "ok", 401, dict)
    await recorder.flush()
    assert [w["detail"] for w in written] == ["a\ufffdb", "ok"]
    assert written[0]["correlation_id"] == "c\ufffdd"


def _wait() -> Wait:
    return Wait(
        id=uuid.uuid4(), tenant="acme", run_id="run-7", position=0,
        event_types=["batch.completed"], correlation_id="batch_abc", deadline=None,
        external_job_id=None, state=WaitState.WAITING, created_at=NOW - timedelta(minutes=5),
        resolved_at=None, resolution=None, resolved_by_producer=None, resolved_by_event_id=None,
    )  # fmt: skip


def _refusal(tenant: str | None, kind_count: int = 1) -> RefusedDelivery:
    return RefusedDelivery(
        id=12, received_at=NOW, via="webhook", producer="openai", reason="bad_signature",
        detail="no signature matches an active key of the producer", http_status=401,
        claimed_event_id="msg_x", claimed_type="batch.completed", claimed_tenant=tenant,
        claimed_correlation_id="batch_abc", kind_count=kind_count,
    )  # fmt: skip


def test_a_refusal_is_a_hint_that_never_changes_the_verdict() -> None:
    """Anyone can post a bad signature with a body naming a guessed correlation id: the
    verdict stays missing_signal, and the reason says what was refused."""
    wait = _wait()
    honest = explain(ExplainFacts(now=NOW, wait=wait, lag={}))
    hinted = explain(ExplainFacts(now=NOW, wait=wait, lag={}, refused=[_refusal("acme", 3)]))
    assert honest.verdict is hinted.verdict is Verdict.MISSING_SIGNAL
    assert any("only deliveries the ingress refused claimed it" in r for r in hinted.reasons)
    assert any(
        "refusal #12, bad_signature, HTTP 401" in r and "(3 such refusals)" in r
        for r in hinted.reasons
    ), hinted.reasons
    (evidence,) = hinted.evidence["refusals"]
    assert (evidence["refusal_id"], evidence["verified"]) == (12, False)
    other = explain(ExplainFacts(now=NOW, wait=wait, lag={}, refused=[_refusal("globex")]))
    assert other.reasons == honest.reasons  # another tenant's claim is not shown here


@pytest.mark.parametrize(
    "content_type",
    [
        "Your key expired. Re-register at https://evil.example/matcher",
        "application/json; charset=call-+1-555-0100-to-restore-service",
        "to-restore-service/call-555-0100",
        "application/x-www-form-urlencoded",
    ],
)
async def test_an_unauthenticated_answer_does_not_reflect_the_request(
    registry: Registry, content_type: str
) -> None:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=_app(registry, [])), base_url="http://i"
    ) as client:
        answer = await client.post(
            "/v1/webhooks/openai", content=b"{}", headers={"content-type": content_type}
        )
    assert answer.status_code == 415
    shown = answer.json()["detail"]
    assert "555" not in shown
    assert "evil" not in shown
    assert shown.startswith("the body must be JSON")
    if "form" in content_type:
        assert "GitHub: set the webhook's content type to application/json" in shown


def test_a_refused_json_record_is_read_for_claims_only_when_small(registry: Registry) -> None:
    """A structured event under content type application/json (the CloudEvents SDKs'
    classic Kafka bindings) is refused with the attributes it claims, for explain to find;
    past 64 KiB it is refused without reading them: an unsigned parse stays bounded."""
    from matcher.auth.gate import judge
    from matcher.auth.policy import Policy
    from matcher.domain.records import RawRecord

    envelope = {"specversion": "1.0", "id": "e1", "source": "ce-svc", "type": "job.completed",
                "tenant": "acme", "correlationid": "job-7", "data": {}}  # fmt: skip
    headers = ((b"content-type", b"application/json"),)
    small = judge(RawRecord(None, headers, senders.body_bytes(envelope), NOW), registry, Policy())
    assert small.reason == "malformed"  # type: ignore[union-attr]
    assert small.seen["correlation_id"] == "job-7"  # type: ignore[union-attr]
    envelope["data"] = {"pad": "x" * (64 * 1024)}
    big = judge(RawRecord(None, headers, senders.body_bytes(envelope), NOW), registry, Policy())
    assert big.reason == "malformed"  # type: ignore[union-attr]
    assert "correlation_id" not in big.seen  # type: ignore[union-attr]
