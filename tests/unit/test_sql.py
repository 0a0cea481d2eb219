"""The named-SQL loader (and that code uses every block) and the migration files' naming rules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import matcher
from matcher.store.migrate import MigrationError, load_migrations
from matcher.store.sql import QUERIES_DIR, parse_blocks, queries

PACKAGE = Path(matcher.__file__).parent


def test_blocks_are_split_by_name() -> None:
    blocks = parse_blocks("-- preamble\n-- name: one\nSELECT 1;\n\n-- name: two\nSELECT 2;\n")
    assert blocks == {"one": "SELECT 1;", "two": "SELECT 2;"}


def test_duplicate_block_names_are_refused() -> None:
    with pytest.raises(ValueError, match="defined twice"):
        parse_blocks("-- name: one\nSELECT 1;\n-- name: one\nSELECT 2;\n")


def test_every_query_file_parses() -> None:
    for path in QUERIES_DIR.glob("*.sql"):
        assert queries(path.stem), f"{path.name} has no named blocks"


def _text(node: ast.AST | None) -> str | None:
    """The value of a string literal, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _query_calls(tree: ast.AST) -> list[ast.Call]:
    """Calls of ``query(...)`` (or ``sql.query(...)``) whose file is a literal."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "query"
        and node.args
        and _text(node.args[0]) is not None
    ]


def referenced_blocks(sources: list[str]) -> tuple[set[tuple[str, str]], dict[str, set[str]]]:
    """The blocks these Python sources name: ``query("<file>", "<name>")`` pairs, and for a
    ``query("<file>", name)`` whose name is computed, every string literal of its source
    (where such a name comes from: ``"detach_day" if ... else ...``, a ``Literal[...]``)."""
    named: set[tuple[str, str]] = set()
    computed: dict[str, set[str]] = {}
    for source in sources:
        tree = ast.parse(source)
        for call in _query_calls(tree):
            module = _text(call.args[0]) or ""
            name = _text(call.args[1]) if len(call.args) > 1 else None
            if name is not None:
                named.add((module, name))
            else:
                strings = {s for node in ast.walk(tree) if (s := _text(node)) is not None}
                computed.setdefault(module, set()).update(strings)
    return named, computed


def unreferenced_blocks(blocks: dict[str, list[str]], sources: list[str]) -> list[str]:
    named, computed = referenced_blocks(sources)
    return [
        f"{module}.sql: {name}"
        for module, names in sorted(blocks.items())
        for name in names
        if (module, name) not in named and name not in computed.get(module, set())
    ]


def test_every_sql_block_is_used() -> None:
    """A block no code under matcher/ runs is dead SQL: remove it (or use it)."""
    blocks = {path.stem: list(queries(path.stem)) for path in QUERIES_DIR.glob("*.sql")}
    sources = [path.read_text() for path in PACKAGE.rglob("*.py")]
    assert unreferenced_blocks(blocks, sources) == []


def test_an_unused_block_is_found() -> None:
    sources = [
        'query("a", "used")',
        'def view(name: Literal["picked"]) -> str:\n    return query("b", name)',
    ]
    blocks = {"a": ["used", "unused"], "b": ["picked", "never"]}
    assert unreferenced_blocks(blocks, sources) == ["a.sql: unused", "b.sql: never"]


def test_migration_gaps_are_refused(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0003_c.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="without gaps"):
        load_migrations(tmp_path)


def test_migration_names_are_checked(tmp_path: Path) -> None:
    (tmp_path / "1_a.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"NNNN_name\.sql"):
        load_migrations(tmp_path)
