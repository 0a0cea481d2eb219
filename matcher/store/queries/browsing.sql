-- The operator console's reads (matcher.admin.console). Every list is bounded (LIMIT) and
-- stays on an index; tests/integration/test_query_plans.py holds them to it.

-- name: oldest_waiting
-- The oldest waiting waits: the overview computes their verdicts (open_waits_oldest).
SELECT w.id, w.tenant, w.run_id, w.position, w.event_types, w.correlation_id,
       w.external_job_id, w.deadline, w.state, w.created_at, w.resolved_at, w.resolution,
       w.resolved_by_producer, w.resolved_by_event_id, w.needed,
       CASE WHEN w.needed IS NOT NULL THEN matcher.fan_in_json(w.id) END AS conditions
FROM matcher.open_waits AS o
JOIN matcher.waits AS w ON w.id = o.wait_id
WHERE o.top_level
ORDER BY o.created_at, o.wait_id
LIMIT %(limit)s;

-- name: events_of_correlations
-- Every stored event bearing on any of these correlation ids.
SELECT producer, event_id, tenant, type, correlation_id, external_job_id, occurred_at,
       received_at, kafka_topic, kafka_partition, kafka_offset, data, status,
       consumed_by, late_for, progress_for
FROM matcher.correlated_events
WHERE correlation_id = ANY (%(correlation_ids)s::text[])
ORDER BY received_at, producer, event_id
LIMIT %(limit)s;

-- name: quarantine_of_correlations
SELECT id, received_at, kafka_topic, kafka_partition, kafka_offset, reason, detail,
       producer, event_id, tenant, type, correlation_id, replayed_at, replay_result
FROM matcher.quarantine
WHERE correlation_id = ANY (%(correlation_ids)s::text[])
ORDER BY id
LIMIT %(limit)s;

-- name: queued_keys
-- The keys waiting for the rematch pass, and since when (match_queue_by_key).
SELECT tenant, correlation_id, min(not_before) AS queued_since
FROM matcher.match_queue
WHERE correlation_id = ANY (%(correlation_ids)s::text[])
GROUP BY tenant, correlation_id;

-- name: quarantine_last_hour
-- Records quarantined in the last hour, by reason (quarantine_received).
SELECT reason, count(*) AS records
FROM matcher.quarantine
WHERE received_at >= now() - interval '1 hour'
GROUP BY reason
ORDER BY reason;

-- name: waiting_oldest_first
SELECT w.id, w.tenant, w.run_id, w.position, w.event_types, w.correlation_id,
       w.external_job_id, w.deadline, w.state, w.created_at, w.resolved_at, w.resolution,
       w.resolved_by_producer, w.resolved_by_event_id, w.needed,
       CASE WHEN w.needed IS NOT NULL THEN matcher.fan_in_json(w.id) END AS conditions
FROM matcher.open_waits AS o
JOIN matcher.waits AS w ON w.id = o.wait_id
WHERE o.top_level
  AND (%(tenant)s::text IS NULL OR o.tenant = %(tenant)s)
ORDER BY o.created_at, o.wait_id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: waiting_newest_first
SELECT w.id, w.tenant, w.run_id, w.position, w.event_types, w.correlation_id,
       w.external_job_id, w.deadline, w.state, w.created_at, w.resolved_at, w.resolution,
       w.resolved_by_producer, w.resolved_by_event_id, w.needed,
       CASE WHEN w.needed IS NOT NULL THEN matcher.fan_in_json(w.id) END AS conditions
FROM matcher.open_waits AS o
JOIN matcher.waits AS w ON w.id = o.wait_id
WHERE o.top_level
  AND (%(tenant)s::text IS NULL OR o.tenant = %(tenant)s)
ORDER BY o.created_at DESC, o.wait_id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: waits_by_run
-- Waits of one run id, any state (waits_by_run); the other filters narrow them.
SELECT id, tenant, run_id, position, event_types, correlation_id, external_job_id, deadline,
       state, created_at, resolved_at, resolution, resolved_by_producer, resolved_by_event_id,
       needed, CASE WHEN needed IS NOT NULL THEN matcher.fan_in_json(id) END AS conditions
FROM matcher.waits
WHERE run_id = %(run_id)s AND group_id IS NULL
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(correlation_id)s::text IS NULL OR correlation_id = %(correlation_id)s)
  AND (%(job_id)s::text IS NULL OR external_job_id = %(job_id)s)
ORDER BY CASE WHEN %(newest)s::boolean THEN now() - created_at ELSE created_at - now() END, id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: waits_by_correlation
-- Waits with one correlation id, any state (waits_match): a fan-in wait when one of its
-- conditions has it.
SELECT id, tenant, run_id, position, event_types, correlation_id, external_job_id, deadline,
       state, created_at, resolved_at, resolution, resolved_by_producer, resolved_by_event_id,
       needed, CASE WHEN needed IS NOT NULL THEN matcher.fan_in_json(id) END AS conditions
