-- name: get_wait
SELECT id, tenant, run_id, position, event_types, correlation_id, external_job_id, deadline,
       state, created_at, resolved_at, resolution, resolved_by_producer, resolved_by_event_id
FROM matcher.waits WHERE id = %(wait_id)s;
