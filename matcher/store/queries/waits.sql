-- name: register_wait
-- Only the insert: no lock, no look at stored events (the caller's transaction may be
-- long, or REPEATABLE READ). The insert queues the key (trigger waits_queue_new), and the
-- daemon's rematch pass matches it against pending events once this commits.
INSERT INTO matcher.waits (
    id, tenant, run_id, position, event_types, correlation_id, external_job_id, deadline
)
VALUES (
    %(id)s, %(tenant)s, %(run_id)s, %(position)s, %(event_types)s::text[], %(correlation_id)s,
    %(external_job_id)s, %(deadline)s
)
RETURNING id, tenant, run_id, position, event_types, correlation_id, external_job_id, deadline,
          state, created_at, resolved_at, resolution, resolved_by_producer,
          resolved_by_event_id;

-- name: get_wait
SELECT id, tenant, run_id, position, event_types, correlation_id, external_job_id, deadline,
       state, created_at, resolved_at, resolution, resolved_by_producer, resolved_by_event_id
FROM matcher.waits WHERE id = %(wait_id)s;

-- name: committed_resume
-- The resume matcher committed for this resolution of this wait, as the relay publishes
-- it; nothing when there is none. The inbox row is looked up in its own day.
SELECT matcher.resume_message(o.resolution_id, o.outcome, w, i)::text AS message,
       (o.outcome = 'event' AND i.producer IS NULL) AS event_gone,
       o.message_sha256
FROM matcher.outbox AS o
JOIN matcher.waits AS w ON w.id = o.wait_id
LEFT JOIN matcher.inbox AS i
  ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
  AND i.received_at = w.resolved_by_received_at
WHERE o.wait_id = %(wait_id)s AND o.resolution_id = %(resolution_id)s;

-- name: advance_run
-- Move the run from the resume's position to the next, once: a duplicate resume finds the
-- run already past that position and changes nothing (invariant 9).
INSERT INTO matcher.runs AS r (tenant, run_id, position, last_resolution_id, version)
VALUES (%(tenant)s, %(run_id)s, %(position)s + 1, %(resolution_id)s, 1)
ON CONFLICT (tenant, run_id) DO UPDATE
SET position = EXCLUDED.position, last_resolution_id = EXCLUDED.last_resolution_id,
    version = r.version + 1, updated_at = now()
WHERE r.position = %(position)s
RETURNING r.position;
