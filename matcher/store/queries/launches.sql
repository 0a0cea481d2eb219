-- name: insert_launch
-- The intent and its wait in one statement, both or neither: a retried launch (same tenant
-- and idempotency key) inserts nothing and the caller reads the first one back. The
-- unique key is the only synchronisation (no lock in the caller's transaction): a
-- concurrent retry waits for the first insert to commit or roll back, then does nothing
-- (READ COMMITTED) or fails with a serialization error to retry (REPEATABLE READ and
-- SERIALIZABLE, as for any write conflict at those levels). The launch's foreign key to
-- its wait is checked at the end of the statement, when both rows exist.
WITH launch AS (
    INSERT INTO matcher.launches (
        id, tenant, run_id, position, idempotency_key, correlation_id, wait_id
    )
    VALUES (%(id)s, %(tenant)s, %(run_id)s, %(position)s, %(idempotency_key)s,
            %(correlation_id)s, %(wait_id)s)
    ON CONFLICT (tenant, idempotency_key) DO NOTHING
    RETURNING *
), wait AS (
    INSERT INTO matcher.waits (id, tenant, run_id, position, event_types, correlation_id, deadline)
    SELECT wait_id, tenant, run_id, position, %(event_types)s::text[], correlation_id,
           %(deadline)s
    FROM launch
    RETURNING id
)
SELECT launch.* FROM launch;

-- name: launch_by_key
SELECT * FROM matcher.launches WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s;

-- name: get_launch
SELECT * FROM matcher.launches WHERE id = %(id)s;

-- name: record_job_id
-- The first job id recorded wins; recording the same one again is a no-op that succeeds.
WITH launch AS (
    UPDATE matcher.launches
    SET external_job_id = %(external_job_id)s, state = 'submitted', updated_at = now()
    WHERE id = %(id)s AND state = 'intent'
    RETURNING id, wait_id
), wait AS (
    UPDATE matcher.waits AS w SET external_job_id = %(external_job_id)s
    FROM launch WHERE w.id = launch.wait_id
    RETURNING w.id
), audit AS (
    INSERT INTO matcher.launch_audit (launch_id, actor, answer, external_job_id)
    SELECT id, 'worker', 'submitted', %(external_job_id)s FROM launch
)
SELECT (SELECT count(*) FROM launch) AS recorded,
       (SELECT external_job_id FROM matcher.launches WHERE id = %(id)s) AS current_job_id,
       (SELECT count(*) FROM matcher.launches WHERE id = %(id)s) AS found;

-- name: unsubmitted
-- Intents older than the threshold with no job id: candidates for reconciliation.
SELECT id FROM matcher.launches
WHERE state = 'intent' AND created_at < now() - %(older_than)s::interval
ORDER BY created_at
LIMIT %(limit)s;

-- name: lock_intent
SELECT * FROM matcher.launches WHERE id = %(id)s AND state = 'intent' FOR UPDATE SKIP LOCKED;

-- name: reconcile_found
WITH launch AS (
    UPDATE matcher.launches
    SET external_job_id = %(external_job_id)s, state = 'reconciled', updated_at = now(),
        reconcile_attempts = reconcile_attempts + 1
    WHERE id = %(id)s
    RETURNING wait_id
)
UPDATE matcher.waits AS w SET external_job_id = %(external_job_id)s FROM launch WHERE w.id = launch.wait_id;

-- name: reconcile_not_found
UPDATE matcher.launches
SET state = 'failed', updated_at = now(), reconcile_attempts = reconcile_attempts + 1
WHERE id = %(id)s;

-- name: reconcile_unknown
UPDATE matcher.launches
SET reconcile_attempts = reconcile_attempts + 1, updated_at = now()
WHERE id = %(id)s;

-- name: audit
INSERT INTO matcher.launch_audit (launch_id, actor, answer, external_job_id, detail)
VALUES (%(id)s, %(actor)s, %(answer)s, %(external_job_id)s, %(detail)s);

-- name: audit_of
SELECT at, actor, answer, external_job_id, detail FROM matcher.launch_audit
WHERE launch_id = %(id)s ORDER BY id;
