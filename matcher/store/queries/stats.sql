-- name: gauges
-- Everything the dashboard's gauges need, in one statement. Each part stays on an index:
-- the open waits' table, the partial ones on pending events, the resume queue.
SELECT
    (SELECT count(*) FROM matcher.open_waits WHERE top_level) AS waits_active,
    (SELECT extract(epoch FROM now() - min(created_at)) FROM matcher.open_waits
      WHERE top_level) AS wait_oldest_age,
    (SELECT count(*) FROM matcher.inbox WHERE status = 'pending') AS inbox_pending,
    (SELECT extract(epoch FROM now() - min(received_at)) FROM matcher.inbox
      WHERE status = 'pending') AS inbox_oldest_pending_age,
    (SELECT count(*) FROM matcher.inbox AS i
      WHERE i.status = 'pending'
        AND EXISTS (SELECT 1 FROM matcher.waits AS w
                    WHERE w.state = 'waiting' AND w.correlation_id = i.correlation_id
                      AND (w.tenant <> i.tenant OR NOT i.type = ANY (w.event_types))
                    OFFSET 0)  -- per pending event, on waits_match
    ) AS mismatches,
    (SELECT count(*) FROM matcher.resume_queue) AS outbox_pending,
    (SELECT extract(epoch FROM now() - min(created_at)) FROM matcher.resume_queue)
      AS outbox_oldest_age,
    (SELECT extract(epoch FROM now() - min(deadline)) FROM matcher.open_waits
      WHERE deadline <= now()) AS sweeper_behind,
    (SELECT count(*) FROM matcher.quarantine WHERE replayed_at IS NULL) AS quarantined,
    (SELECT count(*) FROM matcher.worker_failures WHERE parked_at IS NOT NULL) AS worker_parked,
    (SELECT count(*) FROM matcher.worker_failures WHERE parked_at IS NULL) AS worker_failing;

-- name: settled_edge
-- The counter of mismatched events counts windows of arrival that closed `settle_s`
-- seconds ago: an ingest transaction stamps its events with its start time, so a window
-- closed that long ago holds every event it will ever hold, and consecutive windows count
-- each event once.
SELECT now() - make_interval(secs => %(settle_s)s) AS edge;

-- name: mismatched_arrivals
-- Events that arrived in [since, until) and are still pending next to a near-miss wait
-- (same correlation id, other tenant or type: the gauge's test). On the partial index of
-- pending events, in the partitions of those days only.
SELECT count(*) AS arrived
FROM matcher.inbox AS i
WHERE i.status = 'pending'
  AND i.received_at >= %(since)s AND i.received_at < %(until)s
  AND EXISTS (SELECT 1 FROM matcher.waits AS w
              WHERE w.state = 'waiting' AND w.correlation_id = i.correlation_id
                AND (w.tenant <> i.tenant OR NOT i.type = ANY (w.event_types))
              OFFSET 0);  -- per pending event, on waits_match
