-- name: claim_unpublished
-- The oldest unpublished resolutions with everything their resume message needs. The row
-- locks keep a second relay off them until this one has published and marked them.
SELECT o.id, o.resolution_id, o.outcome,
       w.id AS wait_id, w.tenant, w.run_id, w.position, w.correlation_id, w.event_types,
       w.deadline, w.created_at, w.resolved_at,
       w.resolved_by_producer, w.resolved_by_event_id,
       i.type AS event_type, i.data AS event_data, i.external_job_id, i.occurred_at,
       i.kafka_topic, i.kafka_partition, i.kafka_offset, i.received_at
FROM matcher.outbox AS o
JOIN matcher.waits AS w ON w.id = o.wait_id
LEFT JOIN matcher.inbox AS i
  ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
  AND i.received_at = w.resolved_by_received_at  -- one day of the inbox, not all
WHERE o.published_at IS NULL
ORDER BY o.id
LIMIT %(limit)s
FOR UPDATE OF o SKIP LOCKED;

-- name: mark_published
UPDATE matcher.outbox SET published_at = now() WHERE id = ANY(%(ids)s::bigint[]);
