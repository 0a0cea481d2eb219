"""The producer SDK and both emit commands against the real daemon, signatures required."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from pathlib import Path

import psycopg
from matcher_producer import CompletionEvent, EventPublisher, SigningKey

from matcher.config import Settings
from matcher.domain.waits import WaitSpec
from matcher.sdk import register_wait
from tests.support.kafka import read_resumes
from tests.support.processes import process_env, running_daemon

SECRET = "whsec_" + base64.b64encode(b"sdk-test-secret-0123456789abcdef").decode()
ED_SEED = b"e" * 32


def _setup(settings: Settings, tmp_path: Path) -> Settings:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    public = (
        Ed25519PrivateKey.from_private_bytes(ED_SEED)
        .public_key()
        .public_bytes(Encoding.Raw, PublicFormat.Raw)
    )
    producers = tmp_path / "producers.toml"
    producers.write_text(
        f"""
[producers."billing-svc"]
tenants = ["acme"]
types = ["job.completed"]
[[producers."billing-svc".keys]]
id = "hmac"
hmac_secret = "{SECRET}"
[[producers."billing-svc".keys]]
id = "ed"
ed25519_public_key = "whpk_{base64.b64encode(public).decode()}"
"""
    )
    secure = settings.model_copy(update={"allow_unsigned": False, "producers_file": producers})
    with psycopg.connect(secure.database_url.get_secret_value(), autocommit=True) as conn:
        for n in range(4):
            register_wait(
                conn,
                WaitSpec(
                    tenant="acme",
                    run_id=f"run-{n}",
                    position=0,
                    event_types=["job.completed"],
                    correlation_id=f"sdk-{n}",
                ),
            )
    return secure


async def test_sdk_publisher_and_both_emit_commands(settings: Settings, tmp_path: Path) -> None:
    secure = _setup(settings, tmp_path)
    key_file = tmp_path / "billing.key"
    key_file.write_text(SECRET)
    ed_file = tmp_path / "ring.toml"
    ed_file.write_text(f'[keys]\ned = "whsk_{base64.b64encode(ED_SEED).decode()}"\n')
    env = process_env(secure)
    async with running_daemon(secure):
        async with EventPublisher(
            secure.kafka_bootstrap_servers,
            secure.events_topic,
            SigningKey.parse("hmac", SECRET),
            structured=True,
        ) as publisher:
            await publisher.publish(
                CompletionEvent(
                    source="billing-svc",
                    type="job.completed",
                    tenant="acme",
                    correlation_id="sdk-0",
                )
            )
        sdk_cli = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable, "-m", "matcher_producer.cli",
                "--bootstrap-servers", secure.kafka_bootstrap_servers,
                "--topic", secure.events_topic,
                "--source", "billing-svc", "--type", "job.completed", "--tenant", "acme",
                "--correlation", "sdk-1", "--key-file", str(ed_file),
            ],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert sdk_cli.returncode == 0, sdk_cli.stderr
        matcher_cli = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable, "-m", "matcher", "emit",
                "--source", "billing-svc", "--type", "job.completed", "--tenant", "acme",
                "--correlation", "sdk-2", "--key-file", str(key_file), "--data", '{"a": 1}',
            ],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert matcher_cli.returncode == 0, matcher_cli.stderr
        unsigned = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable, "-m", "matcher", "emit",
                "--source", "billing-svc", "--type", "job.completed", "--tenant", "acme",
                "--correlation", "sdk-3",
            ],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert unsigned.returncode == 0, unsigned.stderr
        resumes = await read_resumes(secure, at_least=3)
    assert sorted(r.run_id for r in resumes) == ["run-0", "run-1", "run-2"]  # not run-3
