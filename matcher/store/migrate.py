"""Numbered SQL migrations: each applied in one transaction, recorded, under an advisory lock.

Files are ``migrations/NNNN_name.sql``. A migration that was applied is never edited: its
checksum is recorded and a mismatch stops ``migrate`` with a clear error.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from matcher.store.sql import query

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationError(Exception):
    pass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    checksum: str


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    migrations: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if match is None:
            raise MigrationError(f"migration file {path.name!r} is not named NNNN_name.sql")
        text = path.read_text()
        migrations.append(
            Migration(
                version=int(match.group(1)),
                name=match.group(2),
                sql=text,
                checksum=hashlib.sha256(text.encode()).hexdigest(),
            )
        )
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise MigrationError(f"migration versions must run 1, 2, 3, ... without gaps: {versions}")
    return migrations


def migrate(conninfo: str, migrations: list[Migration] | None = None) -> list[Migration]:
    """Apply the pending migrations; return those this call applied (empty if none)."""
    wanted = load_migrations() if migrations is None else migrations
    applied_now: list[Migration] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(query("migrate", "lock"))
        try:
            conn.execute(query("migrate", "bootstrap"))
            done = {
                version: (name, checksum)
                for version, name, checksum in conn.execute(query("migrate", "applied"))
            }
            unknown = sorted(set(done) - {m.version for m in wanted})
            if unknown:
                raise MigrationError(
                    f"the database has migrations this matcher does not know: {unknown}; "
                    "is an older matcher running against a newer schema?"
                )
            for migration in wanted:
                recorded = done.get(migration.version)
                if recorded is not None:
                    if recorded[1] != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version:04d}_{migration.name} was changed "
                            "after it was applied; add a new migration instead"
                        )
                    continue
                with conn.transaction():
                    conn.execute(migration.sql)
                    conn.execute(
                        query("migrate", "record"),
                        (migration.version, migration.name, migration.checksum),
                    )
                applied_now.append(migration)
        finally:
            conn.execute(query("migrate", "unlock"))
    return applied_now


def schema_problem(conn: psycopg.Connection[Any]) -> str | None:
    """What the database lacks for this matcher's schema, in a sentence, or None."""
    present = conn.execute(query("migrate", "schema_present")).fetchone()
    if not present or not present[0]:
        return "the database has no matcher schema"
    applied = {row[0] for row in conn.execute(query("migrate", "applied"))}
    missing = [m for m in load_migrations() if m.version not in applied]
    if not missing:
        return None
    first = missing[0]
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    return (
        f"the database schema is older than this matcher (migration "
        f"{first.version:04d}_{first.name}{more} not applied)"
    )
