"""No function of the product is longer than a screen: past about 80 lines a function does
several things, and its name can say only one of them (ruff's C90 holds complexity)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["matcher", "bench", "examples", "producers/python/matcher_producer"]
MAX_LINES = 80


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in ``source`` longer than ``limit``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def test_no_product_function_is_longer_than_80_lines() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name} ({lines} lines)"
        for folder in PRODUCT
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name, lines in long_functions(path.read_text())
    ]
    assert offenders == []


def test_a_long_function_is_found() -> None:
    body = "\n".join(f"    x{n} = {n}" for n in range(MAX_LINES))
    assert long_functions(f"def f():\n{body}\n") == [("f", MAX_LINES + 1)]
    assert long_functions("def g():\n    return 1\n") == []
