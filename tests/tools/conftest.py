from __future__ import annotations

import pytest

from tests.tools.chart import install


@pytest.fixture(scope="session")
def helm() -> str:
    """The pinned helm of scripts/install-helm (built once with `go install`, then cached)."""
    return install("install-helm")
