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

-- name: by_key
SELECT * FROM matcher.launches WHERE tenant = %(tenant)s AND idempotency_key = %(key)s;
