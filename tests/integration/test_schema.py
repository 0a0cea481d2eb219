"""matcher/store/schema.sql is what the migrations add up to.

One empty database is migrated, another is loaded from schema.sql; their catalogs
(tables, columns, constraints, indexes, functions, triggers of the matcher schema) must
be the same. Compared through the catalog rather than as dump text, so a different
pg_dump or server version does not make it fail when nothing differs.
"""

from __future__ import annotations

import psycopg
import pytest

from matcher.store.migrate import migrate
from matcher.store.schema_file import SCHEMA_FILE

# (kind, name, definition) for everything in the schema but the day partitions (created
# by date) and the migrations' own table.
CATALOG = """
SELECT 'column', c.relname || '.' || a.attname,
       format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
       || CASE a.attidentity::text WHEN '' THEN '' ELSE ' identity ' || a.attidentity::text END
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = 'matcher' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND c.relname <> 'schema_migrations' AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint', c.relname || '.' || k.conname, pg_get_constraintdef(k.oid)
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'matcher' AND NOT c.relispartition AND c.relname <> 'schema_migrations'
UNION ALL
SELECT 'index', i.indexname, i.indexdef FROM pg_indexes i
JOIN pg_class c ON c.relname = i.tablename
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = i.schemaname
WHERE i.schemaname = 'matcher' AND NOT c.relispartition AND i.tablename <> 'schema_migrations'
UNION ALL
SELECT 'function', p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
       pg_get_functiondef(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'matcher'
UNION ALL
SELECT 'trigger', t.tgname, pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'matcher' AND NOT t.tgisinternal AND NOT c.relispartition
ORDER BY 1, 2
"""


def _catalog(url: str) -> list[tuple[str, str, str]]:
    with psycopg.connect(url) as conn:
        return [(str(a), str(b), str(c)) for a, b, c in conn.execute(CATALOG).fetchall()]


@pytest.fixture
def loaded_db(empty_db: str) -> str:
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(SCHEMA_FILE.read_text().encode())  # the file as a whole, as psql would
    return empty_db


def test_schema_sql_is_what_the_migrations_make(db_url: str, loaded_db: str) -> None:
    migrated, loaded = _catalog(db_url), _catalog(loaded_db)
    assert len(migrated) > 100  # the catalog query sees the schema at all
    only_migrated = sorted(set(migrated) - set(loaded))
    only_loaded = sorted(set(loaded) - set(migrated))
    assert (only_migrated, only_loaded) == ([], []), (
        "matcher/store/schema.sql differs from the migrations: run `make schema-sql`"
    )


def test_migrating_a_loaded_schema_is_refused_not_doubled(loaded_db: str) -> None:
    """schema.sql is for reading; a database made from it has no migration records, so
    migrating it fails on the first object that exists rather than applying twice."""
    with pytest.raises((psycopg.errors.DuplicateObject, psycopg.errors.DuplicateFunction)):
        migrate(loaded_db)
