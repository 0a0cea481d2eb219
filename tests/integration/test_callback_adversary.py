"""Attacks on callback tokens, black box, against the real ingress and Postgres: guessing,
replaying, and using one tenant's token against another tenant's waits.

The token is the whole credential for one wait: these tests hold that nothing else a
request carries can widen what it reaches, and that everything but the exact token is
refused without storing anything.
"""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from matcher.config import Settings
from matcher.domain.callbacks import CALLBACK_PATH
from matcher.domain.waits import WaitSpec
from matcher.sdk import issue_callback, register_wait
from tests.support.db import rows, scalar
from tests.support.ingress import HTTP_TIMEOUT, running_ingress
from tests.support.processes import IngressProcess

pytestmark = pytest.mark.timeout(240)

TYPES = ["job.completed"]
_TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


@pytest.fixture
def callbacks(webhooks_secure: Settings) -> Iterator[IngressProcess]:
    with running_ingress(webhooks_secure, database=True) as process:
        yield process


def _wait(settings: Settings, tenant: str, correlation: str, run_id: str) -> tuple[uuid.UUID, str]:
    url = settings.database_url.get_secret_value()
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        spec = WaitSpec(
            tenant=tenant, run_id=run_id, position=0, event_types=TYPES,
            correlation_id=correlation,
        )  # fmt: skip
        wait = register_wait(conn, spec)
        return wait.id, issue_callback(conn, wait.id)


def _post(
    client: httpx.Client, ingress: IngressProcess, path: str, body: Any, **headers: str
) -> httpx.Response:
    return client.post(
        f"{ingress.address}{CALLBACK_PATH}{path}",
        content=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
    )


def _callback_events(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM matcher.inbox WHERE producer = 'callback'"))


def _near_misses(token: str) -> list[str]:
    """Tokens one step from the real one: a character changed at each end and in the
    middle, the case swapped, the digest's neighbours in base64 (the raw bytes off by
    one), the standard alphabet, padding."""
    raw = base64.urlsafe_b64decode(token + "=")
    neighbour = (int.from_bytes(raw) + 1) % 2**256
    misses = [
        token.swapcase(),
        base64.urlsafe_b64encode(neighbour.to_bytes(32)).rstrip(b"=").decode(),
        base64.b64encode(raw).rstrip(b"=").decode(),
        token + "=",
        token[:-1],
        token + "A",
    ]
    for at in (0, len(token) // 2, len(token) - 1):
        other = "B" if token[at] == "A" else "A"
        misses.append(token[:at] + other + token[at + 1 :])
    return [m for m in misses if m != token]


def test_guessed_tokens_are_404_and_store_nothing(
    webhooks_secure: Settings, callbacks: IngressProcess
) -> None:
    """Random tokens and near misses of a real one: 404 every time, nothing stored, the
    wait untouched; the real token still works after the guessing. (A guess succeeds with
    probability n / 2**256 for n live tokens: the test shows no shortcut, e.g. a prefix or
    a case-insensitive match, makes it likelier.)"""
    wait_id, token = _wait(webhooks_secure, "acme", "guess-me", "run-guess")
    guesses = [secrets.token_urlsafe(32) for _ in range(200)] + _near_misses(token)
    with httpx.Client(timeout=HTTP_TIMEOUT) as client:
        for guess in guesses:
            answer = _post(client, callbacks, guess, {"guess": guess})
            assert answer.status_code == 404, (guess, answer.text)
            assert answer.json() == {"reason": "unknown_callback"}
        assert _callback_events(webhooks_secure) == 0
        assert _post(client, callbacks, token, {"real": True}).status_code == 202
    state = scalar(webhooks_secure, "SELECT state FROM matcher.waits WHERE id = %s", (wait_id,))
    assert state == "matched"


def test_a_replayed_callback_is_409_and_changes_nothing(
    webhooks_secure: Settings, callbacks: IngressProcess
) -> None:
    """Someone who captured a used callback URL replays it, with the same body or another,
    another type, other headers: every replay is 409 with the first outcome; one event,
    one resolution, the first body."""
    wait_id, token = _wait(webhooks_secure, "acme", "replayed", "run-replayed")
    with httpx.Client(timeout=HTTP_TIMEOUT) as client:
        first = _post(client, callbacks, token, {"n": 1})
        assert first.status_code == 202, first.text
        replays = [
            _post(client, callbacks, token, {"n": 1}),
            _post(client, callbacks, token, {"n": 2, "forged": True}),
            _post(client, callbacks, token + "?type=job.completed", {"n": 3}),
            _post(client, callbacks, token, {"n": 4}, traceparent=_TRACEPARENT),
        ]  # fmt: skip
    for replay in replays:
        assert replay.status_code == 409, replay.text
        assert replay.json() == {"reason": "duplicate", "outcome": first.json()["outcome"]}
    assert _callback_events(webhooks_secure) == 1
    stored = rows(webhooks_secure, "SELECT data FROM matcher.inbox WHERE producer = 'callback'")
    assert [r["data"] for r in stored] == [{"n": 1}]
    assert (
        scalar(
            webhooks_secure,
            "SELECT count(*) FROM matcher.resolutions WHERE wait_id = %s",
            (wait_id,),
        )
        == 1
    )


def test_a_token_of_one_tenant_completes_nothing_of_another(
    webhooks_secure: Settings, callbacks: IngressProcess
) -> None:
    """Two tenants with waits alike in every other way (same correlation id, run id and
    types). A request names no tenant and no wait: the token's digest selects one wait, so
    tenant A's token can only ever reach A's wait. Query parameters and headers that try to
    name B (as a CloudEvent or a webhook mapping would) are refused or ignored; B's wait
    stays waiting, and B's own token still works."""
    wait_a, token_a = _wait(webhooks_secure, "acme", "shared-key", "run-1")
    wait_b, token_b = _wait(webhooks_secure, "globex", "shared-key", "run-1")
    with httpx.Client(timeout=HTTP_TIMEOUT) as client:
        named = _post(client, callbacks, token_a + "?tenant=globex", {})
        assert (named.status_code, named.json()) == (400, {"reason": "malformed"})
        answer = _post(
            client, callbacks, token_a, {"tenant": "globex"},
            **{"ce-tenant": "globex", "ce-correlationid": "shared-key", "ce-source": "globex"},
        )  # fmt: skip
        assert answer.status_code == 202, answer.text
        states = {
            r["tenant"]: r["state"]
            for r in rows(webhooks_secure, "SELECT tenant, state FROM matcher.waits")
        }
        assert states == {"acme": "matched", "globex": "waiting"}
        # A's token again, now for B's sake: a duplicate of A's, nothing of B's.
        assert _post(client, callbacks, token_a, {}).status_code == 409
        assert _post(client, callbacks, token_b, {}).status_code == 202
    stored = rows(
        webhooks_secure,
        "SELECT tenant, event_id, consumed_by FROM matcher.inbox WHERE producer = 'callback'"
        " ORDER BY tenant",
    )
    assert stored == [
        {"tenant": "acme", "event_id": str(wait_a), "consumed_by": wait_a},
        {"tenant": "globex", "event_id": str(wait_b), "consumed_by": wait_b},
    ]
