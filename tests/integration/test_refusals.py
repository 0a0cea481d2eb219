"""Refusals that can be found: the ingress answers with a detail, logs it, and records the
refused delivery (what it claimed, unverified) in the database, within a rate; explain and
the admin API name the refusal instead of "nothing has arrived". On Kafka, a structured
event sent under content type application/json (the CloudEvents SDKs' classic Kafka
bindings) is quarantined with the correlation id it claims, so explain finds it too.

Senders are independent clients: ``svix`` signs (with a secret the producer does not
have), the CloudEvents SDK builds the Kafka record.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import psycopg
import pytest
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from matcher.admin.explain import explain_run
from matcher.config import Settings
from matcher.domain.explain import Explanation, Verdict
from tests.support import webhooks as senders
from tests.support.assertions import eventually
from tests.support.db import rows
from tests.support.ingress import metrics_text, post, running_ingress, wait_for
from tests.support.kafka import produce_raw
from tests.support.processes import DaemonProcess, process_env, run_cli, running_daemon

pytestmark = pytest.mark.timeout(300)

WRONG_SECRET = "whsec_" + "d3JvbmctYnV0LXdlbGwtZm9ybWVkLXNlY3JldA=="
TOKEN = "refusals-admin-token-0123456789abcdef"


async def _explain(settings: Settings, run: str) -> Explanation:
    async with await psycopg.AsyncConnection.connect(
        settings.database_url.get_secret_value(), autocommit=True
    ) as conn:
        return await explain_run(settings, conn, run)


def _refusals(settings: Settings) -> list[dict[str, Any]]:
    return rows(settings, "SELECT * FROM matcher.refusals ORDER BY id")


async def test_a_run_whose_only_delivery_was_refused_is_explained_by_the_refusal(
    webhooks_secure: Settings,
) -> None:
    run = wait_for(webhooks_secure, "acme", "batch.completed", "batch_refused")
    before = await _explain(webhooks_secure, run)
    assert before.verdict == Verdict.MISSING_SIGNAL
    body = senders.body_bytes(senders.openai_batch("batch_refused"))
    signed = senders.standard_request(body, "msg_r1", secret=WRONG_SECRET, library="svix")
    with running_ingress(webhooks_secure, database=True) as ingress:
        assert ingress.address is not None
        answer = post(ingress.address, "openai", senders.svix_spelled(signed), body)
        assert answer.status_code == 401
        assert answer.json() == {
            "reason": "bad_signature",
            "detail": "no signature matches an active key of the producer",
        }
        await eventually(lambda: len(_refusals(webhooks_secure)) == 1, what="the record")
        assert "no signature matches an active key" in ingress.output  # the log's detail
    (record,) = _refusals(webhooks_secure)
    assert {k: record[k] for k in ("via", "producer", "reason", "http_status")} == {
        "via": "webhook", "producer": "openai", "reason": "bad_signature", "http_status": 401,
    }  # fmt: skip
    # What the mapping reads from the unverified body: never trusted, kept as a claim.
    assert (record["claimed_correlation_id"], record["claimed_event_id"]) == (
        "batch_refused",
        "msg_r1",
    )
    assert (record["claimed_type"], record["claimed_tenant"]) == ("batch.completed", "acme")
    explained = await _explain(webhooks_secure, run)
    # Nothing verified arrived: the verdict stays; the reasons say what was refused.
    assert explained.verdict == Verdict.MISSING_SIGNAL
    assert any(
        "refused by the ingress" in r and "bad_signature" in r and f"#{record['id']}" in r
        for r in explained.reasons
    ), explained.reasons
    (refused,) = explained.evidence["refusals"]
    assert (refused["refusal_id"], refused["verified"]) == (record["id"], False)
    listed = run_cli(
        webhooks_secure, "quarantine", "refusals", "--correlation", "batch_refused", "--json"
    )
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == [record["id"]]


async def test_a_flood_claiming_another_tenant_does_not_hide_a_real_refusal(
    webhooks_secure: Settings,
) -> None:
    run = wait_for(webhooks_secure, "acme", "batch.completed", "batch_abc")
    real = {"via": "webhook", "producer": "openai", "reason": "bad_signature",
            "detail": "the real one", "http_status": 401, "tenant": "acme",
            "correlation_id": "batch_abc"}  # fmt: skip
    forged = [{**real, "detail": "forged", "tenant": "globex"}] * 60
    forged += [{**real, "detail": "forged", "reason": "unmappable"}] * 60  # no tenant read
    for batch in ([real], forged):
        rows(webhooks_secure, "SELECT matcher.record_refusals_v1(%s::jsonb)", (json.dumps(batch),))
    explained = await _explain(webhooks_secure, run)
    shown = {(r["reason"], r["detail"], r["kind_count"]) for r in explained.evidence["refusals"]}
    assert shown == {("bad_signature", "the real one", 1), ("unmappable", "forged", 60)}


def _listed(admin: str, correlation_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{admin}/v1/refusals",
        params={"correlation_id": correlation_id},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


async def test_refusal_details_reach_the_answer_and_the_admin_api(
    webhooks_secure: Settings,
) -> None:
    """unmappable names the field; type_not_allowed names the mapped type; the admin API
    lists both by the correlation id they claimed."""
    daemon = DaemonProcess(process_env(webhooks_secure, MATCHER_ADMIN_TOKEN=TOKEN))
    try:
        daemon.wait_ready()
        admin = daemon.admin_url()
        with running_ingress(webhooks_secure, database=True) as ingress:
            assert ingress.address is not None
            document = senders.openai_batch("batch_d")
            del document["data"]["id"]
            document["data"]["batch"] = "batch_d"
            body = senders.body_bytes(document)
            answer = post(ingress.address, "openai", senders.standard_request(body, "m1"), body)
            assert (answer.status_code, answer.json()["reason"]) == (400, "unmappable")
            assert answer.json()["detail"] == "correlationid: the body has nothing at /data/id"
            other = senders.body_bytes(senders.openai_batch("batch_d", kind="batch.expired"))
            answer = post(ingress.address, "openai", senders.standard_request(other, "m2"), other)
            assert (answer.status_code, answer.json()["reason"]) == (403, "type_not_allowed")
            assert "'batch.expired'" in answer.json()["detail"]
            await eventually(lambda: len(_refusals(webhooks_secure)) == 2, what="both records")
        listed = _listed(admin, "batch_d")
        assert [r["reason"] for r in listed] == ["type_not_allowed"]  # the other claimed none
        assert [r["reason"] for r in _refusals(webhooks_secure)] == [
            "unmappable",
            "type_not_allowed",
        ]
    finally:
        assert daemon.terminate() == 0, daemon.output


def test_a_flood_of_refusals_is_recorded_at_a_bounded_rate(webhooks_secure: Settings) -> None:
    body = senders.body_bytes(senders.openai_batch("batch_flood"))
    signed = senders.standard_request(body, "m", secret=WRONG_SECRET)
    with running_ingress(
        webhooks_secure, database=True, MATCHER_INGRESS_REFUSAL_RECORDS_PER_S="1"
    ) as ingress:
        assert ingress.address is not None
        for _ in range(40):
            assert post(ingress.address, "openai", signed, body).status_code == 401
        metrics = metrics_text(ingress.address)
    recorded = len(_refusals(webhooks_secure))
    # A burst of ten, then one a second (the 40 requests take a few seconds at most).
    assert 10 <= recorded <= 20, recorded
    unrecorded = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("matcher_ingress_refusals_unrecorded_total ")
    )
    assert unrecorded == 40 - recorded


async def test_a_structured_event_under_application_json_on_kafka_is_found_by_explain(
    webhooks_secure: Settings,
) -> None:
    run = wait_for(webhooks_secure, "acme", "job.completed", "job-classic")
    event = CloudEvent(
        {"id": "e-classic", "source": "ce-svc", "type": "job.completed", "specversion": "1.0",
         "tenant": "acme", "correlationid": "job-classic"},
        {"ok": True},
    )  # fmt: skip
    message = ce_kafka.to_structured(event, JSONFormat(), key_mapper=lambda _: None)
    headers = [
        (k, b"application/json" if k == "content-type" else v) for k, v in message.headers.items()
    ]
    async with running_daemon(webhooks_secure):
        await produce_raw(webhooks_secure, [(b"acme\x1fjob-classic", headers, message.value)])
        await eventually(
            lambda: (
                rows(webhooks_secure, "SELECT correlation_id FROM matcher.quarantine")
                == [{"correlation_id": "job-classic"}]
            ),
            what="the record quarantined with its claimed correlation id",
        )
    explained = await _explain(webhooks_secure, run)
    assert explained.verdict != Verdict.MISSING_SIGNAL
    assert any("quarantined" in r and "malformed" in r for r in explained.reasons)
