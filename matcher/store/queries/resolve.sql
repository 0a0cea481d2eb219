-- name: sweep_deadlines
-- Time out the earliest-due waiting waits. SKIP LOCKED: a wait that ingest, a worker or
-- another daemon's sweeper holds is left for the next sweep. A wait whose key is still
-- queued for the rematch loop is left too: an event stored before the deadline may be
-- about to resolve it (a wait registered with its event already pending must match).
WITH due AS (
    SELECT w.id FROM matcher.waits AS w
    WHERE w.state = 'waiting' AND w.deadline <= now()
      AND NOT EXISTS (
          SELECT 1 FROM matcher.match_queue AS q
          WHERE q.tenant = w.tenant AND q.correlation_id = w.correlation_id
      )
    ORDER BY w.deadline
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
), resolved AS (
    UPDATE matcher.waits AS w
    SET state = 'timed_out', resolved_at = now(), resolution = 'deadline', version = w.version + 1
    FROM due
    WHERE w.id = due.id AND w.state = 'waiting'
    RETURNING w.id, w.tenant, w.run_id
), queued AS (
    INSERT INTO matcher.outbox (wait_id, tenant, run_id, outcome)
    SELECT id, tenant, run_id, 'timeout' FROM resolved
    RETURNING 1
)
SELECT count(*) FROM queued;

-- name: oldest_overdue
-- How far the sweeper is behind: the age of the earliest deadline still waiting.
SELECT extract(epoch FROM now() - min(deadline))
FROM matcher.waits WHERE state = 'waiting' AND deadline <= now();

-- name: cancel_wait
WITH resolved AS (
    UPDATE matcher.waits AS w
    SET state = 'cancelled', resolved_at = now(), resolution = 'cancel', version = w.version + 1
    WHERE w.id = %(wait_id)s AND w.state = 'waiting'
    RETURNING w.id, w.tenant, w.run_id
), queued AS (
    INSERT INTO matcher.outbox (wait_id, tenant, run_id, outcome)
    SELECT id, tenant, run_id, 'cancelled' FROM resolved
    RETURNING 1
)
SELECT count(*) FROM queued;
