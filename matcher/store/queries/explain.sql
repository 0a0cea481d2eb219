-- name: waits_of_run
SELECT id, tenant, run_id, position, event_types, correlation_id, deadline, state,
       created_at, resolved_at, resolution, resolved_by_producer, resolved_by_event_id,
       external_job_id, condition::text AS condition, progress_types,
       extract(epoch FROM heartbeat_interval)::float8 AS heartbeat_interval_s, heartbeat_due,
       last_progress_at, needed,
       CASE WHEN needed IS NOT NULL THEN matcher.fan_in_json(id) END AS conditions
FROM matcher.waits
WHERE run_id = %(run_id)s AND group_id IS NULL AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
ORDER BY position DESC, created_at DESC
LIMIT 50;

-- name: events_by_correlation
SELECT producer, event_id, tenant, type, correlation_id, external_job_id, occurred_at,
       received_at, kafka_topic, kafka_partition, kafka_offset, data, status,
       consumed_by, late_for, progress_for,
       -- Whether its data satisfies the wait's condition (NULL: the wait has none).
       CASE WHEN %(condition)s::text IS NOT NULL
            THEN matcher.condition_holds(data, %(condition)s::jsonpath) END AS meets_condition
FROM matcher.correlated_events
WHERE correlation_id = ANY (%(correlation_ids)s::text[])
ORDER BY received_at, producer, event_id
LIMIT 200;

-- name: quarantine_by_correlation
SELECT id, received_at, kafka_topic, kafka_partition, kafka_offset, reason, detail,
       producer, event_id, tenant, type, correlation_id, replayed_at, replay_result
FROM matcher.quarantine
WHERE correlation_id = %(correlation_id)s
ORDER BY id
LIMIT 200;

-- name: refusals_by_correlation
-- Deliveries the ingress refused that claimed one of these correlation ids and this
-- tenant, or none (unverified): the newest of each producer and reason, with how many
-- there are, so that a flood of one kind cannot push another out of sight.
SELECT id, received_at, via, producer, reason, detail, http_status, claimed_event_id,
       claimed_type, claimed_tenant, claimed_correlation_id, kind_count
FROM (
    SELECT DISTINCT ON (producer, reason) *,
           count(*) OVER (PARTITION BY producer, reason) AS kind_count
    FROM matcher.refusals
    WHERE claimed_correlation_id = ANY (%(correlation_ids)s::text[])
      AND (claimed_tenant IS NULL OR claimed_tenant = %(tenant)s)
    ORDER BY producer, reason, id DESC
) AS newest
ORDER BY id DESC
LIMIT 20;

-- name: outbox_of_wait
SELECT resolution_id, resolved_at AS created_at, published FROM matcher.resolutions
WHERE wait_id = %(wait_id)s;

-- name: rematch_of_key
-- Whether the key waits for the rematch pass (a wait not yet checked against stored
-- events, or one ingest found busy), and the snapshot's clock.
SELECT now() AS now,
       (SELECT min(not_before) FROM matcher.match_queue
        WHERE tenant = %(tenant)s AND correlation_id = %(correlation_id)s) AS queued_since;

-- name: worker_of_wait
-- Past the resume topic: where the run stands (matcher.runs, which advance_v1 moves) and
-- what the workers' handlers made of this wait's resolution (matcher.worker_failures).
SELECT r."position" AS run_position, r.last_resolution_id, r.advanced_at,
       f.attempts, f.last_error, f.first_failed_at, f.last_failed_at, f.parked_at
FROM (SELECT 1) AS one
LEFT JOIN matcher.runs AS r ON r.tenant = %(tenant)s AND r.run_id = %(run_id)s
LEFT JOIN matcher.worker_failures AS f ON f.resolution_id = %(resolution_id)s;
