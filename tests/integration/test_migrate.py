"""Migrations against the real database: apply, no-op, concurrent, tamper detection."""

from __future__ import annotations

import threading
from dataclasses import replace

import psycopg
import pytest

from matcher.store.migrate import MigrationError, load_migrations, migrate


def _versions(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT version FROM matcher.schema_migrations ORDER BY version")
        return [row[0] for row in rows]


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'matcher'")
        return {row[0] for row in rows}


def test_migrate_applies_then_is_a_noop(empty_db: str) -> None:
    everything = load_migrations()
    applied = migrate(empty_db)
    assert [m.version for m in applied] == [m.version for m in everything]
    assert {"waits", "inbox", "resume_queue", "open_waits", "runs", "quarantine"} <= _tables(
        empty_db
    )
    assert migrate(empty_db) == []
    assert _versions(empty_db) == [m.version for m in everything]


def test_concurrent_migrations_do_not_conflict(empty_db: str) -> None:
    results: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker() -> None:
        try:
            barrier.wait()
            results.append(len(migrate(empty_db)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    # Exactly one of them did the work; the others found it done.
    assert sorted(results) == [0, 0, 0, len(load_migrations())]
    assert _versions(empty_db) == [m.version for m in load_migrations()]


def test_edited_migration_is_refused(empty_db: str) -> None:
    migrate(empty_db)
    tampered = [replace(m, checksum="0" * 64) if m.version == 1 else m for m in load_migrations()]
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(empty_db, tampered)


def test_failed_migration_leaves_nothing_behind(empty_db: str) -> None:
    broken = [
        *load_migrations(),
        replace(
            load_migrations()[0],
            version=len(load_migrations()) + 1,
            name="broken",
            sql="CREATE TABLE matcher.half_done (x int); SELECT no_such_function();",
        ),
    ]
    with pytest.raises(psycopg.errors.UndefinedFunction):
        migrate(empty_db, broken)
    assert "half_done" not in _tables(empty_db)
    assert _versions(empty_db) == [m.version for m in load_migrations()]
