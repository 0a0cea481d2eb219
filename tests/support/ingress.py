"""The webhook ingress for tests: the webhook producers' file (tests/support/webhooks.py),
the ingress as a process with those producers, and requests to it."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg

from matcher.config import Settings
from matcher.domain.waits import WaitSpec
from matcher.sdk import register_wait
from tests.support import webhooks
from tests.support.processes import IngressProcess, process_env

HTTP_TIMEOUT = httpx.Timeout(20.0)


def producers_file(directory: Path, extra: str = "") -> Path:
    """The webhook senders' producers (and ``extra`` TOML) in ``directory``."""
    path = directory / "producers.toml"
    path.write_text(webhooks.PRODUCERS_TOML + extra)
    return path


def ingress_env(settings: Settings, *, database: bool = False, **extra: str) -> dict[str, str]:
    env = process_env(settings, MATCHER_ALLOW_UNSIGNED="false", **extra)
    env["MATCHER_PRODUCERS_FILE"] = str(settings.producers_file)
    if not database:
        env.pop("MATCHER_DATABASE_URL")  # webhooks need no database: callbacks only
    return env


@contextlib.contextmanager
def running_ingress(
    settings: Settings, *, database: bool = False, **extra: str
) -> Iterator[IngressProcess]:
    """``matcher ingress`` with these settings, ready; it must stop cleanly after. With
    ``database``, it serves callback URLs too."""
    process = IngressProcess(ingress_env(settings, database=database, **extra))
    try:
        process.wait_listening()
        process.wait_ready()
        yield process
    finally:
        assert process.stop() == 0, process.output


def host_port(ingress: IngressProcess) -> tuple[str, int]:
    assert ingress.address is not None
    match = re.fullmatch(r"http://([\d.]+):(\d+)", ingress.address)
    assert match is not None
    return match.group(1), int(match.group(2))


def post(address: str, producer: str, headers: webhooks.Headers, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{address}/v1/webhooks/{producer}",
        content=body,
        headers=[(n.decode(), v.decode()) for n, v in headers],
        timeout=HTTP_TIMEOUT,
    )


def metrics_text(address: str) -> str:
    return httpx.get(f"{address}/metrics", timeout=HTTP_TIMEOUT).text


def wait_for(settings: Settings, tenant: str, event_type: str, correlation: str) -> str:
    """A waiting wait for ``correlation``; its run id."""
    run_id = f"run-{correlation}"
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        register_wait(
            conn,
            WaitSpec(
                tenant=tenant, run_id=run_id, position=0, event_types=[event_type],
                correlation_id=correlation,
            ),
        )  # fmt: skip
    return run_id
