-- name: waits
SELECT id, tenant, run_id, position, event_types, correlation_id, external_job_id, deadline,
       state, created_at, resolved_at, resolution, resolved_by_producer, resolved_by_event_id,
       condition::text AS condition, progress_types,
       extract(epoch FROM heartbeat_interval)::float8 AS heartbeat_interval_s, heartbeat_due,
       last_progress_at, needed,
       CASE WHEN needed IS NOT NULL THEN matcher.fan_in_json(id) END AS conditions
FROM matcher.waits
WHERE group_id IS NULL AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(run_id)s::text IS NULL OR run_id = %(run_id)s)
  AND (%(correlation_id)s::text IS NULL OR id IN (
      SELECT coalesce(c.group_id, c.id) FROM matcher.waits AS c
      WHERE c.correlation_id = %(correlation_id)s))
  AND (%(external_job_id)s::text IS NULL OR external_job_id = %(external_job_id)s)
ORDER BY created_at DESC, id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: events
SELECT producer, event_id, tenant, type, correlation_id, external_job_id, occurred_at,
       received_at, kafka_topic, kafka_partition, kafka_offset, data, status,
       consumed_by, late_for, progress_for
FROM matcher.inbox
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(correlation_id)s::text IS NULL OR correlation_id = %(correlation_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(external_job_id)s::text IS NULL OR external_job_id = %(external_job_id)s)
ORDER BY received_at DESC, producer, event_id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: quarantine
SELECT id, received_at, kafka_topic, kafka_partition, kafka_offset, reason, detail,
       producer, event_id, tenant, type, correlation_id, replayed_at, replay_result
FROM matcher.quarantine
WHERE (%(reason)s::text IS NULL OR reason = %(reason)s)
  AND (%(correlation_id)s::text IS NULL OR correlation_id = %(correlation_id)s)
ORDER BY id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: refusals
-- Deliveries the ingress refused, newest first; claimed_* are the requests' unverified
-- claims.
SELECT id, received_at, via, producer, reason, detail, http_status, claimed_event_id,
       claimed_type, claimed_tenant, claimed_correlation_id
FROM matcher.refusals
WHERE (%(reason)s::text IS NULL OR reason = %(reason)s)
  AND (%(producer)s::text IS NULL OR producer = %(producer)s)
  AND (%(correlation_id)s::text IS NULL OR claimed_correlation_id = %(correlation_id)s)
ORDER BY id DESC
LIMIT %(limit)s OFFSET %(offset)s;