FROM matcher.waits
WHERE id IN (SELECT coalesce(c.group_id, c.id) FROM matcher.waits AS c
             WHERE c.correlation_id = %(correlation_id)s)
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(job_id)s::text IS NULL OR external_job_id = %(job_id)s)
ORDER BY CASE WHEN %(newest)s::boolean THEN now() - created_at ELSE created_at - now() END, id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: waits_by_job
-- Waits for one external job id, any state (waits_by_job).
SELECT id, tenant, run_id, position, event_types, correlation_id, external_job_id, deadline,
       state, created_at, resolved_at, resolution, resolved_by_producer, resolved_by_event_id,
       needed, CASE WHEN needed IS NOT NULL THEN matcher.fan_in_json(id) END AS conditions
FROM matcher.waits
WHERE external_job_id = %(job_id)s AND group_id IS NULL
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
ORDER BY CASE WHEN %(newest)s::boolean THEN now() - created_at ELSE created_at - now() END, id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: waits_by_ids
-- The waits events point at (consumed_by, late_for): their runs, for links (waits_pkey).
SELECT id, tenant, run_id, position
FROM matcher.waits
WHERE id = ANY (%(ids)s::uuid[]);

-- name: run_progress
-- Where the run itself is, when the worker records it (runs_pkey).
SELECT position, status, last_resolution_id, updated_at
FROM matcher.runs
WHERE tenant = %(tenant)s AND run_id = %(run_id)s;

-- name: launches_of_run
SELECT id, tenant, run_id, position, idempotency_key, correlation_id, wait_id, external_job_id,
       state, created_at, updated_at, reconcile_attempts
FROM matcher.launches
WHERE tenant = %(tenant)s AND run_id = %(run_id)s
ORDER BY position, created_at
LIMIT %(limit)s;

-- name: audit_of_launches
SELECT launch_id, at, actor, answer, external_job_id, detail
FROM matcher.launch_audit
WHERE launch_id = ANY (%(ids)s::uuid[])
ORDER BY launch_id, id
LIMIT %(limit)s;

-- name: events_by_correlation_page
SELECT producer, event_id, tenant, type, correlation_id, external_job_id, occurred_at,
       received_at, kafka_topic, kafka_partition, kafka_offset, data, status,
       consumed_by, late_for, progress_for
FROM matcher.correlated_events
WHERE correlation_id = %(correlation_id)s
  AND (%(job_id)s::text IS NULL OR external_job_id = %(job_id)s)
ORDER BY received_at DESC, producer, event_id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: events_by_job_page
SELECT producer, event_id, tenant, type, correlation_id, external_job_id, occurred_at,
       received_at, kafka_topic, kafka_partition, kafka_offset, data, status,
       consumed_by, late_for, progress_for
FROM matcher.inbox
WHERE external_job_id = %(job_id)s
ORDER BY received_at DESC, producer, event_id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: events_pending_page
-- Without an id to look for: the pending events, newest first (inbox_pending_age).
SELECT producer, event_id, tenant, type, correlation_id, external_job_id, occurred_at,
       received_at, kafka_topic, kafka_partition, kafka_offset, data, status,
       consumed_by, late_for, progress_for
FROM matcher.inbox
WHERE status = 'pending'
ORDER BY received_at DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: quarantine_page
-- Quarantined records, newest first (quarantine_by_reason, quarantine_by_correlation, or
-- the primary key), with at most 2 KiB of each raw value: the console previews it, escaped.
SELECT id, received_at, kafka_topic, kafka_partition, kafka_offset, reason, detail,
       producer, event_id, tenant, type, correlation_id, replayed_at, replay_result,
       headers, substring(raw_value FROM 1 FOR 2048) AS value_preview,
       coalesce(raw_size, octet_length(raw_value)) AS value_size
FROM matcher.quarantine
WHERE (%(reason)s::text IS NULL OR reason = %(reason)s)
  AND (%(producer)s::text IS NULL OR producer = %(producer)s)
  AND (%(correlation_id)s::text IS NULL OR correlation_id = %(correlation_id)s)
ORDER BY id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: unreplayed_with_reason
-- How many records a replay by reason would judge again (quarantine_unreplayed).
SELECT count(*) AS records
FROM matcher.quarantine
WHERE replayed_at IS NULL AND reason = %(reason)s;

-- name: clock
SELECT now() AS now;

-- name: worker_failures_of_waits
-- Which of these waits' resumes a worker's handler failed on, parked or not
-- (worker_failures_by_run, then the wait ids).
SELECT wait_id, bool_or(parked_at IS NOT NULL) AS parked
FROM matcher.worker_failures
WHERE (tenant, run_id) IN (SELECT * FROM unnest(%(tenants)s::text[], %(run_ids)s::text[]))
  AND wait_id = ANY (%(ids)s::uuid[])
GROUP BY wait_id;

-- name: waits_with_worker_failures
-- Waits whose resume a worker's handler failed on: parked, or still being tried
-- (worker_failures_parked for the parked; the table holds only failures).
SELECT w.id, w.tenant, w.run_id, w.position, w.event_types, w.correlation_id,
       w.external_job_id, w.deadline, w.state, w.created_at, w.resolved_at, w.resolution,
       w.resolved_by_producer, w.resolved_by_event_id
FROM matcher.worker_failures AS f
JOIN matcher.waits AS w ON w.id = f.wait_id
WHERE (f.parked_at IS NOT NULL) = %(parked)s
ORDER BY f.last_failed_at DESC
LIMIT %(limit)s OFFSET %(offset)s;
