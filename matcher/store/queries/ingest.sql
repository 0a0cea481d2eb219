-- name: ingest_events
-- A batch's events (binary array placeholders: psycopg's C dumpers encode them far faster
-- than the text form), in arrival order; migration 0016 says what the function does.
SELECT accepted, duplicates, matched, late, deferred
FROM matcher.ingest_events(
    %(producer)b::text[], %(event_id)b::text[], %(tenant)b::text[], %(type)b::text[],
    %(correlation_id)b::text[], %(external_job_id)b::text[], %(occurred_at)b::timestamptz[],
    %(topic)b::text[], %(partition)b::integer[], %(offset)b::bigint[], %(data)b::jsonb[]
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
