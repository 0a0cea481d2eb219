-- name: lock_key
SELECT pg_advisory_xact_lock(matcher.wait_key(%(tenant)s, %(correlation_id)s));

-- name: register_wait
-- Insert the wait; if a pending event already matches (it arrived first), resolve the wait
-- with it at once: the oldest such event, as ingest would have chosen. The caller holds the
-- key lock, so ingest cannot slip an event in between the look and the insert.
WITH hit AS (
    SELECT producer, event_id, received_at FROM matcher.inbox
    WHERE status = 'pending' AND tenant = %(tenant)s AND correlation_id = %(correlation_id)s
      AND type = ANY(%(event_types)s::text[])
    ORDER BY received_at, kafka_partition, kafka_offset
    LIMIT 1
    FOR UPDATE
), inserted AS (
    INSERT INTO matcher.waits (
        id, tenant, run_id, position, event_types, correlation_id, external_job_id, deadline,
        state, resolved_at, resolution, resolved_by_producer, resolved_by_event_id,
        resolved_by_received_at
    )
    SELECT %(id)s, %(tenant)s, %(run_id)s, %(position)s, %(event_types)s::text[],
           %(correlation_id)s, %(external_job_id)s, %(deadline)s,
           CASE WHEN hit.event_id IS NULL THEN 'waiting' ELSE 'matched' END,
           CASE WHEN hit.event_id IS NULL THEN NULL ELSE now() END,
           CASE WHEN hit.event_id IS NULL THEN NULL ELSE 'event' END,
           hit.producer, hit.event_id, hit.received_at
    FROM (VALUES (1)) AS one LEFT JOIN hit ON true
    RETURNING *
), consumed AS (
    UPDATE matcher.inbox AS i
    SET status = 'consumed', consumed_by = inserted.id, status_at = now()
    FROM inserted, hit
    WHERE i.producer = hit.producer AND i.event_id = hit.event_id
      AND i.received_at = hit.received_at  -- one partition, not all
    RETURNING 1
), queued AS (
    INSERT INTO matcher.outbox (wait_id, tenant, run_id, outcome)
    SELECT id, tenant, run_id, 'event' FROM inserted WHERE state = 'matched'
    RETURNING pg_notify('matcher_outbox', '')
)
SELECT inserted.id, inserted.tenant, inserted.run_id, inserted.position, inserted.event_types,
       inserted.correlation_id, inserted.external_job_id, inserted.deadline, inserted.state,
       inserted.created_at, inserted.resolved_at, inserted.resolution,
       inserted.resolved_by_producer, inserted.resolved_by_event_id,
       (SELECT count(*) FROM consumed) + (SELECT count(*) FROM queued) AS side_effects
FROM inserted;

-- name: get_wait
SELECT id, tenant, run_id, position, event_types, correlation_id, external_job_id, deadline,
       state, created_at, resolved_at, resolution, resolved_by_producer, resolved_by_event_id
FROM matcher.waits WHERE id = %(wait_id)s;

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
