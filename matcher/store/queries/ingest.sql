-- name: ingest_events
-- A batch's events (binary array placeholders: psycopg's C dumpers encode them far faster
-- than the text form), in arrival order; migration 0016 says what the function does.
SELECT accepted, duplicates, matched, late, deferred
FROM matcher.ingest_events(
    %(producer)b::text[], %(event_id)b::text[], %(tenant)b::text[], %(type)b::text[],
    %(correlation_id)b::text[], %(external_job_id)b::text[], %(occurred_at)b::timestamptz[],
    %(topic)b::text[], %(partition)b::integer[], %(offset)b::bigint[], %(data)b::jsonb[],
    %(trace_parent)b::text[]
);

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

-- name: conflicting_duplicates
-- The positions (from 1) of the events whose (source, id) is stored with another meaning:
-- another tenant, type, correlation, job or data. Asked only of a batch that had
-- duplicates, after it committed: a producer that reuses an id for another event loses
-- that event (CloudEvents identity is source + id), and this is how an operator hears of
-- it. The time is not compared: a producer that stamps a retry with the time it sends it
-- sends the same event. Each stored event is found by its id's row and the inbox's key,
-- so one day's index is probed per event; an id whose inbox row has been dropped
-- (retention) is not compared.
SELECT b.n
FROM unnest(
    %(producer)b::text[], %(event_id)b::text[], %(tenant)b::text[], %(type)b::text[],
    %(correlation_id)b::text[], %(external_job_id)b::text[], %(data)b::jsonb[]
) WITH ORDINALITY AS b(producer, event_id, tenant, type, correlation_id, external_job_id,
                       data, n)
-- A subquery per event (its LIMIT keeps the planner from making it a join of the whole
-- batch with event_ids, which it would hash by a sequential scan): two index probes.
JOIN LATERAL (
    SELECT i.tenant, i.type, i.correlation_id, i.external_job_id, i.data
    FROM matcher.event_ids AS e
    JOIN matcher.inbox AS i
        ON i.producer = e.producer AND i.event_id = e.event_id
        AND i.received_at = e.received_at
    WHERE e.producer = b.producer AND e.event_id = b.event_id
    LIMIT 1
) AS stored ON true
WHERE (stored.tenant, stored.type, stored.correlation_id, stored.external_job_id, stored.data)
    IS DISTINCT FROM (b.tenant, b.type, b.correlation_id, b.external_job_id, b.data)
ORDER BY b.n;
