"""The layers contract (pyproject.toml) holds today and fails on a back-arrow: a copy of
the package where the domain imports the daemon is refused by ``lint-imports``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(source_root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(source_root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=source_root, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_the_layers_hold() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the data path is layered KEPT" in done.stdout


def test_a_back_arrow_breaks_the_layers(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "matcher", tmp_path / "matcher", ignore=shutil.ignore_patterns("__pycache__")
    )
    events = tmp_path / "matcher" / "domain" / "events.py"
    events.write_text(events.read_text() + "\nimport matcher.daemon.ingest  # a back-arrow\n")
    done = _lint(tmp_path)
    assert done.returncode != 0
    assert "the data path is layered BROKEN" in done.stdout
    assert "matcher.domain.events -> matcher.daemon.ingest" in done.stdout
