"""The admin HTTP API of a running daemon: its OpenAPI contract (schemathesis), the bearer
token, readiness, explain over HTTP, and metrics scraped after real scenarios."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from matcher.config import Settings
from matcher.daemon import stats
from matcher.domain.waits import WaitSpec
from matcher.kafka.lag import group_lag
from matcher.sdk import cancel_wait, register_wait
from tests.support.assertions import eventually
from tests.support.db import scalar
from tests.support.kafka import produce, produce_raw
from tests.support.processes import DaemonProcess, process_env, running_daemon
from tests.support.records import event
from tests.support.services import Services, own_database, own_settings

TOKEN = "admin-token-for-tests-0123456789abcdef"


@dataclass
class Admin:
    url: str
    settings: Settings
    daemon: DaemonProcess


@pytest.fixture(scope="module")
def admin(services: Services, template_db: str) -> Iterator[Admin]:
    with (
        own_database(services, template_db) as url,
        own_settings(services, url, admin_token=TOKEN) as settings,
    ):
        with psycopg.connect(url, autocommit=True) as conn:
            register_wait(
                conn,
                WaitSpec(
                    tenant="acme", run_id="run-1", position=0, event_types=["t"],
                    correlation_id="c1",
                ),
            )  # fmt: skip
        # Schemathesis sends invalid credentials on purpose and wants 401 for each: far
        # more than the throttle lets through (tests/integration/test_trust_boundary.py).
        daemon = DaemonProcess(process_env(
            settings, MATCHER_ADMIN_TOKEN=TOKEN, MATCHER_ADMIN_AUTH_FAILURES_BURST="100000"
        ))  # fmt: skip
        daemon.wait_ready()
        try:
            yield Admin(daemon.admin_url(), settings, daemon)
        finally:
            assert daemon.terminate() == 0, daemon.output


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_token_guards_v1_only(admin: Admin) -> None:
    with httpx.Client(base_url=admin.url) as http:
        assert http.get("/v1/waits").status_code == 401
        assert http.get("/v1/waits", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert http.get("/v1/waits", headers=AUTH).status_code == 200
        assert http.get("/v1/runs/run-1/explain").status_code == 401
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/metrics").status_code == 200


def test_readiness_and_explain_over_http(admin: Admin) -> None:
    with httpx.Client(base_url=admin.url, headers=AUTH) as http:
        deadline = time.monotonic() + 30
        ready = http.get("/readyz")
        while ready.status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
            ready = http.get("/readyz")
        assert ready.json() == {
            "ready": True,
            "postgres": True,
            "kafka": True,
            "assigned_partitions": admin.settings.topic_partitions,
        }
        explained = http.get("/v1/runs/run-1/explain").json()
        assert explained["verdict"] == "missing_signal"
        assert explained["evidence"]["wait"]["correlation_id"] == "c1"
        assert http.get("/v1/runs/nobody/explain").status_code == 404
        page = http.get("/v1/waits", params={"run_id": "run-1", "limit": 1}).json()
        assert [w["run_id"] for w in page["items"]] == ["run-1"]
        assert page["next_offset"] is None


def test_api_matches_its_openapi_description(admin: Admin) -> None:
    """Schemathesis generates requests from /openapi.json and checks every response
    against it (status codes, content types, response schemas, no server errors)."""
    api = schemathesis.openapi.from_url(admin.url + "/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 7

    for operation in operations:

        @given(case=operation.as_strategy())
        @hypothesis_settings(
            max_examples=30, deadline=None, suppress_health_check=list(HealthCheck)
        )
        def conforms(case: Any) -> None:
            case.call_and_validate(headers=AUTH)

        conforms()


def _scrape(url: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _value(metrics: dict[str, float], name: str, **labels: str) -> float:
    if not labels:
        return metrics.get(name, 0.0)
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return sum(
        v
        for k, v in metrics.items()
        if k.startswith(name + "{") and all(f'{a}="{b}"' in k for a, b in labels.items())
    ) or metrics.get(f"{name}{{{wanted}}}", 0.0)


def _lag(scraped: dict[str, float]) -> float:
    """The consumer's lag over every partition: records not yet committed."""
    return sum(v for k, v in scraped.items() if k.startswith("matcher_consumer_lag_records"))


