-- name: expire_pending
-- Pending events past the retention stop being candidates for new waits.
WITH due AS (
    SELECT producer, event_id FROM matcher.inbox
    WHERE status = 'pending' AND received_at < now() - %(retention)s::interval
    ORDER BY received_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE matcher.inbox AS i
SET status = 'expired', status_at = now()
FROM due
WHERE i.producer = due.producer AND i.event_id = due.event_id AND i.status = 'pending';

-- name: purge_inbox
-- Past retention + purge window since it was received, and past the purge window since
-- its last change (an expired event stays that long as expired), nothing is kept. This is
-- the window inside which a redelivered event is still recognised as a duplicate.
WITH doomed AS (
    SELECT producer, event_id FROM matcher.inbox
    WHERE received_at < now() - %(keep)s::interval
      AND status_at < now() - %(purge_after)s::interval
      AND status <> 'pending'
    ORDER BY received_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM matcher.inbox AS i
USING doomed
WHERE i.producer = doomed.producer AND i.event_id = doomed.event_id;
