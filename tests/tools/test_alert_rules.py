"""The alert rules, checked and unit-tested by promtool (`promtool test rules`).

promtool comes from scripts/install-promtool (built once with `go install`, then cached;
never one found on PATH), so this test needs Go the first time and nothing but the cache
afterwards.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

# The first run on a machine builds promtool from source (up to 20 minutes, bounded in
# the fixture): longer than the default test timeout.
pytestmark = pytest.mark.timeout(1500)

ROOT = Path(__file__).parents[2]
RULES = ROOT / "ops" / "prometheus"


@pytest.fixture(scope="session")
def promtool() -> str:
    built = subprocess.run(
        [str(ROOT / "scripts" / "install-promtool")],
        capture_output=True, text=True, check=False, timeout=1200,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.fail(f"no promtool: {built.stderr.strip()}", pytrace=False)
    return built.stdout.strip()


def test_alert_rules_pass_promtool_check_and_unit_tests(promtool: str) -> None:
    check = subprocess.run(
        [promtool, "check", "rules", "alerts.yaml"],
        cwd=RULES, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", "alerts.test.yaml"],
        cwd=RULES, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def _panel_expr(title: str) -> str:
    dashboard = json.loads((ROOT / "ops" / "grafana" / "matcher-dashboard.json").read_text())
    (panel,) = [p for p in dashboard["panels"] if p["title"] == title]
    (target,) = panel["targets"]
    expr: str = target["expr"]
    return expr.replace("$__rate_interval", "5m")


def test_the_rejected_share_panel_shows_idle_producers_as_nothing(
    promtool: str, tmp_path: Path
) -> None:
    """The panel's query, evaluated by Prometheus' engine over series as the ingress
    exports them (every registered producer's outcomes at 0 from the start): an idle
    producer once showed NaN (0/0). Now it has no point; a producer whose deliveries are
    accepted or dropped shows 0, one half refused 0.5."""
    outcomes = ("accepted", "dropped", "bad_signature")
    per_minute = {"busy": (6, 0, 6), "github-ci": (15, 30, 0), "idle": (0, 0, 0)}
    series = [
        {
            "series": f'matcher_ingress_requests_total{{producer="{producer}", outcome="{o}"}}',
            "values": f"0+{n}x20",
        }
        for producer, counts in per_minute.items()
        for o, n in zip(outcomes, counts, strict=True)
    ]
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": _panel_expr("Webhook rejected share by producer"),
                        "eval_time": "10m",
                        "exp_samples": [
                            {"labels": '{producer="busy"}', "value": 0.5},
                            {"labels": '{producer="github-ci"}', "value": 0},
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "panel.test.yaml").write_text(yaml.safe_dump(tests))
    tested = subprocess.run(
        [promtool, "test", "rules", "panel.test.yaml"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
