"""The alert rules (promtool's own unit tests) and the dashboard, against our metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
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


def _promtool() -> str:
    found = shutil.which("promtool")
    assert found, (
        "promtool not found: install Debian's `prometheus` package "
        "(scripts/install-prerequisites does)"
    )
    return found


def test_alert_rules_pass_promtool_check_and_unit_tests() -> None:
    promtool = _promtool()
    check = subprocess.run(
        [promtool, "check", "rules", "alerts.yaml"],
        cwd=OPS / "prometheus", capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", "alerts.test.yaml"],
        cwd=OPS / "prometheus", capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


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
