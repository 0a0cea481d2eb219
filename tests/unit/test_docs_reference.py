"""The documentation holds to the code: the generated reference pages are current, every
setting is described, and every guarantee names tests that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from matcher.config import IngressSettings, Settings, WorkerSettings
from matcher.reference import pages

ROOT = Path(__file__).parents[2]
GUARANTEES = ROOT / "docs" / "concepts" / "guarantees.md"


@pytest.mark.parametrize("model", [Settings, IngressSettings, WorkerSettings])
def test_every_setting_is_described(
    model: type[Settings] | type[IngressSettings] | type[WorkerSettings],
) -> None:
    undescribed = [name for name, f in model.model_fields.items() if not f.description]
    assert undescribed == [], f"settings without Field(description=...): {undescribed}"


@pytest.mark.parametrize("name", ["cli.md", "configuration.md"])
def test_the_generated_reference_pages_are_current(name: str) -> None:
    checked_in = (ROOT / "docs" / "reference" / name).read_text()
    assert checked_in == pages()[name], (
        f"docs/reference/{name} is stale: run `python -m matcher.reference docs/reference`"
    )


def test_every_setting_has_a_row_in_the_configuration_page() -> None:
    page = pages()["configuration.md"]
    for model in (Settings, IngressSettings, WorkerSettings):
        for name in model.model_fields:
            assert f"| `MATCHER_{name.upper()}` |" in page


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def proofs_of(page: str) -> dict[int, list[str]]:
    """Each guarantee's number and the tests its "Tested by:" line names."""
    found: dict[int, list[str]] = {}
    number = 0
    for line in page.splitlines():
        heading = re.match(r"## (\d+)\. ", line)
        if heading:
            number = int(heading.group(1))
        elif line.startswith("Tested by:"):
            found[number] = re.findall(r"`([^`]+::[^`]+)`", line)
    return found


def missing_tests(page: str, root: Path) -> list[str]:
    missing = []
    for tests in proofs_of(page).values():
        for item in tests:
            path, _, name = item.partition("::")
            file = root / path
            if not file.is_file() or name not in _test_functions(file):
                missing.append(item)
    return missing


def test_every_guarantee_names_tests_that_exist() -> None:
    page = GUARANTEES.read_text()
    numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", page, re.MULTILINE)]
    assert numbers == list(range(1, 13)), numbers
    proved = proofs_of(page)
    assert set(proved) == set(numbers), "a guarantee without a Tested by: line"
    assert all(proved.values())
    assert missing_tests(page, ROOT) == []


def test_the_check_fails_for_a_test_that_does_not_exist() -> None:
    # The check itself can fail: a guarantee naming a renamed test is caught.
    page = "## 1. A guarantee\n\nTested by: `tests/unit/test_docs_reference.py::test_gone`\n"
    assert missing_tests(page, ROOT) == ["tests/unit/test_docs_reference.py::test_gone"]


def test_every_worker_api_function_is_documented() -> None:
    """Every matcher.*_v<N> function the migrations create has its entry in the reference."""
    migrations = (ROOT / "matcher" / "store" / "migrations").glob("*.sql")
    functions = {
        name
        for path in migrations
        for name in re.findall(r"CREATE FUNCTION matcher\.(\w+_v\d+)\(", path.read_text())
    }
    page = (ROOT / "docs" / "reference" / "worker-api.md").read_text()
    assert len(functions) >= 10, functions
    assert sorted(f for f in functions if f"`matcher.{f}(" not in page) == []
