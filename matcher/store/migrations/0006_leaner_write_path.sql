-- Fewer index entries written per resolution; each was paid on the hot path (a wait is
-- updated, and an outbox row written, for every event that resolves one).

-- Resolution ids are random (v4) UUIDs that nothing looks up by: their unique index cost a
-- random-page insert per resolution and guarded against nothing real.
ALTER TABLE matcher.outbox DROP CONSTRAINT outbox_resolution_id_key;

-- Every outbox row is written by the statement that resolves its wait, from the wait row
-- it has just updated (and locked): the foreign key checked, per row, what cannot fail.
-- The one-resolution-per-wait guarantee is the unique index on wait_id, which stays.
ALTER TABLE matcher.outbox DROP CONSTRAINT outbox_wait_id_fkey;

-- One index serves matching (tenant and correlation id) and explain's lookup by
-- correlation id alone, in place of two.
DROP INDEX matcher.waits_match;
DROP INDEX matcher.waits_by_correlation;
CREATE INDEX waits_match ON matcher.waits (correlation_id, tenant);
