-- name: claim_keys
-- Queued keys that are due, taken out of the queue in this transaction (a crash puts them
-- back). SKIP LOCKED: several daemons share the queue without waiting on each other.
WITH claimed AS (
    SELECT id FROM matcher.match_queue
    WHERE not_before <= now()
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM matcher.match_queue AS q
USING claimed
WHERE q.id = claimed.id
RETURNING q.tenant, q.correlation_id;

-- name: pending_for_keys
-- The keys' pending events, oldest first (as ingest would have taken them), locked
-- against the janitor's expiry.
SELECT i.producer, i.event_id, i.tenant, i.type, i.correlation_id, i.received_at
FROM matcher.inbox AS i
JOIN (SELECT DISTINCT t, c FROM unnest(%(tenant)b::text[], %(correlation_id)b::text[]) AS u(t, c)) AS k
  ON i.tenant = k.t AND i.correlation_id = k.c
WHERE i.status = 'pending'
ORDER BY i.received_at, i.kafka_partition, i.kafka_offset
FOR UPDATE OF i;

-- name: settle_pending
-- Pending events that the loop matched (consumed) or found late.
UPDATE matcher.inbox AS i
SET status = u.status, consumed_by = u.consumed_by, late_for = u.late_for, status_at = now()
FROM unnest(
    %(producer)b::text[], %(event_id)b::text[], %(received_at)b::timestamptz[],
    %(status)b::text[], %(consumed_by)b::uuid[], %(late_for)b::uuid[]
) AS u(producer, event_id, received_at, status, consumed_by, late_for)
WHERE i.producer = u.producer AND i.event_id = u.event_id AND i.received_at = u.received_at
  AND i.status = 'pending'
RETURNING 1;
