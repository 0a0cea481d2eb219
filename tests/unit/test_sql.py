"""The named-SQL loader and the migration files' naming rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from matcher.store.migrate import MigrationError, load_migrations
from matcher.store.sql import QUERIES_DIR, parse_blocks, queries


def test_blocks_are_split_by_name() -> None:
    blocks = parse_blocks("-- preamble\n-- name: one\nSELECT 1;\n\n-- name: two\nSELECT 2;\n")
    assert blocks == {"one": "SELECT 1;", "two": "SELECT 2;"}


def test_duplicate_block_names_are_refused() -> None:
    with pytest.raises(ValueError, match="defined twice"):
        parse_blocks("-- name: one\nSELECT 1;\n-- name: one\nSELECT 2;\n")


def test_every_query_file_parses() -> None:
    for path in QUERIES_DIR.glob("*.sql"):
        assert queries(path.stem), f"{path.name} has no named blocks"


def test_migration_gaps_are_refused(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0003_c.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="without gaps"):
        load_migrations(tmp_path)


def test_migration_names_are_checked(tmp_path: Path) -> None:
    (tmp_path / "1_a.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"NNNN_name\.sql"):
        load_migrations(tmp_path)