async def test_metrics_after_a_scenario_and_gauges_back_to_zero(admin: Admin) -> None:
    settings = admin.settings
    url = settings.database_url.get_secret_value()
    before = _scrape(admin.url)
    with psycopg.connect(url, autocommit=True) as conn:
        for n in range(20):
            register_wait(
                conn,
                WaitSpec(
                    tenant="acme",
                    run_id=f"m-{n}",
                    position=0,
                    event_types=["job.completed"],
                    correlation_id=f"metrics-{n}",
                ),
            )
    events = [event(correlation=f"metrics-{n}") for n in range(20)]
    strays = [event(correlation="stray-1"), event(correlation="stray-2")]
    await produce(settings, events + strays)
    await produce_raw(settings, [(None, [], b"not an event")])

    def settled() -> bool:
        now = _scrape(admin.url)
        return (
            _value(now, "matcher_matches_total") - _value(before, "matcher_matches_total") == 20
            and _value(now, "matcher_inbox_pending_events") == 2
            and _value(now, "matcher_outbox_pending") == 0
            and _value(now, "matcher_quarantine_records") >= 1
            # The offsets are committed after the rows, on their own interval.
            and _lag(now) == 0
        )

    await eventually(settled, timeout=30)
    after = _scrape(admin.url)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert delta("matcher_events_received_total", result="accepted") == 22
    assert delta("matcher_events_received_total", result="rejected") == 1
    assert delta("matcher_events_rejected_total", reason="malformed") == 1
    assert delta("matcher_resumes_published_total", outcome="event") == 20
    assert delta("matcher_event_to_resume_seconds_count") == 20
    assert _value(after, "matcher_quarantine_records") >= 1
    assert _value(after, "matcher_consumer_assigned_partitions") == settings.topic_partitions
    assert _lag(after) == 0

    # The two strays are a backlog of pending events: waits for them drain it to zero.
    with psycopg.connect(url, autocommit=True) as conn:
        for n in (1, 2):
            register_wait(
                conn,
                WaitSpec(
                    tenant="acme",
                    run_id=f"stray-run-{n}",
                    position=0,
                    event_types=["job.completed"],
                    correlation_id=f"stray-{n}",
                ),
            )
    await eventually(
        lambda: _value(_scrape(admin.url), "matcher_inbox_pending_events") == 0, timeout=10
    )


async def test_gauges_see_a_backlog_and_the_daemon_drains_it(
    services: Services, settings: Settings
) -> None:
    """Gauges read with no daemon running show the backlog; a daemon then drains it."""
    url = settings.database_url.get_secret_value()
    with psycopg.connect(url, autocommit=True) as conn:
        for n in range(3):
            wait = register_wait(
                conn,
                WaitSpec(
                    tenant="acme", run_id=f"c-{n}", position=0, event_types=["t"],
                    correlation_id=f"cancel-{n}",
                ),
            )  # fmt: skip
            cancel_wait(conn, wait.id)
        register_wait(
            conn,
            WaitSpec(
                tenant="acme", run_id="late", position=0, event_types=["t"],
                correlation_id="overdue", deadline=datetime.now(UTC) - timedelta(seconds=5),
            ),
        )  # fmt: skip
    await produce(settings, [event() for _ in range(25)])
    async with AsyncConnectionPool(url, min_size=1, open=False) as pool:
        seen = await stats.refresh(pool)
    assert seen["outbox_pending"] == 3
    assert seen["sweeper_behind"] >= 5
    lag = await group_lag(
        settings.kafka_client_options(), settings.consumer_group, settings.events_topic
    )
    assert lag is not None
    assert sum(lag.values()) == 25

    daemon = DaemonProcess(process_env(settings))
    daemon.wait_ready()
    try:
        address = daemon.admin_url()

        def drained() -> bool:
            now = _scrape(address)
            lags = [v for k, v in now.items() if k.startswith("matcher_consumer_lag_records{")]
            return (
                _value(now, "matcher_outbox_pending") == 0
                and _value(now, "matcher_sweeper_behind_seconds") == 0
                and _value(now, "matcher_inbox_pending_events") == 25
                and len(lags) == settings.topic_partitions
                and sum(lags) == 0
            )

        await eventually(drained, timeout=30)
    finally:
        assert daemon.terminate() == 0, daemon.output


