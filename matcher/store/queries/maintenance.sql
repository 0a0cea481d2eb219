-- name: expire_pending
-- Pending events past the retention stop being candidates for new waits.
WITH due AS (
    SELECT producer, event_id, received_at FROM matcher.inbox
    WHERE status = 'pending' AND received_at < now() - %(retention)s::interval
    ORDER BY received_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE matcher.inbox AS i
SET status = 'expired', status_at = now()
FROM due
WHERE i.producer = due.producer AND i.event_id = due.event_id
  AND i.received_at = due.received_at AND i.status = 'pending';

-- name: purge_quarantine
-- Quarantined records past MATCHER_QUARANTINE_RETENTION, oldest first, a bounded batch at
-- a time (a flood of hostile records must not become one long delete).
DELETE FROM matcher.quarantine
WHERE id IN (
    SELECT id FROM matcher.quarantine
    WHERE received_at < now() - %(retention)s::interval
    ORDER BY received_at
    LIMIT %(limit)s
);

-- name: ensure_partitions
-- Days are created ahead of need, so an insert never finds its day missing.
SELECT matcher.ensure_inbox_partitions(now(), now() + %(ahead)s::interval);

-- name: try_maintenance_lock
-- One janitor at a time detaches and drops days (a session lock: DETACH ... CONCURRENTLY
-- cannot run inside a transaction).
SELECT pg_try_advisory_lock(hashtextextended('matcher.inbox purge', 0));

-- name: release_maintenance_lock
SELECT pg_advisory_unlock(hashtextextended('matcher.inbox purge', 0));

-- name: expired_days
-- The day partitions wholly past the dedupe window (retention + purge window), oldest
-- first, with the state of an interrupted detach to finish.
SELECT c.relname AS name, i.inhdetachpending AS detach_pending,
       to_date(substr(c.relname, 8), 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC' AS starts,
       (to_date(substr(c.relname, 8), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' AS ends
FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'matcher.inbox'::regclass
  AND c.relname ~ '^inbox_p[0-9]{8}$'
  AND (to_date(substr(c.relname, 8), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC'
      <= now() - %(keep)s::interval
ORDER BY c.relname;

-- name: day_still_needed
-- An unpublished resume still carries an event of this day: keep the day until the relay
-- has published it (it reads the event when it builds the message).
-- Every queued resume is read (the queue is short but for an outage), each wait looked up
-- by its key (OFFSET 0 keeps the lookup a nested loop, not a scan of all waits).
SELECT EXISTS (
    SELECT 1
    FROM matcher.resume_queue AS q
    CROSS JOIN LATERAL (
        SELECT 1 FROM matcher.waits AS w
        WHERE w.id = q.wait_id
          AND w.resolved_by_received_at >= %(starts)s AND w.resolved_by_received_at < %(ends)s
        OFFSET 0
    ) AS in_day
);

-- name: count_day
SELECT count(*) FROM {day};

-- name: forget_day_ids
-- The ids of a day about to be dropped, a bounded batch at a time (keyset over the day's
-- primary key, from after the last pair of the batch before): once forgotten, the day's
-- events no longer count as duplicates, as when their rows go. Only ids claimed on that
-- day are deleted: an id seen again since (past the window, so stored as new) is kept.
-- Returns the last pair of the batch, its size and the ids deleted; none when the day is
-- done.
-- The resumes these events resolved (a fan-in wait's, through its condition) get the
-- digest of their message first: verify_resume_v1 checks them against it once the message
-- can no longer be rebuilt. Written here, when it becomes needed, not per publication.
WITH chunk AS (
    SELECT producer, event_id, consumed_by FROM {day}
    WHERE (producer, event_id) > (%(after_producer)s::text, %(after_event_id)s::text)
    ORDER BY producer, event_id
    LIMIT %(limit)s
), digested AS (
    UPDATE matcher.waits AS w
    SET resume_sha256 = sha256(convert_to((
        SELECT matcher.resume_message(w.resolution_id, w.outcome, w, i)::text
        FROM (SELECT) AS one
        LEFT JOIN matcher.inbox AS i
          ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
          AND i.received_at = w.resolved_by_received_at
    ), 'UTF8'))
    FROM (
        SELECT DISTINCT coalesce(x.group_id, x.id) AS id
        FROM chunk AS c JOIN matcher.waits AS x ON x.id = c.consumed_by
    ) AS r
    WHERE w.id = r.id AND w.resolution_id IS NOT NULL AND w.resume_sha256 IS NULL
    RETURNING 1
), forgotten AS (
    DELETE FROM matcher.event_ids AS e
    USING chunk AS c
    WHERE e.producer = c.producer AND e.event_id = c.event_id
      AND e.received_at >= %(starts)s AND e.received_at < %(ends)s
    RETURNING 1
)
SELECT producer, event_id, (SELECT count(*) FROM chunk) AS n,
       (SELECT count(*) FROM forgotten) AS deleted
FROM chunk
ORDER BY producer DESC, event_id DESC
LIMIT 1;

-- name: detach_day
ALTER TABLE matcher.inbox DETACH PARTITION {day} CONCURRENTLY;

-- name: finish_detach_day
ALTER TABLE matcher.inbox DETACH PARTITION {day} FINALIZE;

-- name: drop_day
DROP TABLE {day};

-- name: purge_refusals
-- Refused deliveries past MATCHER_QUARANTINE_RETENTION (the same retention as the
-- quarantine's: both are what was refused), oldest first, a bounded batch at a time.
DELETE FROM matcher.refusals
WHERE id IN (
    SELECT id FROM matcher.refusals
    WHERE received_at < now() - %(retention)s::interval
    ORDER BY received_at
    LIMIT %(limit)s
);
