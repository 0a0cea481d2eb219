from __future__ import annotations

import pytest

from tests.tools.chart import ALL_ON_VALUES, Doc, install, render


@pytest.fixture(scope="session")
def helm() -> str:
    """The pinned helm of scripts/install-helm (built once with `go install`, then cached)."""
    return install("install-helm")


@pytest.fixture(scope="session")
def default_docs(helm: str) -> list[Doc]:
    return render(helm)


@pytest.fixture(scope="session")
def all_on_docs(helm: str) -> list[Doc]:
    return render(helm, base=ALL_ON_VALUES)


@pytest.fixture(params=["default", "all-on"])
def any_docs(
    request: pytest.FixtureRequest, default_docs: list[Doc], all_on_docs: list[Doc]
) -> list[Doc]:
    return default_docs if request.param == "default" else all_on_docs
