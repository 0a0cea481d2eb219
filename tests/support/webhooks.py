"""Webhook requests as real senders make them, signed by independent libraries.

The Standard Webhooks requests are signed by the ``standardwebhooks`` or ``svix``
package, Stripe's by the ``stripe`` package, GitHub's as GitHub's documentation says (a
test holds that to GitHub's published vector). Each returns lowercase header names and the
exact body bytes, as an HTTP server hands them over.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any

import standardwebhooks
import stripe
from cloudevents.core.bindings.http import to_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from matcher_producer.http import sign_http
from matcher_producer.signing import SigningKey
from svix.webhooks import Webhook as SvixWebhook

Headers = list[tuple[bytes, bytes]]

STANDARD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
GITHUB_SECRET = "It's a Secret to Everybody"
STRIPE_SECRET = "whsec_test_7bYf3k2Lm9Qp"

PRODUCERS_TOML = f'''
[producers."ce-svc"]
tenants = ["acme"]
types = ["job.completed"]
[[producers."ce-svc".keys]]
id = "k1"
hmac_secret = "{STANDARD_SECRET}"
[producers."openai"]
tenants = ["acme"]
types = ["batch.completed", "batch.failed"]
webhook.scheme = "standard-webhooks"
webhook.mapping = {{ type = "{{/type}}", correlationid = "{{/data/id}}", tenant = "acme" }}
[[producers."openai".keys]]
id = "k1"
hmac_secret = "{STANDARD_SECRET}"

[producers."github"]
tenants = ["acme"]
types = ["github.workflow_run.completed"]
webhook.scheme = "github"
[producers."github".webhook.mapping]
id = "{{/workflow_run/id}}-{{/workflow_run/run_attempt}}-{{/action}}"
type = "github.workflow_run.{{/action}}"
correlationid = "{{/workflow_run/id}}"
jobid = "{{/workflow_run/head_sha}}"
tenant = "acme"
[[producers."github".webhook.drop]]
name = "not_completed"
field = "/action"
not_in = ["completed"]
[[producers."github".keys]]
id = "k1"
secret = "{GITHUB_SECRET}"

[producers."stripe"]
tenants = ["acme", "globex"]
types = ["payment_intent.succeeded", "payment_intent.payment_failed"]
webhook.scheme = "stripe"
[producers."stripe".webhook.mapping]
type = "{{/type}}"
correlationid = "{{/data/object/id}}"
tenant = "{{/data/object/metadata/tenant}}"
time = "{{/created}}"
[[producers."stripe".keys]]
id = "k1"
secret = "{STRIPE_SECRET}"
'''


def body_bytes(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def openai_batch(batch_id: str, event_id: str = "evt_1", kind: str = "batch.completed") -> Any:
    return {"id": event_id, "object": "event", "created_at": int(time.time()), "type": kind,
            "data": {"id": batch_id}}  # fmt: skip


def standard_request(
    body: bytes,
    msg_id: str,
    secret: str = STANDARD_SECRET,
    when: datetime | None = None,
    library: str = "standardwebhooks",
) -> Headers:
    when = when or datetime.now(UTC)
    signer = (
        standardwebhooks.Webhook(secret) if library == "standardwebhooks" else SvixWebhook(secret)
    )
    signature = signer.sign(msg_id, when, body.decode())
    return [
        (b"content-type", b"application/json"),
        (b"webhook-id", msg_id.encode()),
        (b"webhook-timestamp", str(int(when.timestamp())).encode()),
        (b"webhook-signature", signature.encode()),
    ]


def github_workflow_run(run_id: int, attempt: int = 1, action: str = "completed") -> Any:
    return {"action": action, "workflow_run": {"id": run_id, "run_attempt": attempt,
            "head_sha": "9f2c1d0", "status": "completed", "conclusion": "success"},
            "repository": {"full_name": "acme/app"}}  # fmt: skip


def github_ping(hook_id: int = 109948940) -> Any:
    # What GitHub sends when a hook is created (its documented "ping" payload, trimmed).
    return {"zen": "Keep it logically awesome.", "hook_id": hook_id,
            "hook": {"type": "Repository", "id": hook_id, "events": ["workflow_run"],
                     "config": {"content_type": "json", "insecure_ssl": "0"}},
            "repository": {"full_name": "acme/app"}}  # fmt: skip


def svix_spelled(headers: Headers, keep_standard: bool = False) -> Headers:
    """A Standard Webhooks request as Svix-based senders spell it (svix-id, ...), with the
    webhook-* headers too when ``keep_standard``."""
    out: Headers = []
    for name, value in headers:
        if name.startswith(b"webhook-"):
            out.append((b"svix-" + name.removeprefix(b"webhook-"), value))
            if keep_standard:
                out.append((name, value))
        else:
            out.append((name, value))
    return out


def github_signature(body: bytes, secret: str = GITHUB_SECRET) -> bytes:
    # GitHub: "an HMAC hex digest of the request body ... using the SHA-256 hash function
    # and the secret as the HMAC key", prefixed with sha256=.
    return b"sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest().encode()


def github_request(body: bytes, secret: str = GITHUB_SECRET, delivery: str = "d-1") -> Headers:
    return [
        (b"content-type", b"application/json"),
        (b"x-github-event", b"workflow_run"),
        (b"x-github-delivery", delivery.encode()),
        (b"x-hub-signature-256", github_signature(body, secret)),
    ]


STRIPE_CREATED = 1765107000  # Unix seconds, as Stripe's created: 2025-12-07T11:30:00Z


def stripe_event(intent_id: str, tenant: str = "acme", event_id: str = "evt_s1") -> Any:
    return {"id": event_id, "object": "event", "type": "payment_intent.succeeded",
            "created": STRIPE_CREATED,
            "data": {"object": {"id": intent_id, "object": "payment_intent",
                                "metadata": {"tenant": tenant}}}}  # fmt: skip


def stripe_request(body: bytes, secret: str = STRIPE_SECRET, when: int | None = None) -> Headers:
    header = stripe.WebhookSignature.generate_signature_header(
        body.decode(), secret, timestamp=when if when is not None else int(time.time())
    )
    return [(b"content-type", b"application/json"), (b"stripe-signature", header.encode())]


def cloudevent_request(
    correlation: str, event_id: str, *, structured: bool, source: str = "ce-svc"
) -> tuple[Headers, bytes]:
    """A CloudEvent over HTTP as the CloudEvents SDK writes it, signed the Standard
    Webhooks way (binary mode: over the attributes, percent-decoded, and the data)."""
    event = CloudEvent(
        attributes={"id": event_id, "source": source, "type": "job.completed",
                    "specversion": "1.0", "tenant": "acme", "correlationid": correlation,
                    "datacontenttype": "application/json"},
        data={"status": "succeeded"},
    )  # fmt: skip
    message = (to_structured if structured else to_binary)(event, JSONFormat())
    # Signed by the producer SDK's helper over what the CloudEvents SDK wrote: binary
    # mode's ce- values percent-decoded, as the ingress reads them.
    signed = sign_http(
        message.headers.items(), message.body, [SigningKey.parse("k1", STANDARD_SECRET)]
    )
    return [(n.encode(), v.encode()) for n, v in signed], message.body
