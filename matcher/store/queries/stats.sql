-- name: gauges
-- Everything the dashboard's gauges need, in one statement. Each part stays on an index:
-- the partial ones on waiting waits, pending events and unpublished outbox rows.
SELECT
    (SELECT count(*) FROM matcher.waits WHERE state = 'waiting') AS waits_active,
    (SELECT extract(epoch FROM now() - min(created_at)) FROM matcher.waits
      WHERE state = 'waiting') AS wait_oldest_age,
    (SELECT count(*) FROM matcher.inbox WHERE status = 'pending') AS inbox_pending,
    (SELECT extract(epoch FROM now() - min(received_at)) FROM matcher.inbox
      WHERE status = 'pending') AS inbox_oldest_pending_age,
    (SELECT count(*) FROM matcher.inbox AS i
      WHERE i.status = 'pending'
        AND EXISTS (SELECT 1 FROM matcher.waits AS w
                    WHERE w.state = 'waiting' AND w.correlation_id = i.correlation_id
                      AND (w.tenant <> i.tenant OR NOT i.type = ANY (w.event_types)))
    ) AS mismatches,
    (SELECT count(*) FROM matcher.outbox WHERE published_at IS NULL) AS outbox_pending,
    (SELECT extract(epoch FROM now() - min(created_at)) FROM matcher.outbox
      WHERE published_at IS NULL) AS outbox_oldest_age,
    (SELECT extract(epoch FROM now() - min(deadline)) FROM matcher.waits
      WHERE state = 'waiting' AND deadline <= now()) AS sweeper_behind,
    (SELECT count(*) FROM matcher.quarantine WHERE replayed_at IS NULL) AS quarantined;
