"""Plain JSON webhooks through the gate: each scheme's signature and the body mapping.

Requests are signed by independent libraries (tests/webhook_senders.py) and turned into
records by the ingress's own translation, so these are the records the daemon reads.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import stripe
from svix.webhooks import Webhook as SvixWebhook

from matcher.auth.gate import judge
from matcher.auth.policy import Policy
from matcher.auth.registry import Registry, RegistryError, parse_registry
from matcher.auth.webhooks import TemplateError, Unmappable, parse_template
from matcher.domain.events import CompletionEvent, Dropped, Rejection
from matcher.domain.records import RawRecord
from matcher.ingress.requests import Refusal, to_record
from tests.support import webhooks as senders

POLICY = Policy()


@pytest.fixture(scope="module")
def registry() -> Registry:
    return parse_registry(senders.PRODUCERS_TOML, Path("."))


def record_of(
    registry: Registry, producer: str, headers: senders.Headers, body: bytes
) -> RawRecord:
    made = to_record(registry.producers[producer], headers, body, datetime.now(UTC))
    assert isinstance(made, RawRecord), made
    return made


def accepted(registry: Registry, record: RawRecord) -> CompletionEvent:
    judged = judge(record, registry, POLICY)
    assert isinstance(judged, CompletionEvent), judged
    return judged


def reason(registry: Registry, record: RawRecord) -> str:
    judged = judge(record, registry, POLICY)
    assert isinstance(judged, Rejection), judged
    return judged.reason


@pytest.mark.parametrize("library", ["standardwebhooks", "svix"])
def test_an_openai_style_batch_callback_becomes_an_event(registry: Registry, library: str) -> None:
    body = senders.body_bytes(senders.openai_batch("batch_abc"))
    headers = senders.standard_request(body, "msg_1", library=library)
    event = accepted(registry, record_of(registry, "openai", headers, body))
    assert (event.source, event.id, event.type) == ("openai", "msg_1", "batch.completed")
    assert (event.tenant, event.correlationid) == ("acme", "batch_abc")
    assert event.data == senders.openai_batch("batch_abc") | {
        "created_at": event.data["created_at"]
    }


def test_standard_webhooks_refuses_a_wrong_key_and_a_stale_timestamp(registry: Registry) -> None:
    body = senders.body_bytes(senders.openai_batch("batch_abc"))
    wrong = senders.standard_request(body, "msg_1", secret="whsec_" + "QUJDREVGR0g=")
    assert reason(registry, record_of(registry, "openai", wrong, body)) == "bad_signature"
    old = datetime.now(UTC) - timedelta(minutes=10)
    stale = senders.standard_request(body, "msg_1", when=old)
    assert reason(registry, record_of(registry, "openai", stale, body)) == "expired_timestamp"


def test_the_body_cannot_change_under_a_signature(registry: Registry) -> None:
    body = senders.body_bytes(senders.openai_batch("batch_abc"))
    headers = senders.standard_request(body, "msg_1")
    other = body.replace(b"batch_abc", b"batch_xyz")
    assert reason(registry, record_of(registry, "openai", headers, other)) == "bad_signature"


def test_githubs_signature_is_githubs(registry: Registry) -> None:
    # GitHub's documented vector: secret "It's a Secret to Everybody", body "Hello, World!".
    assert senders.github_signature(b"Hello, World!") == (
        b"sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )


def test_a_github_workflow_run_becomes_an_event_with_an_id_from_the_body(
    registry: Registry,
) -> None:
    body = senders.body_bytes(senders.github_workflow_run(30433642, attempt=2))
    event = accepted(registry, record_of(registry, "github", senders.github_request(body), body))
    assert event.id == "30433642-2-completed"
    assert (event.type, event.correlationid, event.jobid) == (
        "github.workflow_run.completed", "30433642", "9f2c1d0",
    )  # fmt: skip
    # A redelivery (a new X-GitHub-Delivery, the same signed body) is the same event.
    again = senders.github_request(body, delivery="d-2")
    assert accepted(registry, record_of(registry, "github", again, body)).id == event.id


def test_github_refuses_a_wrong_secret_and_other_actions(registry: Registry) -> None:
    body = senders.body_bytes(senders.github_workflow_run(1))
    wrong = senders.github_request(body, secret="guess")
    assert reason(registry, record_of(registry, "github", wrong, body)) == "bad_signature"
    started = senders.body_bytes(senders.github_workflow_run(1, action="in_progress"))
    headers = senders.github_request(started)
    # The producer's drop rule takes the other actions (without it: type_not_allowed).
    assert reason(registry, record_of(registry, "github", headers, started)) == "dropped"


def test_a_stripe_event_is_verified_by_stripes_rules(registry: Registry) -> None:
    body = senders.body_bytes(senders.stripe_event("pi_1", tenant="globex"))
    headers = senders.stripe_request(body)
    # The header stripe's library made is one stripe's library accepts (the reference).
    stripe.WebhookSignature.verify_header(
        body.decode(), dict(headers)[b"stripe-signature"].decode(), senders.STRIPE_SECRET, 300
    )
    event = accepted(registry, record_of(registry, "stripe", headers, body))
    assert (event.id, event.tenant, event.correlationid) == ("evt_s1", "globex", "pi_1")


def test_stripe_refuses_stale_and_doubled_timestamps(registry: Registry) -> None:
    body = senders.body_bytes(senders.stripe_event("pi_1"))
    stale = senders.stripe_request(body, when=int(time.time()) - 3600)
    assert reason(registry, record_of(registry, "stripe", stale, body)) == "expired_timestamp"
    now = str(int(time.time()))
    digest = hmac.new(senders.STRIPE_SECRET.encode(), f"{now}.".encode() + body, hashlib.sha256)
    doubled = f"t=1,t={now},v1={digest.hexdigest()}".encode()
    headers = [(b"content-type", b"application/json"), (b"stripe-signature", doubled)]
    assert reason(registry, record_of(registry, "stripe", headers, body)) == "bad_signature"
    only_v0 = f"t={now},v0={digest.hexdigest()}".encode()
    headers = [(b"content-type", b"application/json"), (b"stripe-signature", only_v0)]
    assert reason(registry, record_of(registry, "stripe", headers, body)) == "bad_signature"


def test_a_tenant_read_from_the_body_is_still_checked(registry: Registry) -> None:
    body = senders.body_bytes(senders.stripe_event("pi_1", tenant="initech"))
    headers = senders.stripe_request(body)
    assert reason(registry, record_of(registry, "stripe", headers, body)) == "tenant_not_allowed"


@pytest.mark.parametrize(
    "document",
    [
        {"id": "evt", "type": "batch.completed", "data": {}},  # no data.id
        {"id": "evt", "type": "batch.completed", "data": {"id": {"nested": 1}}},
        {"id": "evt", "type": "batch.completed", "data": {"id": None}},
        {"id": "evt", "type": "batch.completed", "data": {"id": True}},
        {"id": "evt", "type": "batch.completed", "data": {"id": ""}},
        {"id": "evt", "type": "batch.completed", "data": ["not", "an", "object"]},
    ],
)
def test_a_body_without_what_the_mapping_reads_is_unmappable(
    registry: Registry, document: object
) -> None:
    body = senders.body_bytes(document)
    headers = senders.standard_request(body, "msg_1")
    assert reason(registry, record_of(registry, "openai", headers, body)) == "unmappable"


def test_a_webhook_record_cannot_also_be_a_cloudevent(registry: Registry) -> None:
    body = senders.body_bytes(senders.openai_batch("batch_abc"))
    record = record_of(registry, "openai", senders.standard_request(body, "msg_1"), body)
    with_ce = replace(record, headers=(*record.headers, (b"ce_tenant", b"globex")))
    assert reason(registry, with_ce) == "ambiguous"
    respelled = replace(record, headers=(*record.headers, (b"Matcher_Webhook", b"github")))
    assert reason(registry, respelled) == "ambiguous"
    # The same bytes named as coming from another producer: its scheme and keys apply.
    renamed = tuple((n, b"stripe" if n == b"matcher_webhook" else v) for n, v in record.headers)
    assert reason(registry, replace(record, headers=renamed)) == "bad_signature"


def test_a_cloudevent_cannot_claim_a_webhook_producer(registry: Registry) -> None:
    record = RawRecord(
        None,
        (
            (b"ce_specversion", b"1.0"), (b"ce_id", b"1"), (b"ce_source", b"openai"),
            (b"ce_type", b"batch.completed"), (b"ce_tenant", b"acme"),
            (b"ce_correlationid", b"batch_abc"),
        ),
        b"{}",
        datetime.now(UTC),
    )  # fmt: skip
    assert reason(registry, record) == "unknown_producer"


def test_the_producers_file_refuses_meaning_from_unsigned_headers() -> None:
    text = senders.PRODUCERS_TOML.replace(
        'type = "github.workflow_run.{/action}"', 'type = "github.{header:x-github-event}"'
    )
    with pytest.raises(RegistryError, match="does not sign the header x-github-event"):
        parse_registry(text, Path("."))


def test_the_producers_file_requires_a_github_id_and_the_right_kind_of_key() -> None:
    no_id = senders.PRODUCERS_TOML.replace(
        'id = "{/workflow_run/id}-{/workflow_run/run_attempt}-{/action}"\n', ""
    )
    with pytest.raises(RegistryError, match=r"mapping\.id is required for github"):
        parse_registry(no_id, Path("."))
    wrong_key = senders.PRODUCERS_TOML.replace(
        f'secret = "{senders.GITHUB_SECRET}"', f'hmac_secret = "{senders.STANDARD_SECRET}"'
    )
    with pytest.raises(RegistryError, match=r"a github key is a secret"):
        parse_registry(wrong_key, Path("."))


def test_templates() -> None:
    template = parse_template("{{literal}}-{/a~1b}-{/list/1}-{/n}")
    body = {"a/b": "x", "list": ["p", "q"], "n": 7}
    assert template.render(body, {}) == "{literal}-x-q-7"
    for bad in ("{/a", "a}", "{nope}", "{/a~2}", "{header:Webhook-Id}"):
        with pytest.raises(TemplateError):
            parse_template(bad)
    with pytest.raises(Unmappable):
        parse_template("{/list/01}").render(body, {})


def test_http_headers_become_the_kafka_binding(registry: Registry) -> None:
    producer = registry.producers["openai"]
    body = b"{}"
    made = to_record(
        replace(producer, webhook=None),
        [(b"content-type", b"application/json"), (b"ce-subject", b"caf%C3%A9"),
         (b"ce-id", b"1"), (b"cookie", b"secret"), (b"authorization", b"Bearer x")],
        body,
        datetime.now(UTC),
    )  # fmt: skip
    assert isinstance(made, RawRecord)
    assert dict(made.headers) == {
        b"content-type": b"application/json", b"ce_subject": "café".encode(), b"ce_id": b"1",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"content-type", b"application/json"), (b"ce_id", b"1")], "ambiguous"),
        ([(b"content-type", b"application/json"), (b"webhook_signature", b"x")], "ambiguous"),
        ([(b"content-type", b"application/json"), (b"matcher_webhook", b"x")], "ambiguous"),
        ([(b"content-type", b"text/plain")], "unsupported_media_type"),
        ([(b"content-type", b"application/x-www-form-urlencoded")], "unsupported_media_type"),
        ([], "unsupported_media_type"),
        ([(b"content-type", b"application/json")] * 2, "ambiguous"),
        ([(b"content-type", b"application/json"), (b"ce-id", b"%zz")], "malformed"),
        ([(b"content-type", b"application/json"), (b"ce-id", b"%ff")], "malformed"),
    ],
)
def test_http_requests_refused_before_the_gate(
    registry: Registry, headers: senders.Headers, expected: str
) -> None:
    producer = replace(registry.producers["openai"], webhook=None)
    made = to_record(producer, headers, b"{}", datetime.now(UTC))
    assert isinstance(made, Refusal)
    assert made.reason == expected


def test_the_docs_webhook_producers_load() -> None:
    page = (Path(__file__).parents[2] / "docs" / "producers" / "webhooks.md").read_text()
    blocks = [b for b in page.split("```toml\n")[1:] if "webhook.scheme" in b.split("```")[0]]
    assert blocks, "the webhooks page shows no webhook producers"
    text = blocks[0].split("```")[0].replace('"whsec_..."', f'"{senders.STANDARD_SECRET}"')
    registry = parse_registry(text, Path("."))
    assert {p: w.scheme for p, w in _webhooks(registry).items()} == {
        "openai": "standard-webhooks", "github-ci": "github", "stripe": "stripe",
    }  # fmt: skip


def _webhooks(registry: Registry) -> dict[str, Any]:
    return {name: p.webhook for name, p in registry.producers.items() if p.webhook is not None}


# Issue findings: deliveries a healthy integration sends and no wait needs are acknowledged
# and dropped; Svix's header names; Unix-second times.


def dropped(registry: Registry, record: RawRecord) -> str:
    judged = judge(record, registry, POLICY)
    assert isinstance(judged, Dropped), judged
    return judged.rule


@pytest.mark.parametrize("action", ["requested", "in_progress"])
def test_a_workflow_run_action_no_wait_needs_is_dropped_by_the_producers_rule(
    registry: Registry, action: str
) -> None:
    body = senders.body_bytes(senders.github_workflow_run(30433642, action=action))
    record = record_of(registry, "github", senders.github_request(body), body)
    assert dropped(registry, record) == "not_completed"
    completed = senders.body_bytes(senders.github_workflow_run(30433642))
    accepted(registry, record_of(registry, "github", senders.github_request(completed), completed))


def test_a_drop_is_only_for_a_verified_delivery(registry: Registry) -> None:
    body = senders.body_bytes(senders.github_workflow_run(30433642, action="requested"))
    forged = senders.github_request(body, secret="not the secret")
    assert reason(registry, record_of(registry, "github", forged, body)) == "bad_signature"
    ping = senders.body_bytes(senders.github_ping())
    forged = senders.github_request(ping, secret="not the secret")
    assert reason(registry, record_of(registry, "github", forged, ping)) == "bad_signature"


def test_a_rule_that_cannot_read_its_field_drops_nothing(registry: Registry) -> None:
    document = senders.github_workflow_run(30433642)
    del document["action"]
    body = senders.body_bytes(document)
    record = record_of(registry, "github", senders.github_request(body), body)
    assert reason(registry, record) == "unmappable"


def test_github_ping_is_dropped_out_of_the_box(registry: Registry) -> None:
    bare = parse_registry(
        senders.PRODUCERS_TOML.replace('not_in = ["completed"]', 'in = ["deleted"]'), Path(".")
    )
    body = senders.body_bytes(senders.github_ping())
    assert dropped(bare, record_of(bare, "github", senders.github_request(body), body)) == "ping"


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ('name = "x"\nfield = "/action"', "exactly one of in, not_in, present"),
        ('name = "x"\nfield = "/action"\nin = ["a"]\npresent = true', "exactly one"),
        ('name = "ping"\nfield = "/zen"\npresent = true', "built-in"),
        ('name = "x"\nfield = "header:x-github-event"\nin = ["ping"]', "does not sign"),
        ('name = "Bad Name"\nfield = "/action"\nin = ["a"]', "name"),
        ('name = "x"\nfield = "action"\nin = ["a"]', "placeholder"),
        ('name = "x"\nfield = "/action"\nnot_in = []', "at least 1"),
    ],
)
def test_a_drop_rule_that_cannot_work_is_refused_at_load(rule: str, problem: str) -> None:
    text = senders.PRODUCERS_TOML.replace(
        '[[producers."github".keys]]',
        f'[[producers."github".webhook.drop]]\n{rule}\n[[producers."github".keys]]',
    )
    with pytest.raises(RegistryError, match=problem):
        parse_registry(text, Path("."))


@pytest.mark.parametrize("keep_standard", [False, True])
def test_svix_header_names_are_accepted_as_svix_accepts_them(
    registry: Registry, keep_standard: bool
) -> None:
    body = senders.body_bytes(senders.openai_batch("batch_abc"))
    headers = senders.svix_spelled(senders.standard_request(body, "msg_1", library="svix"),
                                   keep_standard=keep_standard)  # fmt: skip
    # Svix's own verifier accepts these headers as they are.
    SvixWebhook(senders.STANDARD_SECRET).verify(body, {k.decode(): v.decode() for k, v in headers})
    event = accepted(registry, record_of(registry, "openai", headers, body))
    assert (event.id, event.correlationid) == ("msg_1", "batch_abc")


def test_svix_and_standard_spellings_that_differ_are_ambiguous(registry: Registry) -> None:
    body = senders.body_bytes(senders.openai_batch("batch_abc"))
    headers = senders.svix_spelled(senders.standard_request(body, "msg_1"), keep_standard=True)
    headers = [(n, b"msg_2" if n == b"svix-id" else v) for n, v in headers]
    made = to_record(registry.producers["openai"], headers, body, datetime.now(UTC))
    assert isinstance(made, Refusal), made
    assert made.reason == "ambiguous"


def test_a_unix_seconds_time_is_the_events_time(registry: Registry) -> None:
    body = senders.body_bytes(senders.stripe_event("pi_9"))
    event = accepted(registry, record_of(registry, "stripe", senders.stripe_request(body), body))
    assert event.time == datetime.fromtimestamp(senders.STRIPE_CREATED, UTC)
    document = senders.stripe_event("pi_9")
    document["created"] = str(senders.STRIPE_CREATED)  # a numeric string reads the same
    body = senders.body_bytes(document)
    again = accepted(registry, record_of(registry, "stripe", senders.stripe_request(body), body))
    assert again.time == event.time


@pytest.mark.parametrize(
    "value",
    [10**13, "1765107000.5", -5, "99999999999999", 2024, "20251207", 0, "0001765107000",
     253402300800, " 1765107000", "\uff11\uff17\uff16\uff15\uff11\uff10\uff17\uff10\uff10\uff10"],
)  # fmt: skip
def test_a_time_that_is_not_unix_seconds_or_rfc3339_is_refused(
    registry: Registry, value: Any
) -> None:
    document = senders.stripe_event("pi_9")
    document["created"] = value
    body = senders.body_bytes(document)
    record = record_of(registry, "stripe", senders.stripe_request(body), body)
    judged = judge(record, registry, POLICY)
    assert isinstance(judged, Rejection)
    # The sender's signature was verified: it hears which field, and which forms are read.
    assert (judged.reason, judged.detail[:6]) == ("unmappable", "time: "), judged


@pytest.mark.parametrize(
    "template", ["at {/created}", "{/created} UTC", "yesterday", "{/created}s", "0", "2024"]
)
def test_a_time_template_that_can_never_be_a_time_is_refused_at_load(template: str) -> None:
    text = senders.PRODUCERS_TOML.replace('time = "{/created}"', f'time = "{template}"')
    assert text != senders.PRODUCERS_TOML
    with pytest.raises(RegistryError, match=r"mapping\.time"):
        parse_registry(text, Path("."))


@pytest.mark.parametrize("structured", [False, True])
def test_a_cloudevent_over_http_signed_by_the_sdk_helper_is_accepted_and_tamper_evident(
    registry: Registry, structured: bool
) -> None:
    """The producer SDK's sign_http over what the CloudEvents SDK writes (binary mode: its
    ce- headers percent-encoded) verifies at the ingress; a changed attribute does not."""
    headers, body = senders.cloudevent_request("job é 7", "ce-9", structured=structured)
    event = accepted(registry, record_of(registry, "ce-svc", headers, body))
    assert (event.id, event.correlationid) == ("ce-9", "job é 7")
    if structured:
        tampered_body = body.replace(b"job \\u00e9 7", b"job-8").replace(
            "job é 7".encode(), b"job-8"
        )
        assert tampered_body != body
        tampered = record_of(registry, "ce-svc", headers, tampered_body)
    else:
        changed = [(n, b"job%20%C3%A9%208" if n == b"ce-correlationid" else v) for n, v in headers]
        tampered = record_of(registry, "ce-svc", changed, body)
    assert reason(registry, tampered) == "bad_signature"
