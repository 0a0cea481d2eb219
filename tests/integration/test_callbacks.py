"""A callback URL per wait, end to end: the real ingress (with a database) in front of real
Postgres, the real daemon publishing the resumes to real Kafka.

What is checked is behaviour: which wait resolved, what was stored in the inbox and the
outbox, what the resume says, and what the sender was answered.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from matcher.config import Settings
from matcher.domain.callbacks import CALLBACK_PATH, callback_url
from matcher.domain.waits import WaitSpec
from matcher.sdk import cancel_wait, issue_callback, register_wait
from tests.support.assertions import eventually
from tests.support.db import rows, scalar
from tests.support.ingress import HTTP_TIMEOUT, running_ingress
from tests.support.kafka import read_resumes
from tests.support.processes import IngressProcess, run_cli, running_daemon

pytestmark = pytest.mark.timeout(240)

TYPES = ["job.completed", "job.failed"]  # stored sorted: job.completed is the first


@pytest.fixture
def callbacks(webhooks_secure: Settings) -> Iterator[IngressProcess]:
    """The ingress with a database: it serves callback URLs."""
    with running_ingress(webhooks_secure, database=True) as process:
        yield process


def _connect(settings: Settings) -> psycopg.Connection[Any]:
    return psycopg.connect(settings.database_url.get_secret_value(), autocommit=True)


def _wait(
    settings: Settings,
    correlation: str,
    *,
    tenant: str = "acme",
    run_id: str | None = None,
    deadline: datetime | None = None,
    callback: bool = True,
) -> tuple[uuid.UUID, str]:
    """A waiting wait (and its callback token, issued in the same transaction)."""
    with _connect(settings) as conn, conn.transaction():
        spec = WaitSpec(
            tenant=tenant, run_id=run_id or f"run-{correlation}", position=0,
            event_types=TYPES, correlation_id=correlation, deadline=deadline,
        )  # fmt: skip
        wait = register_wait(conn, spec)
        return wait.id, issue_callback(conn, wait.id) if callback else ""


def _post(
    ingress: IngressProcess,
    token: str,
    body: Any,
    *,
    query: str = "",
    content_type: str = "application/json",
) -> httpx.Response:
    assert ingress.address is not None
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    # Built by hand, not by callback_url: malformed tokens are sent too.
    return httpx.post(
        f"{ingress.address}{CALLBACK_PATH}{token}{query}",
        content=content,
        headers={"content-type": content_type},
        timeout=HTTP_TIMEOUT,
    )


def _stored(settings: Settings, wait_id: uuid.UUID) -> list[dict[str, Any]]:
    return rows(
        settings,
        "SELECT producer, event_id, type, data, status, consumed_by, late_for"
        " FROM matcher.inbox WHERE producer = 'callback' AND event_id = %s",
        (str(wait_id),),
    )


def _resolutions(settings: Settings, wait_id: uuid.UUID) -> int:
    return int(
        scalar(settings, "SELECT count(*) FROM matcher.resolutions WHERE wait_id = %s", (wait_id,))
    )


def _state(settings: Settings, wait_id: uuid.UUID) -> str:
    return str(scalar(settings, "SELECT state FROM matcher.waits WHERE id = %s", (wait_id,)))


@pytest.mark.smoke
async def test_a_callback_completes_exactly_its_wait_and_the_resume_carries_its_body(
    webhooks_secure: Settings, callbacks: IngressProcess
) -> None:
    # Two waits of one key: an event of the key would resolve the older one; the callback
    # resolves the one it was issued for, and only that one.
    older, _ = _wait(webhooks_secure, "job-7", run_id="run-older", callback=False)
    wait_id, token = _wait(webhooks_secure, "job-7", run_id="run-newer")
    body = {"status": "done", "n": 1.5, "big": 12345678901234567890}
    async with running_daemon(webhooks_secure):
        answer = _post(callbacks, token, body)
        assert answer.status_code == 202, answer.text
        assert answer.json()["accepted"] is True
        outcome = answer.json()["outcome"]
        assert outcome["state"] == "matched"
        assert outcome["by_callback"] is True
        (resume,) = await read_resumes(webhooks_secure, at_least=1)
    assert resume.run_id == "run-newer"
    assert resume.wait_id == wait_id
    assert resume.event is not None
    assert resume.event.source == "callback"
    assert resume.event.id == str(wait_id)
    assert resume.event.type == "job.completed"
    assert resume.event.data == body
    assert _state(webhooks_secure, older) == "waiting"
    assert _stored(webhooks_secure, wait_id) == [
        {"producer": "callback", "event_id": str(wait_id), "type": "job.completed",
         "data": body, "status": "consumed", "consumed_by": wait_id, "late_for": None},
    ]  # fmt: skip
    # The second POST: 409 with the first outcome; nothing more stored or resolved.
    again = _post(callbacks, token, {"status": "other"})
    assert again.status_code == 409, again.text
    assert again.json() == {"reason": "duplicate", "outcome": outcome}
    assert _resolutions(webhooks_secure, wait_id) == 1
    assert len(_stored(webhooks_secure, wait_id)) == 1
    # The token is never logged: a short prefix of its digest is.
    assert token not in callbacks.output


async def test_two_concurrent_posts_one_202_one_409_one_resolution(
    webhooks_secure: Settings, callbacks: IngressProcess
) -> None:
    waits = [_wait(webhooks_secure, f"race-{i}") for i in range(6)]
    assert callbacks.address is not None
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:

        async def post(token: str, n: int) -> httpx.Response:
            return await client.post(
                callback_url(str(callbacks.address), token),
                json={"n": n},
                headers={"content-type": "application/json"},
            )

        for wait_id, token in waits:
            first, second = await asyncio.gather(post(token, 1), post(token, 2))
            by_status = {first.status_code: first, second.status_code: second}
            assert sorted(by_status) == [202, 409], (first.text, second.text)
            assert by_status[409].json()["outcome"] == by_status[202].json()["outcome"]
            assert _resolutions(webhooks_secure, wait_id) == 1
            (stored,) = _stored(webhooks_secure, wait_id)
            # The body stored is the accepted request's.
            accepted = first if first.status_code == 202 else second
            assert stored["data"] == json.loads(accepted.request.content)


async def test_a_callback_after_the_deadline_is_kept_late_linked_to_its_wait_and_gone(
    webhooks_secure: Settings, callbacks: IngressProcess
) -> None:
    deadline = datetime.now(UTC) + timedelta(seconds=1)
    wait_id, token = _wait(webhooks_secure, "slow-job", deadline=deadline)
    await eventually(lambda: datetime.now(UTC) > deadline, timeout=10, what="the deadline")
    answer = _post(callbacks, token, {"too": "late"})
    assert answer.status_code == 410, answer.text
    assert answer.json()["reason"] == "late"
    (stored,) = _stored(webhooks_secure, wait_id)
    assert (stored["status"], stored["late_for"], stored["consumed_by"]) == (
        "late", wait_id, None,
    )  # fmt: skip
    # The sweeper times the wait out as it would have without the callback.
    async with running_daemon(webhooks_secure):
        (resume,) = await read_resumes(webhooks_secure, at_least=1)
    assert resume.wait_id == wait_id
    assert resume.outcome.value == "timeout"
    again = _post(callbacks, token, {"too": "late"})
    assert again.status_code == 409, again.text
    assert again.json()["outcome"]["state"] == "timed_out"
    # Cancelled before its callback: 410 too, and stored late.
    cancelled, token = _wait(webhooks_secure, "cancelled-job")
    with _connect(webhooks_secure) as conn:
        assert cancel_wait(conn, cancelled)
    answer = _post(callbacks, token, {})
    assert answer.status_code == 410, answer.text
    assert answer.json()["outcome"]["state"] == "cancelled"
    assert [s["late_for"] for s in _stored(webhooks_secure, cancelled)] == [cancelled]


async def test_a_wait_resolved_by_an_event_answers_its_callback_409(
    webhooks_secure: Settings, callbacks: IngressProcess
) -> None:
    wait_id, token = _wait(webhooks_secure, "evented")
    with _connect(webhooks_secure) as conn:  # as ingest would: resolved by another event
        conn.execute(
            "SELECT matcher.resolve_waits(ARRAY[%s]::uuid[], 'matched', 'event', 'event',"
            " ARRAY['billing'], ARRAY['evt-1'])",
            (wait_id,),
        )
    answer = _post(callbacks, token, {"x": 1})
    assert answer.status_code == 409, answer.text
    assert answer.json()["reason"] == "resolved"
    assert answer.json()["outcome"]["by_callback"] is False
    assert [s["status"] for s in _stored(webhooks_secure, wait_id)] == ["late"]


def test_unknown_tokens_bodies_over_the_limit_and_malformed_requests_are_4xx(
    webhooks_secure: Settings, callbacks: IngressProcess
) -> None:
    wait_id, token = _wait(webhooks_secure, "refusals")
    unknown = secrets.token_urlsafe(32)
    answer = _post(callbacks, unknown, {"x": 1})
    assert (answer.status_code, answer.json()) == (404, {"reason": "unknown_callback"})
    for malformed in ("short", token + "A", token[:-1] + "*", "%00" * 43):
        assert _post(callbacks, malformed, {"x": 1}).status_code == 404, malformed
    limit = webhooks_secure.max_event_bytes
    too_large = _post(callbacks, token, {"pad": "x" * limit})
    assert (too_large.status_code, too_large.json()) == (413, {"reason": "too_large"})
    refusals = {
        (b"not json", "application/json", ""): (400, "malformed"),
        (b'{"a": 1, "a": 2}', "application/json", ""): (400, "ambiguous"),
        (b"1e400", "application/json", ""): (400, "malformed"),
        (b"{}", "text/plain", ""): (415, "unsupported_media_type"),
        (b"{}", "application/json", "?type=job.completed&type=job.failed"): (400, "ambiguous"),
        (b"{}", "application/json", "?tenant=globex"): (400, "malformed"),
        (b"{}", "application/json", "?type=job.other"): (403, "type_not_allowed"),
    }
    for (body, content_type, query), (status, reason) in refusals.items():
        refused = _post(callbacks, token, body, query=query, content_type=content_type)
        assert (refused.status_code, refused.json()) == (status, {"reason": reason}), body
    assert _stored(webhooks_secure, wait_id) == []
    assert _state(webhooks_secure, wait_id) == "waiting"
    # The type chosen, any JSON value as the data.
    chosen = _post(callbacks, token, [1, "two", None], query="?type=job.failed")
    assert chosen.status_code == 202, chosen.text
    (stored,) = _stored(webhooks_secure, wait_id)
    assert (stored["type"], stored["data"]) == ("job.failed", [1, "two", None])


def test_the_cli_registers_a_wait_with_its_callback(
    webhooks_secure: Settings, callbacks: IngressProcess
) -> None:
    done = run_cli(
        webhooks_secure, "waits", "add", "--tenant", "acme", "--run", "cli-run",
        "--position", "0", "--type", "job.completed", "--correlation", "cli-job",
        "--callback", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    added = json.loads(done.stdout)
    assert added["callback_path"] == CALLBACK_PATH + added["callback_token"]
    assert _post(callbacks, added["callback_token"], {"ok": True}).status_code == 202
    assert _state(webhooks_secure, uuid.UUID(added["id"])) == "matched"
    text = run_cli(
        webhooks_secure, "waits", "add", "--tenant", "acme", "--run", "cli-run-2",
        "--position", "0", "--type", "job.completed", "--correlation", "cli-job-2",
        "--callback",
    )  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[1].startswith(f"callback {CALLBACK_PATH}")


def test_issuing_again_replaces_the_token_and_only_waiting_waits_get_one(
    webhooks_secure: Settings, callbacks: IngressProcess
) -> None:
    wait_id, first = _wait(webhooks_secure, "reissued")
    with _connect(webhooks_secure) as conn:
        second = issue_callback(conn, wait_id)
        with pytest.raises(LookupError):
            issue_callback(conn, uuid.uuid4())
    assert first != second
    assert _post(callbacks, first, {}).status_code == 404
    assert _post(callbacks, second, {}).status_code == 202
    with _connect(webhooks_secure) as conn, pytest.raises(ValueError, match="not waiting"):
        issue_callback(conn, wait_id)
    # Only digests are stored: no token can be read back from the database.
    stored = rows(webhooks_secure, "SELECT token_sha256 FROM matcher.callbacks")
    assert all(len(bytes(r["token_sha256"])) == 32 for r in stored)


def test_without_a_database_the_callback_route_answers_501(
    webhooks_secure: Settings, ingress: IngressProcess
) -> None:
    answer = _post(ingress, secrets.token_urlsafe(32), {"x": 1})
    assert (answer.status_code, answer.json()) == (501, {"reason": "callbacks_disabled"})


def test_the_ingress_role_needs_only_the_one_function(
    webhooks_secure: Settings, callbacks: IngressProcess
) -> None:
    """complete_callback_v1 runs with its owner's rights: an ingress that connects as a
    role allowed that function alone completes callbacks, and can read or write nothing
    else (taking it over gains no more than its HTTP route)."""
    role = f"ingress_{uuid.uuid4().hex[:12]}"
    wait_id, token = _wait(webhooks_secure, "least-privilege")
    with _connect(webhooks_secure) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN'.encode())
    try:
        with _connect(webhooks_secure) as conn:
            conn.execute(f'GRANT USAGE ON SCHEMA matcher TO "{role}"'.encode())
            conn.execute(
                "GRANT EXECUTE ON FUNCTION matcher.complete_callback_v1(bytea, jsonb, text, text)"
                f' TO "{role}"'.encode()
            )
        url = psycopg.conninfo.make_conninfo(
            webhooks_secure.database_url.get_secret_value(), user=role
        )
        with running_ingress(
            webhooks_secure, database=True, MATCHER_DATABASE_URL=url
        ) as restricted:
            assert _post(restricted, token, {"ok": 1}).status_code == 202
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in (
                "SELECT * FROM matcher.callbacks",
                "SELECT * FROM matcher.waits",
                "SELECT matcher.issue_callback_v1(gen_random_uuid())",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement.encode())
    finally:
        with _connect(webhooks_secure) as conn:
            conn.execute(f'DROP OWNED BY "{role}"'.encode())
            conn.execute(f'DROP ROLE "{role}"'.encode())
    assert _state(webhooks_secure, wait_id) == "matched"
