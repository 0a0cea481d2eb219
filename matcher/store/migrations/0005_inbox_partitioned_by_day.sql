-- The inbox, partitioned by day of arrival (UTC). Retention then drops whole days, which
-- costs the same at any volume and leaves no dead rows behind, where deleting row by row
-- made vacuum work proportional to traffic and slowed ingest while it ran.
--
-- Postgres cannot enforce a unique key across partitions unless it contains the partition
-- key, so the primary key is (producer, event_id, received_at) and the dedupe promise,
-- (producer, event_id) stored at most once, is kept by ingest: it locks each event's key
-- (matcher.event_key) with the batch's wait keys and looks in every partition under that
-- lock. The dedupe window is therefore the partitions still kept: retention + purge window
-- at least, plus up to one day (a day is dropped only once all of it is past the window).

CREATE FUNCTION matcher.event_key(producer text, event_id text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN hashtextextended(producer || chr(31) || event_id, 1);

ALTER TABLE matcher.inbox RENAME TO inbox_before_partitioning;
ALTER TABLE matcher.inbox_before_partitioning DROP CONSTRAINT inbox_pkey;
DROP INDEX matcher.inbox_pending_match;
DROP INDEX matcher.inbox_pending_age;
DROP INDEX matcher.inbox_received;
DROP INDEX matcher.inbox_by_correlation;
DROP INDEX matcher.inbox_by_job;

CREATE TABLE matcher.inbox (
    producer        text        NOT NULL,  -- the CloudEvents source
    event_id        text        NOT NULL,  -- the CloudEvents id
    tenant          text        NOT NULL,
    type            text        NOT NULL,
    correlation_id  text        NOT NULL,
    external_job_id text,
    occurred_at     timestamptz,
    received_at     timestamptz NOT NULL DEFAULT now(),
    kafka_topic     text,
    kafka_partition integer,
    kafka_offset    bigint,
    data            jsonb,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'consumed', 'late', 'expired')),
    consumed_by     uuid,       -- the wait this event resolved
    late_for        uuid,       -- the wait it would have resolved, had it come in time
    status_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (producer, event_id, received_at)
) PARTITION BY RANGE (received_at);
-- Registration looks for pending events of one (tenant, correlation id), oldest first.
CREATE INDEX inbox_pending_match ON matcher.inbox (tenant, correlation_id, received_at)
    WHERE status = 'pending';
-- Expiry and the oldest-pending gauge. (No index on received_at alone any more: the purge
-- is by partition.)
CREATE INDEX inbox_pending_age ON matcher.inbox (received_at) WHERE status = 'pending';
CREATE INDEX inbox_by_correlation ON matcher.inbox (correlation_id);
CREATE INDEX inbox_by_job ON matcher.inbox (external_job_id) WHERE external_job_id IS NOT NULL;

-- The day partitions covering [first, last], created when missing; returns how many were.
-- Created apart and then attached: ATTACH takes a lighter lock on the inbox than CREATE
-- TABLE ... PARTITION OF, so ingest is not held up. Serialised by a lock of its own, so
-- that several daemons' janitors cannot race each other.
CREATE FUNCTION matcher.ensure_inbox_partitions(first timestamptz, last timestamptz)
    RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    day date := (first AT TIME ZONE 'UTC')::date;
    created integer := 0;
    name text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('matcher.inbox partitions', 0));
    WHILE day <= (last AT TIME ZONE 'UTC')::date LOOP
        name := 'inbox_p' || to_char(day, 'YYYYMMDD');
        IF to_regclass('matcher.' || name) IS NULL THEN
            EXECUTE format(
                'CREATE TABLE matcher.%I (LIKE matcher.inbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                name);
            EXECUTE format(
                'ALTER TABLE matcher.inbox ATTACH PARTITION matcher.%I FOR VALUES FROM (%L) TO (%L)',
                name, day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
            created := created + 1;
        END IF;
        day := day + 1;
    END LOOP;
    RETURN created;
END
$$;

SELECT matcher.ensure_inbox_partitions(
    least(now(), (SELECT min(received_at) FROM matcher.inbox_before_partitioning)),
    greatest(now() + interval '3 days',
             (SELECT max(received_at) FROM matcher.inbox_before_partitioning)));
INSERT INTO matcher.inbox SELECT * FROM matcher.inbox_before_partitioning;
DROP TABLE matcher.inbox_before_partitioning;

-- A wait names the event that resolved it by the inbox's whole key, so that reading the
-- event (the relay does, for every resume) visits one day, not all of them.
ALTER TABLE matcher.waits ADD COLUMN resolved_by_received_at timestamptz;
UPDATE matcher.waits AS w
SET resolved_by_received_at = i.received_at
FROM matcher.inbox AS i
WHERE i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id;
