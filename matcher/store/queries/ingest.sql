-- name: lock_keys
-- (Array parameters use binary placeholders: psycopg's C dumpers encode them far
-- faster than the text form, and every statement here carries a whole batch.)
-- Every (tenant, correlation id) of the batch, in one fixed order (invariant 2: batches and
-- registrations take the same locks, sorted, so they cannot deadlock each other), and
-- every (producer, event id): the inbox is partitioned and has no unique key across days,
-- so two batches holding the same event id must not both find it new (invariant 1).
SELECT pg_advisory_xact_lock(k)
FROM (
    SELECT matcher.wait_key(t, c) AS k
    FROM unnest(%(tenant)b::text[], %(correlation_id)b::text[]) AS u(t, c)
    UNION
    SELECT matcher.event_key(p, e)
    FROM unnest(%(producer)b::text[], %(event_id)b::text[]) AS u(p, e)
    ORDER BY 1
) AS keys;

-- name: stored_events
SELECT i.producer, i.event_id
FROM matcher.inbox AS i
JOIN unnest(%(producer)b::text[], %(event_id)b::text[]) AS u(producer, event_id)
  ON i.producer = u.producer AND i.event_id = u.event_id;

-- name: waits_for_keys
-- Waiting waits to resolve, and timed-out or cancelled ones to recognise late events.
SELECT w.id, w.tenant, w.correlation_id, w.event_types, w.state, w.created_at, w.resolved_at
FROM matcher.waits AS w
JOIN (SELECT DISTINCT t, c FROM unnest(%(tenant)b::text[], %(correlation_id)b::text[]) AS u(t, c)) AS k
  ON w.tenant = k.t AND w.correlation_id = k.c
WHERE w.state <> 'matched'
FOR UPDATE OF w;

-- name: insert_inbox
-- Rows arrive with their final status, so each event is written once.
INSERT INTO matcher.inbox (
    producer, event_id, tenant, type, correlation_id, external_job_id, occurred_at,
    kafka_topic, kafka_partition, kafka_offset, data, status, consumed_by, late_for
)
SELECT *
FROM unnest(
    %(producer)b::text[], %(event_id)b::text[], %(tenant)b::text[], %(type)b::text[],
    %(correlation_id)b::text[], %(external_job_id)b::text[], %(occurred_at)b::timestamptz[],
    %(topic)b::text[], %(partition)b::integer[], %(offset)b::bigint[], %(data)b::jsonb[],
    %(status)b::text[], %(consumed_by)b::uuid[], %(late_for)b::uuid[]
)
ON CONFLICT DO NOTHING
RETURNING producer, event_id;

-- name: resolve_by_events
-- The conditional update (invariant 3) and the outbox rows, in the batch's transaction.
WITH resolved AS (
    UPDATE matcher.waits AS w
    SET state = 'matched', resolved_at = now(), resolution = 'event',
        resolved_by_producer = u.producer, resolved_by_event_id = u.event_id,
        resolved_by_received_at = now(),  -- the batch's inbox rows are stored with now()
        version = w.version + 1
    FROM unnest(%(wait_id)b::uuid[], %(producer)b::text[], %(event_id)b::text[])
        AS u(wait_id, producer, event_id)
    WHERE w.id = u.wait_id AND w.state = 'waiting'
    RETURNING w.id, w.tenant, w.run_id
), queued AS (
    INSERT INTO matcher.outbox (wait_id, tenant, run_id, outcome)
    SELECT id, tenant, run_id, 'event' FROM resolved
    RETURNING 1
)
SELECT count(*) FROM queued;

-- name: quarantine
-- A redelivered poison message is recorded once (its Kafka coordinates are unique).
INSERT INTO matcher.quarantine (
    kafka_topic, kafka_partition, kafka_offset, kafka_key, raw_value, headers, reason, detail,
    producer, event_id, tenant, type, correlation_id
)
SELECT *
FROM unnest(
    %(topic)b::text[], %(partition)b::integer[], %(offset)b::bigint[], %(key)b::bytea[],
    %(value)b::bytea[], %(headers)b::jsonb[], %(reason)b::text[], %(detail)b::text[],
    %(producer)b::text[], %(event_id)b::text[], %(tenant)b::text[], %(type)b::text[],
    %(correlation_id)b::text[]
)
ON CONFLICT (kafka_topic, kafka_partition, kafka_offset) DO NOTHING;

-- name: notify_outbox
-- Wakes the relays (delivered at commit, so never before the rows are visible).
SELECT pg_notify('matcher_outbox', '');
