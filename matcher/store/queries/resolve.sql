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
)
SELECT matcher.resolve_waits(coalesce(array_agg(id), '{}'), 'timed_out', 'deadline', 'timeout') FROM due;
