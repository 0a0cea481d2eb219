-- Every stored event by the correlation id it bears, in one place (explain and the
-- console's pages read it; they had three copies of this union). Since migration 0026 the
-- inbox's correlation index holds only the events not consumed on arrival; a consumed one
-- is found through the wait that consumed it (waits_match, then the inbox's key). A
-- query's `correlation_id = ...` is pushed into both branches, so each stays on its index.
CREATE VIEW matcher.correlated_events AS
SELECT i.* FROM matcher.inbox AS i
WHERE i.status <> 'consumed'
UNION ALL
SELECT i.producer, i.event_id, i.tenant, i.type, w.correlation_id, i.external_job_id,
       i.occurred_at, i.received_at, i.kafka_topic, i.kafka_partition, i.kafka_offset, i.data,
       i.status, i.consumed_by, i.late_for, i.status_at, i.trace_parent, i.progress_for
FROM matcher.waits AS w
JOIN matcher.inbox AS i
  ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
  AND i.received_at = w.resolved_by_received_at
WHERE w.resolution = 'event' AND i.status = 'consumed' AND i.consumed_by = w.id;
