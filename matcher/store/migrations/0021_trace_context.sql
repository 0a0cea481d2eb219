-- The W3C trace context an event arrived with (its Kafka record's `traceparent` or
-- `ce_traceparent` header), kept beside the event like its offset, and put on its resume,
-- so that one trace runs from the producer to the worker that continues the run. It is
-- transport metadata, not an attribute of the event: nothing decides by it, no signature
-- covers it, and a malformed or ambiguous one is simply not kept.
ALTER TABLE matcher.inbox ADD COLUMN trace_parent text;

-- matcher.ingest_events of migration 0016, with the events' trace contexts stored (the
-- rest of its body unchanged: see 0016 for what it does and why it is shaped so).
DROP FUNCTION matcher.ingest_events(
    text[], text[], text[], text[], text[], text[], timestamptz[], text[], integer[], bigint[],
    jsonb[]
);
CREATE FUNCTION matcher.ingest_events(
    producers text[],
    event_ids text[],
    tenants text[],
    types text[],
    correlation_ids text[],
    external_job_ids text[],
    occurred_at timestamptz[],
    topics text[],
    partitions integer[],
    offsets bigint[],
    data jsonb[],
    trace_parents text[],
    OUT accepted bigint,   -- stored: new ids, each at its first place in the batch
    OUT duplicates bigint, -- ids stored before, or earlier in the batch
    OUT matched bigint,    -- waits resolved
    OUT late bigint,       -- stored late, linked to the wait they came too late for
    OUT deferred bigint    -- stored pending on a key left to the rematch loop
)
    LANGUAGE plpgsql VOLATILE
    -- Generic plans, made once per session: for small batches the planner otherwise keeps
    -- choosing custom plans (0.4 ms of planning a call for one event), and the statements'
    -- shapes are chosen to plan well without knowing the batch (see above).
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    claimed_producers text[];
    claimed_event_ids text[];
    -- The decision, by position in the batch.
    fresh boolean[];     -- a new event, to store
    resolves uuid[];     -- the wait it resolves
    too_late_for uuid[]; -- or the wait it came too late for
    decided bigint;
    queue_tenants text[];
    queue_correlations text[];
    resolving uuid[];
    resolving_producers text[];
    resolving_event_ids text[];
    resolved bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'matcher.ingest_events needs READ COMMITTED, not %',
            current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state';
    END IF;

    -- Invariant 2: every key of the batch, in one fixed order (batches and the rematch
    -- loop cannot deadlock each other).
    PERFORM pg_advisory_xact_lock(k)
    FROM (
        SELECT DISTINCT matcher.wait_key(t, c) AS k
        FROM unnest(ingest_events.tenants, ingest_events.correlation_ids) AS u(t, c)
        ORDER BY 1
    ) AS keys;

    -- Invariant 1: the ids not stored before come back, claimed by this transaction; an id
    -- another batch claimed and has not committed makes this wait for its end. Sorted,
    -- after the sorted key locks, so two batches sharing ids wait in one direction only.
    WITH claimed AS (
        INSERT INTO matcher.event_ids (producer, event_id)
        SELECT p, e
        FROM unnest(ingest_events.producers, ingest_events.event_ids) AS u(p, e)
        ORDER BY p, e
        ON CONFLICT DO NOTHING
        RETURNING producer, event_id
    )
    SELECT coalesce(array_agg(producer), '{}'), coalesce(array_agg(event_id), '{}')
    INTO claimed_producers, claimed_event_ids
    FROM claimed;

    -- The decision (see above): one row per event of the batch.
    WITH batch AS (
        SELECT b.n, b.producer, b.event_id, b.tenant, b.correlation_id, b.type,
               (b.producer, b.event_id) IN (
                   SELECT c.p, c.e FROM unnest(claimed_producers, claimed_event_ids) AS c(p, e)
               ) AS claimed
        FROM unnest(
            ingest_events.producers, ingest_events.event_ids, ingest_events.tenants,
            ingest_events.correlation_ids, ingest_events.types
        ) WITH ORDINALITY AS b(producer, event_id, tenant, correlation_id, type, n)
    ), firsts AS (
        -- New: claimed now, and the id's first place in the batch (the rest duplicates).
        SELECT b.*,
               b.claimed AND row_number() OVER (PARTITION BY b.producer, b.event_id
                                                ORDER BY b.n) = 1 AS fresh
        FROM batch AS b
    ), looked AS (
        -- Each new event with what its key's waits hold for it. The waits (but the
        -- matched ones) are locked here unless another transaction holds one (busy: the
        -- key is left to the rematch loop, not waited for); the state kept is the locked
        -- row's, which is current.
        SELECT f.n, f.fresh, f.tenant, f.correlation_id, s.busy, s.takes, s.late_for,
               f.fresh AND EXISTS (
                   SELECT 1 FROM matcher.match_queue AS q
                   WHERE q.tenant = f.tenant AND q.correlation_id = f.correlation_id
               ) AS queued
        FROM firsts AS f
        LEFT JOIN LATERAL (
            SELECT bool_or(l.id IS NULL) AS busy,
                   -- The oldest waiting wait that accepts it (created_at, then id).
                   (array_agg(w.id ORDER BY w.created_at, w.id)
                       FILTER (WHERE coalesce(l.state, w.state) = 'waiting'
                                 AND f.type = ANY (w.event_types)))[1] AS takes,
                   -- Else the most recently resolved timed-out or cancelled one.
                   (array_agg(w.id ORDER BY coalesce(l.resolved_at, w.resolved_at,
                                                     w.created_at) DESC, w.id DESC)
                       FILTER (WHERE coalesce(l.state, w.state) IN ('timed_out', 'cancelled')
                                 AND f.type = ANY (w.event_types)))[1] AS late_for
            FROM matcher.waits AS w
            LEFT JOIN LATERAL (
                SELECT x.id, x.state, x.resolved_at FROM matcher.waits AS x
                WHERE x.id = w.id
                FOR UPDATE SKIP LOCKED
            ) AS l ON true
            WHERE f.fresh AND w.tenant = f.tenant AND w.correlation_id = f.correlation_id
              AND w.state <> 'matched'
        ) AS s ON true
    ), placed AS (
        SELECT k.*, k.fresh AND NOT (k.queued OR k.to_rematch) AS decided_here
        FROM (
            -- A key is decided here unless a wait of it is busy, or two new events find
            -- waiting waits in it (their order would decide which takes which).
            SELECT l.*,
                   (l.tenant, l.correlation_id) IN (
                       SELECT o.tenant, o.correlation_id FROM looked AS o
                       GROUP BY o.tenant, o.correlation_id
                       HAVING bool_or(o.busy) OR count(o.takes) > 1
                   ) AS to_rematch
            FROM looked AS l
        ) AS k
    )
    SELECT array_agg(p.fresh ORDER BY p.n),
           array_agg(CASE WHEN p.decided_here THEN p.takes END ORDER BY p.n),
           array_agg(CASE WHEN p.decided_here AND p.takes IS NULL THEN p.late_for END
                     ORDER BY p.n),
           count(*) FILTER (WHERE p.fresh),
           count(*) FILTER (WHERE p.fresh AND NOT p.decided_here),
           array_agg(p.tenant) FILTER (WHERE p.fresh AND p.to_rematch AND NOT p.queued),
           array_agg(p.correlation_id) FILTER (WHERE p.fresh AND p.to_rematch AND NOT p.queued)
    INTO fresh, resolves, too_late_for, decided, deferred, queue_tenants, queue_correlations
    FROM placed AS p;

    -- The new events, each written once, with its final status.
    WITH stored AS (
        INSERT INTO matcher.inbox (
            producer, event_id, tenant, type, correlation_id, external_job_id, occurred_at,
            kafka_topic, kafka_partition, kafka_offset, data, status, consumed_by, late_for,
            trace_parent
        )
        SELECT b.producer, b.event_id, b.tenant, b.type, b.correlation_id, b.external_job_id,
               b.occurred_at, b.topic, b.kafka_partition, b.kafka_offset, b.data,
               CASE WHEN resolves[b.n] IS NOT NULL THEN 'consumed'
                    WHEN too_late_for[b.n] IS NOT NULL THEN 'late'
                    ELSE 'pending' END,
               resolves[b.n], too_late_for[b.n], b.trace_parent
        FROM unnest(
            ingest_events.producers, ingest_events.event_ids, ingest_events.tenants,
            ingest_events.types, ingest_events.correlation_ids, ingest_events.external_job_ids,
            ingest_events.occurred_at, ingest_events.topics, ingest_events.partitions,
            ingest_events.offsets, ingest_events.data, ingest_events.trace_parents
        ) WITH ORDINALITY AS b(producer, event_id, tenant, type, correlation_id,
                               external_job_id, occurred_at, topic, kafka_partition,
                               kafka_offset, data, trace_parent, n)
        WHERE fresh[b.n]
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO accepted FROM stored;
    -- The ids were claimed first, so no other transaction can have stored one of these
    -- events meanwhile; should it happen, the batch is retried (and then sees duplicates).
    IF accepted <> decided THEN
        RAISE EXCEPTION 'stored % of % new events: another transaction stored one',
            accepted, decided
            USING ERRCODE = 'serialization_failure';
    END IF;
    duplicates := cardinality(ingest_events.producers) - accepted;

    IF queue_tenants IS NOT NULL THEN
        INSERT INTO matcher.match_queue (tenant, correlation_id)
        SELECT DISTINCT t, c FROM unnest(queue_tenants, queue_correlations) AS u(t, c);
        PERFORM pg_notify('matcher_match', '');  -- the rematch loop, woken at commit
    END IF;

    -- Invariant 3: the waits resolved, with their outbox rows (the relay is woken at
    -- commit). They are locked by this transaction and were seen waiting: all resolve.
    SELECT array_agg(w) FILTER (WHERE w IS NOT NULL), array_agg(p) FILTER (WHERE w IS NOT NULL),
           array_agg(e) FILTER (WHERE w IS NOT NULL), count(l)
    INTO resolving, resolving_producers, resolving_event_ids, late
    FROM unnest(resolves, too_late_for, ingest_events.producers, ingest_events.event_ids)
        AS u(w, l, p, e);
    matched := coalesce(cardinality(resolving), 0);
    IF matched > 0 THEN
        resolved := matcher.resolve_waits(
            resolving, 'matched', 'event', 'event', resolving_producers, resolving_event_ids,
            NULL);
        IF resolved <> matched THEN
            RAISE EXCEPTION 'resolved % of % waits under lock: a bug', resolved, matched;
        END IF;
    END IF;
END
$$;

-- The resume carries its event's trace context as the CloudEvents distributed-tracing
-- extension (`traceparent`, in the envelope), only when the event had one: resumes of
-- events without one are byte for byte what they were.
CREATE FUNCTION matcher.resume_data(
    resolution_id uuid, outcome text, w matcher.waits, i matcher.inbox
) RETURNS json
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN json_build_object(
        'resolution_id', resolution_id,
        'tenant', w.tenant,
        'run_id', w.run_id,
        'position', w.position,
        'outcome', outcome,
        'wait_id', w.id,
        'correlation_id', w.correlation_id,
        'event_types', w.event_types,
        'event', CASE WHEN outcome = 'event' THEN json_build_object(
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
    );

CREATE OR REPLACE FUNCTION matcher.resume_message(
    resolution_id uuid, outcome text, w matcher.waits, i matcher.inbox
) RETURNS json
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN CASE WHEN i.trace_parent IS NULL THEN json_build_object(
        'specversion', '1.0', 'id', resolution_id, 'source', 'matcher',
        'type', 'matcher.resume', 'subject', w.run_id, 'time', matcher.rfc3339(w.resolved_at),
        'datacontenttype', 'application/json', 'tenant', w.tenant,
        'data', matcher.resume_data(resolution_id, outcome, w, i)
    ) ELSE json_build_object(
        'specversion', '1.0', 'id', resolution_id, 'source', 'matcher',
        'type', 'matcher.resume', 'subject', w.run_id, 'time', matcher.rfc3339(w.resolved_at),
        'datacontenttype', 'application/json', 'tenant', w.tenant,
        'traceparent', i.trace_parent,
        'data', matcher.resume_data(resolution_id, outcome, w, i)
    ) END;
