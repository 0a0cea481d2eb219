"""What the tests of the chart and of the rendered objects share: where things are, how the
pinned tools are built, and how the chart is rendered."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).parents[2]
CHART = ROOT / "helm" / "matcher"
OPS = ROOT / "ops"
DEFAULT_VALUES = CHART / "ci" / "default-values.yaml"
ALL_ON_VALUES = CHART / "ci" / "all-on-values.yaml"


def install(script: str) -> str:
    """Run scripts/<script> (an install-* script) and return the path it prints. The first
    run on a machine builds the tool from source: up to 20 minutes."""
    built = subprocess.run(
        [str(ROOT / "scripts" / script)],
        capture_output=True, text=True, check=False, timeout=1200,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.fail(f"{script} failed: {built.stderr.strip()}", pytrace=False)
    return built.stdout.strip()


def template(
    helm: str, values_file: Path, extra: dict[str, Any] | None
) -> subprocess.CompletedProcess[str]:
    """`helm template` with a values file; extra values go in on stdin as a second values
    file, layered over the first."""
    return subprocess.run(
        [helm, "template", "matcher", str(CHART), "--namespace", "apps",
         "-f", str(values_file), "-f", "-"],
        input=yaml.safe_dump(extra or {}), capture_output=True, text=True, check=False,
        timeout=120,
    )  # fmt: skip
