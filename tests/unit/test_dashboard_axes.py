"""The dashboard and the alerts as an operator reads them: no panel puts counts and seconds
on one axis, the mismatch rate is a rate of a counter, a failed registry reload alerts, and
the metrics these need exist from the start."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

OPS = Path(__file__).parents[2] / "ops"


def _panels() -> list[dict[str, Any]]:
    dashboard = json.loads((OPS / "grafana" / "matcher-dashboard.json").read_text())
    panels: list[dict[str, Any]] = dashboard["panels"]
    return panels


def _kind(expr: str) -> str:
    """What a query's values are: seconds, a per-second rate, or a count."""
    if "_seconds" in expr:
        return "seconds"
    if "rate(" in expr and "_sum[" not in expr:  # a ratio of two rates is a level again
        return "rate"
    return "count"


_UNITS = {"seconds": "s", "rate": "ops", "count": "short"}


def test_no_panel_mixes_counts_rates_and_seconds() -> None:
    for panel in _panels():
        kinds = {_kind(t["expr"]) for t in panel["targets"]}
        assert len(kinds) == 1, f"{panel['title']!r} mixes {sorted(kinds)}"
        [kind] = kinds
        unit = panel["fieldConfig"]["defaults"]["unit"]
        assert unit == _UNITS[kind], f"{panel['title']!r}: unit {unit} for {kind}"


def test_the_mismatch_rate_is_a_rate_of_the_counter() -> None:
    [panel] = [p for p in _panels() if p["title"] == "Mismatch rate"]
    exprs = [t["expr"] for t in panel["targets"]]
    assert "max(rate(matcher_mismatched_events_total[$__rate_interval]))" in exprs
    assert all("rate(" in e for e in exprs)


def test_a_failed_registry_reload_alerts() -> None:
    rules = yaml.safe_load((OPS / "prometheus" / "alerts.yaml").read_text())
    [rule] = [
        r
        for g in rules["groups"]
        for r in g["rules"]
        if r["alert"] == "MatcherProducerRegistryReloadFailing"
    ]
    assert "matcher_producer_registry_reload_failing" in rule["expr"]


def _fresh_exposition() -> str:
    """The metrics of a process that has only imported matcher.metrics: what a scraper sees
    from a daemon that has done nothing yet (this process's registry may have counted)."""
    program = (
        "import matcher.metrics\n"
        "from prometheus_client import REGISTRY, generate_latest\n"
        "print(generate_latest(REGISTRY).decode())"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def test_metrics_an_operator_needs_exist_from_the_start() -> None:
    text = _fresh_exposition()
    assert re.search(r'^matcher_build_info\{python="[^"]+",version="[^"]+"\} 1\.0$', text, re.M)
    assert "\nmatcher_mismatched_events_total 0.0\n" in text
    assert "\nmatcher_producer_registry_reload_failing 0.0\n" in text
    for result in ("ok", "failed"):
        assert f'\nmatcher_producer_registry_reloads_total{{result="{result}"}} 0.0\n' in text
