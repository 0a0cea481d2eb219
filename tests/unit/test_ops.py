"""The alert rules and the dashboard, against our metrics (promtool's tests of the rules are
in tests/tools/test_alert_rules.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

import matcher.metrics  # noqa: F401 - registers every metric

OPS = Path(__file__).parents[2] / "ops"
_NAME = re.compile(r"\bmatcher_[a-z_]+\b")


def _known_names() -> set[str]:
    names: set[str] = set()
    for metric in REGISTRY.collect():
        names.add(metric.name)
        if metric.type == "counter":
            names.add(metric.name + "_total")
        if metric.type == "histogram":
            names.update(metric.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


def test_rules_and_dashboard_use_only_metrics_that_exist() -> None:
    known = _known_names()
    rules = yaml.safe_load((OPS / "prometheus" / "alerts.yaml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dashboard = json.loads((OPS / "grafana" / "matcher-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for expr in exprs for name in _NAME.findall(expr)}
    assert used, "no matcher metrics referenced?"
    assert used <= known, f"unknown metrics: {sorted(used - known)}"
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("throughput", "backlog", "mismatch", "lag", "latency", "rejections"):
        assert topic in titles, topic
