-- name: bootstrap
-- The schema and the version table exist before the first numbered migration runs.
CREATE SCHEMA IF NOT EXISTS matcher;
CREATE TABLE IF NOT EXISTS matcher.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: lock
-- One migrator at a time, across every process and machine sharing the database.
SELECT pg_advisory_lock(hashtextextended('matcher.migrate', 0));

-- name: unlock
SELECT pg_advisory_unlock(hashtextextended('matcher.migrate', 0));

-- name: applied
SELECT version, name, checksum FROM matcher.schema_migrations ORDER BY version;

-- name: record
INSERT INTO matcher.schema_migrations (version, name, checksum) VALUES (%s, %s, %s);

-- name: schema_present
-- Whether the database has matcher's schema at all (the version table `migrate` creates).
SELECT to_regclass('matcher.schema_migrations') IS NOT NULL AS present;
