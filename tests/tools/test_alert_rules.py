"""The alert rules, checked and unit-tested by promtool (`promtool test rules`).

promtool comes from scripts/install-promtool (built once with `go install`, then cached;
never one found on PATH), so this test needs Go the first time and nothing but the cache
afterwards.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

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
