"""The dashboard and the alerts as an operator reads them: no panel puts counts and seconds
on one axis, the mismatch rate is a rate of a counter, a failed registry reload alerts, the
webhook ingress has a row of its own, and the metrics these need exist from the start."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

OPS = Path(__file__).parents[2] / "ops"


def _all_panels() -> list[dict[str, Any]]:
    dashboard = json.loads((OPS / "grafana" / "matcher-dashboard.json").read_text())
    panels: list[dict[str, Any]] = dashboard["panels"]
    return panels


def _panels() -> list[dict[str, Any]]:
    """The graphs (rows only group them and have no queries)."""
    return [p for p in _all_panels() if p["type"] != "row"]


def _kind(expr: str) -> str:
    """What a query's values are: seconds, a per-second rate, a share, or a count."""
    if "_seconds" in expr:
        return "seconds"
    if "rate(" in expr and " / " in expr:
        # Sum over count of a histogram is a mean of what it counts; any other ratio of two
        # rates is a share of the whole.
        return "count" if "_sum[" in expr else "share"
    if "rate(" in expr:
        return "rate"
    return "count"


_UNITS = {"seconds": "s", "rate": "ops", "share": "percentunit", "count": "short"}


def test_no_panel_mixes_counts_rates_and_seconds() -> None:
    for panel in _panels():
        kinds = {_kind(t["expr"]) for t in panel["targets"]}
        assert len(kinds) == 1, f"{panel['title']!r} mixes {sorted(kinds)}"
        [kind] = kinds
        unit = panel["fieldConfig"]["defaults"]["unit"]
        assert unit == _UNITS[kind], f"{panel['title']!r}: unit {unit} for {kind}"


def test_the_webhook_ingress_has_a_row_with_each_of_its_metrics() -> None:
    panels = _all_panels()
    rows = [p for p in panels if p["type"] == "row"]
    assert [r["title"] for r in rows] == ["Webhook ingress"]
    [row] = rows
    # An open row: its panels are the ones below it on the grid, and none is above it.
    below = [p for p in _panels() if p["gridPos"]["y"] > row["gridPos"]["y"]]
    above = [p for p in _panels() if p["gridPos"]["y"] < row["gridPos"]["y"]]
    assert row["collapsed"] is False
    assert below
    exprs = {p["title"]: [t["expr"] for t in p["targets"]] for p in below}
    assert all("matcher_ingress_" in e for es in exprs.values() for e in es), exprs
    assert not [p["title"] for p in above if "matcher_ingress_" in json.dumps(p["targets"])]
    used = " ".join(e for es in exprs.values() for e in es)
    for metric in (
        "matcher_ingress_requests_total",
        "matcher_ingress_request_duration_seconds_bucket",
        "matcher_ingress_kafka_produce_errors_total",
        "matcher_ingress_in_flight_requests",
    ):
        assert metric in used, metric


def test_the_webhook_panels_answer_what_an_operator_asks() -> None:
    by_title = {p["title"]: p for p in _panels()}
    requests = by_title["Webhook requests by producer and outcome"]["targets"]
    assert [t["expr"] for t in requests] == [
        "sum by (producer, outcome) (rate(matcher_ingress_requests_total[$__rate_interval]))"
    ]
    share = by_title["Webhook rejected share by producer"]
    [expr] = [t["expr"] for t in share["targets"]]
    numerator, denominator = expr.split(" / ")
    assert 'outcome!~"accepted|dropped"' in numerator  # a dropped delivery is no refusal
    assert numerator.startswith("sum by (producer) (rate(")
    # Only producers with requests: an idle one has no share (not 0/0, NaN).
    assert denominator == (
        "(sum by (producer) (rate(matcher_ingress_requests_total[$__rate_interval])) > 0)"
    )
    assert (share["fieldConfig"]["defaults"]["min"], share["fieldConfig"]["defaults"]["max"]) == (
        0,
        1,
    )
    latency = by_title["Webhook latency"]["targets"]
    assert [t["legendFormat"] for t in latency] == ["p50", "p99"]
    for target, quantile in zip(latency, ("0.5", "0.99"), strict=True):
        assert target["expr"] == (
            f"histogram_quantile({quantile}, sum by (le) "
            "(rate(matcher_ingress_request_duration_seconds_bucket[$__rate_interval])))"
        )


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    panels = _all_panels()
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        area = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & area, f"{p['title']!r} overlaps another panel"
        assert g["x"] + g["w"] <= 24
        cells |= area


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
