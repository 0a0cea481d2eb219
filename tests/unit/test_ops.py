"""The alert rules and the dashboard, against our metrics (promtool's tests of the rules are
in tests/tools/test_alert_rules.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

import matcher.metrics  # noqa: F401 - registers every metric
from matcher.ingress import metrics as ingress_metrics

OPS = Path(__file__).parents[2] / "ops"
_NAME = re.compile(r"\bmatcher_[a-z_]+\b")

# What the webhook ingress exports (its own registry: a process of its own) and the
# dashboard's Webhook ingress row and the matcher-ingress alerts are built on.
INGRESS_METRICS = {
    "matcher_ingress_requests_total": "counter",
    "matcher_ingress_request_duration_seconds": "histogram",
    "matcher_ingress_kafka_produce_errors_total": "counter",
    "matcher_ingress_in_flight_requests": "gauge",
}


def _names(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for metric in registry.collect():
        names.add(metric.name)
        if metric.type == "counter":
            names.add(metric.name + "_total")
        if metric.type == "histogram":
            names.update(metric.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


def _known_names() -> set[str]:
    """Every series the daemon or the webhook ingress exports."""
    return _names(REGISTRY) | _names(ingress_metrics.REGISTRY)


def _ingress_families() -> dict[str, str]:
    """The ingress's metric families as exposed: name -> type."""
    families: dict[str, str] = {}
    for metric in ingress_metrics.REGISTRY.collect():
        exposed = metric.name + ("_total" if metric.type == "counter" else "")
        families[exposed] = metric.type
    return families


@pytest.mark.parametrize(("name", "kind"), sorted(INGRESS_METRICS.items()))
def test_the_ingress_exports_the_metrics_the_dashboard_and_alerts_use(name: str, kind: str) -> None:
    assert _ingress_families().get(name) == kind


def test_the_ingress_requests_carry_producer_and_outcome() -> None:
    labels = {
        ingress_metrics.REQUESTS._labelnames,
        ingress_metrics.REQUEST_DURATION._labelnames,
    }
    assert labels == {("producer", "outcome"), ("producer",)}
    assert ingress_metrics.UNKNOWN_PRODUCER == "_unknown"
    assert "accepted" in ingress_metrics.OUTCOMES


def _exprs() -> list[str]:
    rules = yaml.safe_load((OPS / "prometheus" / "alerts.yaml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((OPS / "grafana" / "matcher-dashboard.json").read_text())
    return exprs + [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_outcomes_the_rules_and_dashboard_name_are_ones_the_ingress_counts() -> None:
    named = [
        outcome
        for expr in _exprs()
        for pattern in re.findall(r'outcome\s*(?:=~|!~|!=|=)\s*"([^"]+)"', expr)
        for outcome in pattern.split("|")
    ]
    assert named, "no outcome named?"
    assert set(named) <= set(ingress_metrics.OUTCOMES), sorted(
        set(named) - set(ingress_metrics.OUTCOMES)
    )


def test_rules_and_dashboard_use_only_metrics_that_exist() -> None:
    known = _known_names()
    dashboard = json.loads((OPS / "grafana" / "matcher-dashboard.json").read_text())
    used = {name for expr in _exprs() for name in _NAME.findall(expr)}
    assert used, "no matcher metrics referenced?"
    assert used <= known, f"unknown metrics: {sorted(used - known)}"
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("throughput", "backlog", "mismatch", "lag", "latency", "rejections"):
        assert topic in titles, topic