def test_filters_are_refused_as_the_cli_refuses_them(admin: Admin) -> None:
    """One filter model (matcher.admin.filters) for the API and the CLI: the same values
    are refused by both (the CLI side: tests/integration/test_cli.py)."""
    with httpx.Client(base_url=admin.url, headers=AUTH) as http:
        for path, params in (
            ("/v1/waits", {"limit": -5}),
            ("/v1/waits", {"limit": 5000}),
            ("/v1/waits", {"state": "bogus"}),
            ("/v1/events", {"status": "bogus"}),
            ("/v1/quarantine", {"reason": "bogus"}),
            # explain takes its identifiers by the CLI's rule too (RunFilters' FilterIdent).
            ("/v1/runs/" + "r" * 513 + "/explain", {}),
            ("/v1/runs/run%00one/explain", {}),
            ("/v1/runs/run-1/explain", {"tenant": "acme\x00"}),
            ("/v1/runs/run-1/explain", {"tenant": "t" * 513}),
        ):
            refused = http.get(path, params=params)
            assert refused.status_code == 422, (path, params, refused.text)
        assert "must be one of" in http.get("/v1/quarantine", params={"reason": "x"}).text
        page = http.get("/v1/waits", params={"state": "waiting"}).json()
        assert page["items"]
        stamp = page["items"][0]["created_at"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z", stamp), stamp


def test_build_info_and_registry_reload_metrics_are_exported(admin: Admin) -> None:
    from matcher import __version__

    scraped = _scrape(admin.url)
    [build] = [k for k in scraped if k.startswith("matcher_build_info{")]
    assert f'version="{__version__}"' in build
    assert scraped[build] == 1
    assert scraped["matcher_producer_registry_reload_failing"] == 0
    assert 'matcher_producer_registry_reloads_total{result="failed"}' in scraped
    assert "matcher_mismatched_events_total" in scraped


async def test_mismatched_events_are_counted_once(settings: Settings) -> None:
    """The counter behind the dashboard's mismatch rate: an event stored next to a wait of
    the same correlation id but another tenant or type counts once; a matched one not."""
    from prometheus_client import REGISTRY

    url = settings.database_url.get_secret_value()
    with psycopg.connect(url, autocommit=True) as conn:
        for correlation in ("mm-tenant", "mm-type", "mm-ok"):
            register_wait(
                conn,
                WaitSpec(
                    tenant="acme", run_id=correlation, position=0,
                    event_types=["job.completed"], correlation_id=correlation,
                ),
            )  # fmt: skip
    counter = stats.MismatchCounter(settle_s=0)
    before = REGISTRY.get_sample_value("matcher_mismatched_events_total") or 0.0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            assert await counter.tick(cur) == 0  # the first window starts now
        async with running_daemon(settings):
            await produce(
                settings,
                [
                    event(tenant="globex", correlation="mm-tenant"),
                    event(correlation="mm-type", type_="job.progress"),
                    event(correlation="mm-ok"),
                ],
            )
            await eventually(
                lambda: (
                    scalar(settings, "SELECT count(*) FROM matcher.inbox") == 3
                    and scalar(
                        settings, "SELECT count(*) FROM matcher.waits WHERE state = 'matched'"
                    )
                    == 1
                )
            )
        async with conn.cursor(row_factory=dict_row) as cur:
            assert await counter.tick(cur) == 2
            assert await counter.tick(cur) == 0  # counted once
    after = REGISTRY.get_sample_value("matcher_mismatched_events_total") or 0.0
    assert after - before == 2
