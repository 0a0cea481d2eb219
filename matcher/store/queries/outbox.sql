-- name: claim_unpublished
-- The oldest queued resumes, each with its message (built by matcher.resume_message, which
-- advance() checks resumes against), deleted from the queue in the relay's transaction:
-- it commits only once Kafka has acknowledged them (the delete is the mark; a rollback or
-- a crash puts them back). A row another relay is publishing is skipped through its
-- transaction-scoped advisory lock, which writes nothing (a row lock is a WAL record per
-- row); the limit pulls candidates in id order, so few locks are tried.
WITH claimed AS (
    DELETE FROM matcher.resume_queue AS q
    WHERE q.id = ANY (ARRAY(
        SELECT c.id
        FROM (
            SELECT id FROM matcher.resume_queue ORDER BY id LIMIT 4 * %(limit)s
        ) AS c
        WHERE pg_try_advisory_xact_lock(20580, (c.id %% 2147483647)::integer)
        LIMIT %(limit)s
    ))
    RETURNING q.id, q.wait_id
)
SELECT c.id, w.run_id, w.outcome,
       extract(epoch FROM w.resolved_at - w.created_at)::float8 AS waited_s,
       extract(epoch FROM i.received_at)::float8 AS received_epoch,
       matcher.resume_message(w.resolution_id, w.outcome, w, i)::text AS message
FROM claimed AS c
JOIN matcher.waits AS w ON w.id = c.wait_id
LEFT JOIN matcher.inbox AS i
  ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
  AND i.received_at = w.resolved_by_received_at  -- one day of the inbox, not all
ORDER BY c.id;
