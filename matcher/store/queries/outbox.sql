-- name: claim_unpublished
-- The oldest unpublished resolutions, each with its resume message (built by
-- matcher.resume_message, which advance() checks resumes against). The row locks keep a
-- second relay off them until this one has published and marked them.
WITH claimed AS (
    SELECT o.id, o.resolution_id, o.outcome, o.wait_id
    FROM matcher.outbox AS o
    WHERE o.published_at IS NULL
    ORDER BY o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
)
SELECT c.id, w.run_id, c.outcome,
       extract(epoch FROM w.resolved_at - w.created_at)::float8 AS waited_s,
       extract(epoch FROM i.received_at)::float8 AS received_epoch,
       matcher.resume_message(c.resolution_id, c.outcome, w, i)::text AS message
FROM claimed AS c
JOIN matcher.waits AS w ON w.id = c.wait_id
LEFT JOIN matcher.inbox AS i
  ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
  AND i.received_at = w.resolved_by_received_at  -- one day of the inbox, not all
ORDER BY c.id;

-- name: mark_published
-- With the digest of each message as published (verify_resume uses it when the message
-- can no longer be rebuilt).
UPDATE matcher.outbox AS o SET published_at = now(), message_sha256 = u.digest
FROM unnest(%(ids)s::bigint[], %(digests)s::bytea[]) AS u(id, digest)
WHERE o.id = u.id;

