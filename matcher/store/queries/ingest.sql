-- name: lock_wait_keys
-- (Array parameters use binary placeholders: psycopg's C dumpers encode them far
-- faster than the text form, and every statement here carries a whole batch.)
-- Every (tenant, correlation id) of the batch, in one fixed order (invariant 2: batches,
-- registrations and the rematch loop take the same locks, sorted, so they cannot
-- deadlock each other).
SELECT pg_advisory_xact_lock(k)
FROM (
    SELECT DISTINCT matcher.wait_key(t, c) AS k
    FROM unnest(%(tenant)b::text[], %(correlation_id)b::text[]) AS u(t, c)
    ORDER BY 1
) AS keys;

-- name: claim_event_ids
-- The batch's (producer, event id) pairs not stored before (invariant 1): each new one is
-- claimed here, in this transaction, and comes back; a duplicate does not. An id another
-- batch has claimed but not committed makes this wait for that batch's end (then it is a
-- duplicate, or ours if that batch rolled back). Claimed in one sorted order, so two
-- batches sharing ids wait for each other in one direction only.
INSERT INTO matcher.event_ids (producer, event_id)
SELECT p, e
FROM unnest(%(producer)b::text[], %(event_id)b::text[]) AS u(p, e)
ORDER BY p, e
ON CONFLICT DO NOTHING
RETURNING producer, event_id;

-- name: waits_for_keys
-- Waiting waits to resolve, and timed-out or cancelled ones to recognise late events. Each
-- is locked here unless another transaction holds it (a worker's cancel or job id, still
-- uncommitted): such a wait comes back "busy", with its last committed state, and its key
-- is left to the rematch loop rather than waited for (a worker's transaction, however
-- long, must not hold up a batch). The state returned is the locked row's, which is
-- current: the outer read only finds the candidates.
SELECT w.id, w.tenant, w.correlation_id, w.event_types,
       coalesce(l.state, w.state) AS state, w.created_at,
       coalesce(l.resolved_at, w.resolved_at) AS resolved_at,
       l.id IS NULL AS busy
FROM matcher.waits AS w
JOIN (SELECT DISTINCT t, c FROM unnest(%(tenant)b::text[], %(correlation_id)b::text[]) AS u(t, c)) AS k
  ON w.tenant = k.t AND w.correlation_id = k.c
LEFT JOIN LATERAL (
    SELECT x.id, x.state, x.resolved_at FROM matcher.waits AS x
    WHERE x.id = w.id
    FOR UPDATE SKIP LOCKED
) AS l ON true
WHERE w.state <> 'matched';

-- name: queued_keys
-- Keys whose waits have not had their look at stored events yet (see match_queue): their
-- events go to the rematch loop too, which takes the oldest pending event first.
SELECT DISTINCT q.tenant, q.correlation_id
FROM matcher.match_queue AS q
JOIN (SELECT DISTINCT t, c FROM unnest(%(tenant)b::text[], %(correlation_id)b::text[]) AS u(t, c)) AS k
  ON q.tenant = k.t AND q.correlation_id = k.c;

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
-- Waits resolved by events (ingest and the rematch pass); see matcher.resolve_waits. An
-- event stored in this transaction has received_at NULL here: its inbox row has now().
SELECT matcher.resolve_waits(
    %(wait_id)b::uuid[], 'matched', 'event', 'event',
    %(producer)b::text[], %(event_id)b::text[], %(received_at)b::timestamptz[]
);

-- name: queue_keys
-- Keys left to the rematch loop (their waits were busy); it is woken at commit.
WITH queued AS (
    INSERT INTO matcher.match_queue (tenant, correlation_id, not_before)
    SELECT t, c, now() + %(after)s::interval
    FROM unnest(%(tenant)b::text[], %(correlation_id)b::text[]) AS u(t, c)
    RETURNING 1
)
SELECT pg_notify('matcher_match', '') FROM (SELECT count(*) AS n FROM queued) AS q WHERE q.n > 0;

-- name: quarantine
-- A redelivered poison message is recorded once (its Kafka coordinates are unique).
INSERT INTO matcher.quarantine (
    kafka_topic, kafka_partition, kafka_offset, kafka_key, raw_value, headers, reason, detail,
    producer, event_id, tenant, type, correlation_id, arrived_at, raw_size, raw_sha256,
    raw_truncated
)
SELECT *
FROM unnest(
    %(topic)b::text[], %(partition)b::integer[], %(offset)b::bigint[], %(key)b::bytea[],
    %(value)b::bytea[], %(headers)b::jsonb[], %(reason)b::text[], %(detail)b::text[],
    %(producer)b::text[], %(event_id)b::text[], %(tenant)b::text[], %(type)b::text[],
    %(correlation_id)b::text[], %(arrived_at)b::timestamptz[], %(size)b::integer[],
    %(sha256)b::bytea[], %(truncated)b::boolean[]
)
ON CONFLICT (kafka_topic, kafka_partition, kafka_offset) DO NOTHING;
