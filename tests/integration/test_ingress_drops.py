"""Deliveries a healthy integration sends and no wait needs, through `matcher ingress` as a
real process: acknowledged, counted by rule, never forwarded, and not refusals to the
alert. The alert's verdict on the traffic the ingress actually counted is promtool's.

GitHub subscriptions are per event, not per action: each workflow run delivers
``requested``, ``in_progress`` and ``completed``, and a new hook first sends ``ping``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from matcher.config import Settings
from tests.support import webhooks as senders
from tests.support.assertions import eventually
from tests.support.db import rows
from tests.support.ingress import metrics_text, post, wait_for
from tests.support.kafka import read_resumes
from tests.support.processes import IngressProcess, installed_tool, running_daemon

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).parents[2]
ALERT = "MatcherIngressProducerMostlyRejected"
RUNS = 150  # the mix an operator reported: 150 runs, so 150 completed and 300 others


@pytest.fixture(scope="module")
def promtool() -> str:
    return installed_tool("install-promtool")


def _github_run(address: str, run_id: int, secret: str = senders.GITHUB_SECRET) -> list[int]:
    statuses = []
    for action in ("requested", "in_progress", "completed"):
        body = senders.body_bytes(senders.github_workflow_run(run_id, action=action))
        headers = senders.github_request(body, secret=secret, delivery=f"{run_id}-{action}")
        statuses.append(post(address, "github", headers, body).status_code)
    return statuses


def _counts(address: str, producer: str) -> dict[str, float]:
    text = metrics_text(address)
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "matcher_ingress_requests":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels["producer"] == producer:
                counts[sample.labels["outcome"]] = sample.value
    return counts


def _alert_expression() -> str:
    rules = yaml.safe_load((ROOT / "ops" / "prometheus" / "alerts.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == ALERT:
                return str(rule["expr"])
    raise AssertionError(f"no alert {ALERT}")


def _alert_holds(promtool: str, tmp: Path, counts: dict[str, float]) -> list[Any]:
    """The alert's expression over an hour of this traffic (what the ingress counted, sent
    again every 10 minutes), from 20 to 60 minutes: promtool's samples where it holds."""
    per_minute = {outcome: n / 10 for outcome, n in counts.items() if n > 0}
    series = [
        {"series": f'matcher_ingress_requests_total{{instance="a", producer="github", '
                   f'outcome="{outcome}"}}',
         "values": f"0+{rate:g}x60"}
        for outcome, rate in per_minute.items()
    ]  # fmt: skip
    tests = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {"expr": _alert_expression(), "eval_time": f"{m}m", "exp_samples": []}
                    for m in (20, 40, 60)
                ],
            }
        ],
    }
    (tmp / "empty.yaml").write_text("groups: []\n")
    tests["rule_files"] = ["empty.yaml"]
    (tmp / "mix.test.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run(
        [promtool, "test", "rules", "mix.test.yaml"],
        cwd=tmp, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if done.returncode == 0:
        return []
    # exp_samples [] failed: the expression held; promtool prints what it got.
    assert "got:" in done.stdout + done.stderr, done.stdout + done.stderr
    return [line for line in (done.stdout + done.stderr).splitlines() if "got:" in line]


async def test_a_healthy_github_mix_is_acknowledged_and_quiet_and_a_wrong_secret_alerts(
    webhooks_secure: Settings, ingress: IngressProcess, promtool: str, tmp_path: Path
) -> None:
    address = ingress.address
    assert address is not None
    first = wait_for(webhooks_secure, "acme", "github.workflow_run.completed", "1000")
    ping = senders.body_bytes(senders.github_ping())
    answer = post(address, "github", senders.github_request(ping), ping)
    assert (answer.status_code, answer.json()) == (200, {"dropped": "ping"})
    async with running_daemon(webhooks_secure):
        statuses = [s for run in range(RUNS) for s in _github_run(address, 1000 + run)]
        assert statuses.count(202) == RUNS, statuses
        assert statuses.count(200) == 2 * RUNS, statuses
        resumes = await read_resumes(webhooks_secure, at_least=1)
        assert {r.run_id for r in resumes} == {first}
        await eventually(
            lambda: len(rows(webhooks_secure, "SELECT 1 FROM matcher.inbox")) == RUNS,
            what="every completed run stored",
        )
    stored = rows(webhooks_secure, "SELECT event_id FROM matcher.inbox")
    assert all(r["event_id"].endswith("-completed") for r in stored)  # nothing else forwarded
    healthy = _counts(address, "github")
    assert healthy["accepted"] == RUNS
    assert healthy["dropped"] == 2 * RUNS + 1
    metrics = metrics_text(address)
    assert 'matcher_ingress_dropped_total{producer="github",rule="not_completed"} 300.0' in metrics
    assert 'matcher_ingress_dropped_total{producer="github",rule="ping"} 1.0' in metrics
    assert _alert_holds(promtool, tmp_path, healthy) == []

    # The same sender with a secret not among the producer's keys: every delivery refused.
    statuses = [s for run in range(RUNS) for s in _github_run(address, 5000 + run, "rotated")]
    assert set(statuses) == {401}
    misconfigured = _counts(address, "github")
    refused = {o: misconfigured.get(o, 0) - healthy.get(o, 0) for o in misconfigured}
    assert refused["bad_signature"] == 3 * RUNS
    assert _alert_holds(promtool, tmp_path, refused) != []
