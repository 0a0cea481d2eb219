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
-- against the janitor's expiry; each with the waits of its key (not matched) whose
-- condition its data does not satisfy.
SELECT i.producer, i.event_id, i.tenant, i.type, i.correlation_id, i.received_at,
       ARRAY(
           SELECT w.id FROM matcher.waits AS w
           WHERE w.tenant = i.tenant AND w.correlation_id = i.correlation_id
             AND w.state <> 'matched' AND w.condition IS NOT NULL
             AND i.type = ANY (w.event_types)
             AND NOT matcher.condition_holds(i.data, w.condition)
       ) AS refused_by
FROM matcher.inbox AS i
JOIN (SELECT DISTINCT t, c FROM unnest(%(tenant)b::text[], %(correlation_id)b::text[]) AS u(t, c)) AS k
  ON i.tenant = k.t AND i.correlation_id = k.c
WHERE i.status = 'pending'
ORDER BY i.received_at, i.kafka_partition, i.kafka_offset
FOR UPDATE OF i;

-- name: settle_pending
-- Pending events that the loop matched (consumed), found late, or linked as progress.
UPDATE matcher.inbox AS i
SET status = u.status, consumed_by = u.consumed_by, late_for = u.late_for,
    progress_for = u.progress_for, status_at = now()
FROM unnest(
    %(producer)b::text[], %(event_id)b::text[], %(received_at)b::timestamptz[],
    %(status)b::text[], %(consumed_by)b::uuid[], %(late_for)b::uuid[], %(progress_for)b::uuid[]
) AS u(producer, event_id, received_at, status, consumed_by, late_for, progress_for)
WHERE i.producer = u.producer AND i.event_id = u.event_id AND i.received_at = u.received_at
  AND i.status = 'pending'
RETURNING 1;

-- name: lock_wait_keys
-- Every key of the pass, in one fixed order: the locks ingest takes (matcher.ingest_events;
-- invariant 2: batches and the rematch loop take the same locks, sorted, so they cannot
-- deadlock each other).
SELECT pg_advisory_xact_lock(k)
FROM (
    SELECT DISTINCT matcher.wait_key(t, c) AS k
    FROM unnest(%(tenant)b::text[], %(correlation_id)b::text[]) AS u(t, c)
    ORDER BY 1
) AS keys;

-- name: waits_for_keys
-- Waiting waits to resolve, and timed-out or cancelled ones to recognise late events (as
-- matcher.ingest_events reads them). Each
-- is locked here unless another transaction holds it (a worker's cancel or job id, still
-- uncommitted): such a wait comes back "busy", with its last committed state, and its key
-- is left to the rematch loop rather than waited for (a worker's transaction, however
-- long, must not hold up a batch). The state returned is the locked row's, which is
-- current: the outer read only finds the candidates. A fan-in condition comes with its
-- wait's lock (busy when held elsewhere: one transaction at a time decides for a fan-in
-- wait) and how many more conditions the wait needs; fan-in waits themselves are never
-- matched.
SELECT w.id, w.tenant, w.correlation_id, w.event_types,
       coalesce(l.state, w.state) AS state, w.created_at,
       coalesce(l.resolved_at, w.resolved_at) AS resolved_at,
       l.id IS NULL OR (w.group_id IS NOT NULL AND w.state = 'waiting' AND g.id IS NULL) AS busy,
       coalesce(w.progress_types, '{}') AS progress_types, w.group_id,
       g.needed - (SELECT count(*) FROM matcher.waits AS c
                   WHERE c.group_id = w.group_id AND c.state = 'matched'
                     AND c.resolution = 'event') AS still_needed
FROM matcher.waits AS w
JOIN (SELECT DISTINCT t, c FROM unnest(%(tenant)b::text[], %(correlation_id)b::text[]) AS u(t, c)) AS k
  ON w.tenant = k.t AND w.correlation_id = k.c
LEFT JOIN LATERAL (
    SELECT x.id, x.state, x.resolved_at FROM matcher.waits AS x
    WHERE x.id = w.id
    FOR UPDATE SKIP LOCKED
) AS l ON true
LEFT JOIN LATERAL (
    SELECT p.id, p.needed FROM matcher.waits AS p
    WHERE p.id = w.group_id AND w.state = 'waiting'
    FOR UPDATE SKIP LOCKED
) AS g ON true
WHERE w.state <> 'matched' AND w.needed IS NULL;

-- name: resolve_by_events
-- Waits resolved by pending events; see matcher.resolve_waits.
SELECT matcher.resolve_waits(
    %(wait_id)b::uuid[], 'matched', 'event', 'event',
    %(producer)b::text[], %(event_id)b::text[], %(received_at)b::timestamptz[]
);

-- name: extend_heartbeats
-- Waits that pending events reported progress on: their heartbeat due time moves on, one
-- interval from when the event was received (an event stored before its wait was
-- registered is linked to it, but moves nothing: the wait's first due time is later).
-- (Its open row, where the sweeper finds it, moves with it: trigger waits_move_open.)
UPDATE matcher.waits AS w
SET heartbeat_due = greatest(w.heartbeat_due, u.received_at + w.heartbeat_interval),
    last_progress_at = greatest(w.last_progress_at, u.received_at), version = w.version + 1
FROM (
    SELECT wait_id, max(received_at) AS received_at
    FROM unnest(%(wait_id)b::uuid[], %(received_at)b::timestamptz[]) AS u(wait_id, received_at)
    GROUP BY wait_id
) AS u
WHERE w.id = u.wait_id AND w.state = 'waiting';

-- name: queue_keys
-- Keys whose waits were busy, left to a later pass; the loop is woken at commit.
WITH queued AS (
    INSERT INTO matcher.match_queue (tenant, correlation_id, not_before)
    SELECT t, c, now() + %(after)s::interval
    FROM unnest(%(tenant)b::text[], %(correlation_id)b::text[]) AS u(t, c)
    RETURNING 1
)
SELECT pg_notify('matcher_match', '') FROM (SELECT count(*) AS n FROM queued) AS q WHERE q.n > 0;
