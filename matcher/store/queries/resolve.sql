-- name: sweep_deadlines
-- Time out the earliest-due waiting waits: past their deadline, or their heartbeat come
-- due (resolution 'heartbeat' when that came first; the deadline caps it). SKIP LOCKED: a
-- wait that ingest, a worker or another daemon's sweeper holds is left for the next
-- sweep; a progress event that moved its heartbeat on while it was held is seen when the
-- lock is taken (the row is read again). A wait whose key is still queued for the rematch
-- loop is left too: an event stored before the deadline may be about to resolve it (a
-- wait registered with its event already pending must match).
WITH candidates AS (
    (SELECT o.wait_id AS id FROM matcher.open_waits AS o
     WHERE o.deadline <= now()
     ORDER BY o.deadline
     LIMIT %(limit)s)
    UNION
    (SELECT o.wait_id AS id FROM matcher.open_waits AS o
     WHERE o.heartbeat_due <= now()
     ORDER BY o.heartbeat_due
     LIMIT %(limit)s)
), due AS (
    SELECT w.id,
           CASE WHEN w.heartbeat_due <= now()
                     AND w.heartbeat_due < coalesce(w.deadline, 'infinity')
                THEN 'heartbeat' ELSE 'deadline' END AS how
    FROM matcher.waits AS w
    JOIN candidates AS c ON c.id = w.id
    WHERE w.state = 'waiting' AND (w.deadline <= now() OR w.heartbeat_due <= now())
      AND NOT EXISTS (
          SELECT 1 FROM matcher.match_queue AS q
          WHERE q.tenant = w.tenant AND q.correlation_id = w.correlation_id
      )
      -- A fan-in wait: nor any of its conditions' keys.
      AND (w.needed IS NULL OR NOT EXISTS (
          SELECT 1 FROM matcher.waits AS c
          JOIN matcher.match_queue AS q
            ON q.tenant = c.tenant AND q.correlation_id = c.correlation_id
          WHERE c.group_id = w.id AND c.state = 'waiting'
      ))
    ORDER BY least(w.deadline, w.heartbeat_due)
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
)
SELECT
    matcher.resolve_waits(coalesce(array_agg(id) FILTER (WHERE how = 'deadline'), '{}'),
                          'timed_out', 'deadline', 'timeout') AS by_deadline,
    matcher.resolve_waits(coalesce(array_agg(id) FILTER (WHERE how = 'heartbeat'), '{}'),
                          'timed_out', 'heartbeat', 'timeout') AS by_heartbeat
FROM due;
