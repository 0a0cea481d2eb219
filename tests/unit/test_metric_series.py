"""What a scrape shows before anything happened: every bounded label value at 0 (a rate
over a series that appears only at its first increment misses that increment), and no
``*_created`` series (they double the families for a timestamp nothing reads).

Each process is scraped in a subprocess of its own: prometheus_client's switch for the
``_created`` series is global, so one imported module would hide another's omission.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from matcher.auth.registry import parse_registry
from matcher.ingress import metrics as ingress_metrics
from tests.support.webhooks import PRODUCERS_TOML

pytestmark = pytest.mark.timeout(60)

_SCRAPES = {
    "daemon": """
        from prometheus_client import REGISTRY, generate_latest
        import matcher.metrics
        print(generate_latest(REGISTRY).decode())
    """,
    "ingress": """
        from prometheus_client import generate_latest
        from matcher.ingress.metrics import REGISTRY
        print(generate_latest(REGISTRY).decode())
    """,
    "worker": """
        import socket, urllib.request
        from matcher.cli.worker import serve_metrics
        import matcher.sdk.worker.metrics
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve_metrics(f"127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}/metrics"
        print(urllib.request.urlopen(url, timeout=10).read().decode())
    """,
}


def _scrape(process: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRAPES[process])],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("process", sorted(_SCRAPES))
def test_a_scrape_has_no_created_series(process: str) -> None:
    scraped = _scrape(process)
    assert "_total" in scraped or "_count" in scraped  # a real scrape
    created = [line for line in scraped.splitlines() if "_created" in line]
    assert created == []


def test_every_resume_outcome_is_there_at_zero_before_any_resume() -> None:
    scraped = _scrape("daemon").splitlines()
    for outcome in ("event", "timeout", "cancelled"):
        assert f'matcher_resumes_published_total{{outcome="{outcome}"}} 0.0' in scraped


def _series(producer: str) -> set[tuple[str, float]]:
    return {
        (sample.labels["outcome"], sample.value)
        for family in ingress_metrics.REQUESTS.collect()
        for sample in family.samples
        if sample.labels.get("producer") == producer and sample.name.endswith("_total")
    }


def test_a_registered_producer_has_every_webhook_outcome_at_zero(tmp_path: Path) -> None:
    registry = parse_registry(PRODUCERS_TOML.replace('"openai"', '"zero-svc"'), tmp_path)
    assert _series("zero-svc") == set()
    ingress_metrics.initialise_producer_series(registry.producers.values())
    series = _series("zero-svc")
    assert {outcome for outcome, _ in series} == set(ingress_metrics.PRODUCER_OUTCOMES)
    assert {value for _, value in series} == {0.0}
    assert {"accepted", "dropped", "bad_signature"} <= {outcome for outcome, _ in series}
    # Outcomes only a callback or an unregistered name can have are not a producer's.
    assert not {"unknown_producer", "unknown_callback", "late"} & {o for o, _ in series}
