-- name: claim_unpublished
-- The oldest unpublished resolutions, each with its resume message built here (the JSON of
-- matcher.domain.resume.ResumeCloudEvent; a test holds the two equal). The row locks keep
-- a second relay off them until this one has published and marked them.
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
       json_build_object(
           'specversion', '1.0',
           'id', c.resolution_id,
           'source', 'matcher',
           'type', 'matcher.resume',
           'subject', w.run_id,
           'time', matcher.rfc3339(w.resolved_at),
           'datacontenttype', 'application/json',
           'tenant', w.tenant,
           'data', json_build_object(
               'resolution_id', c.resolution_id,
               'tenant', w.tenant,
               'run_id', w.run_id,
               'position', w.position,
               'outcome', c.outcome,
               'wait_id', w.id,
               'correlation_id', w.correlation_id,
               'event_types', w.event_types,
               'event', CASE WHEN c.outcome = 'event' THEN json_build_object(
                   'source', w.resolved_by_producer,
                   'id', w.resolved_by_event_id,
                   'type', coalesce(i.type, ''),
                   'data', i.data,
                   'external_job_id', i.external_job_id,
                   'occurred_at', matcher.rfc3339(i.occurred_at),
                   'topic', i.kafka_topic,
                   'partition', i.kafka_partition,
                   'offset', i.kafka_offset,
                   'received_at', matcher.rfc3339(coalesce(i.received_at, w.resolved_at))
               ) END,
               'created_at', matcher.rfc3339(w.created_at),
               'resolved_at', matcher.rfc3339(w.resolved_at),
               'deadline', matcher.rfc3339(w.deadline)
           )
       )::text AS message
FROM claimed AS c
JOIN matcher.waits AS w ON w.id = c.wait_id
LEFT JOIN matcher.inbox AS i
  ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
  AND i.received_at = w.resolved_by_received_at  -- one day of the inbox, not all
ORDER BY c.id;

-- name: mark_published
UPDATE matcher.outbox SET published_at = now() WHERE id = ANY(%(ids)s::bigint[]);
