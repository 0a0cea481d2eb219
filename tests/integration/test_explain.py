"""Every explain verdict, produced by a real scenario on the real services (invariant 8)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from matcher_producer import CompletionEvent as ProducerEvent
from matcher_producer import SigningKey, encode, sign_record

from matcher.admin.explain import explain_run
from matcher.config import Settings
from matcher.domain.explain import Explanation, Verdict
from matcher.domain.waits import WaitSpec
from matcher.sdk import cancel_wait, register_wait
from tests.helpers import (
    event,
    eventually,
    process_env,
    produce,
    produce_raw,
    read_resumes,
    rematch_all,
    running_daemon,
    scalar,
)


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
    assert found.evidence["resume"]["published_at"] is not None


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
        await asyncio.sleep(1)  # the group has joined; nothing is lagging
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
        await asyncio.sleep(1)  # join the group once, so committed offsets exist
    # The daemon is down: events pile up unread, and a deadline passes unswept.
    _register(settings, "r-sweep", "c-sweep", deadline=datetime.now(UTC) - timedelta(seconds=3))
    await produce(settings, [event(correlation="c-lag")] + [event() for _ in range(30)])
    lagging = await _explain(settings, "r-lag")
    assert lagging.verdict is Verdict.BACKLOG
    partition = lagging.evidence["partition"]
    assert lagging.evidence["consumer_lag"][str(partition)] > 0
    assert f"consumer lag on partition {partition}" in " ".join(lagging.reasons)
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
        conn.execute("UPDATE matcher.outbox SET created_at = now() - interval '1 minute'")
    found = await _explain(settings, "r-unpub")
    assert found.verdict is Verdict.RESOLVED_BY_EVENT
    assert found.evidence["resume"]["published_at"] is None
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
    unknown = cli("no-such-run")
    assert unknown.returncode == 1
    assert "no waits for run" in unknown.stderr
