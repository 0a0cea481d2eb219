-- Waits that say more (docs/concepts/waits.md):
-- - a condition on the event's data, in SQL/JSON path, evaluated by Postgres: an event of
--   the wait's key and types whose data does not satisfy it is not consumed by the wait;
-- - a heartbeat: progress event types and an interval. A progress event of the wait's key
--   is stored, linked to the wait (inbox status 'progress') and moves its heartbeat due
--   time; a wait whose heartbeat comes due times out with resolution 'heartbeat' (its
--   deadline still caps it). Progress events never resolve a wait.
-- The functions of the worker API keep their signatures: register_wait_v2 takes the new
-- fields, register_wait_v1 stays as it was.

ALTER TABLE matcher.waits
    ADD COLUMN condition jsonpath,
    ADD COLUMN progress_types text[],
    ADD COLUMN heartbeat_interval interval,
    ADD COLUMN heartbeat_due timestamptz,
    ADD COLUMN last_progress_at timestamptz,
    ADD CONSTRAINT waits_heartbeat_check CHECK (
        (heartbeat_interval IS NULL) = (progress_types IS NULL)
        AND (heartbeat_interval IS NULL) = (heartbeat_due IS NULL)
    ),
    DROP CONSTRAINT waits_resolution_check,
    ADD CONSTRAINT waits_resolution_check
        CHECK (resolution IN ('event', 'deadline', 'heartbeat', 'cancel'));

-- The sweeper finds waits whose heartbeat came due as it finds those past their deadline.
CREATE INDEX waits_heartbeat_due ON matcher.waits (heartbeat_due)
    WHERE state = 'waiting' AND heartbeat_due IS NOT NULL;

ALTER TABLE matcher.inbox
    ADD COLUMN progress_for uuid,
    DROP CONSTRAINT inbox_status_check1,
    ADD CONSTRAINT inbox_status_check
        CHECK (status IN ('pending', 'consumed', 'late', 'expired', 'progress'));

-- Whether an event's data satisfies a wait's condition. Whatever the data, the answer is
-- true or false, never an error: an error here would fail the whole batch of events. A
-- result that is not one boolean (a path that selects nothing, or a number) is false.
CREATE FUNCTION matcher.condition_holds(data jsonb, condition jsonpath) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN coalesce(jsonb_path_match(coalesce(data, 'null'::jsonb), condition, '{}', true),
                    false);
EXCEPTION WHEN OTHERS THEN
    RETURN false;
END $$;

-- A condition as registration accepts it: SQL/JSON path text of at most 1,000 characters
-- that parses, without variables, regular expressions or the any-depth accessor (the
-- three things whose cost or meaning the data could change: the cost of evaluating what
-- is left is linear in its length times the size of the event's data, which the gate
-- bounds).
CREATE FUNCTION matcher.checked_condition(condition text) RETURNS jsonpath
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    parsed jsonpath;
    normal text;
BEGIN
    IF condition IS NULL THEN
        RETURN NULL;
    END IF;
    IF char_length(condition) > 1000 THEN
        RAISE EXCEPTION 'matcher: condition must be at most 1000 characters'
            USING ERRCODE = '22023';
    END IF;
    BEGIN
        parsed := condition::jsonpath;
    EXCEPTION WHEN OTHERS THEN
        RAISE EXCEPTION 'matcher: condition is not an SQL/JSON path: %', SQLERRM
            USING ERRCODE = '22023';
    END;
    -- The path as Postgres prints it back: string literals in double quotes, with their
    -- quotes escaped, so that what is outside them can be read for the features refused.
    normal := regexp_replace(parsed::text, '"(\\.|[^"\\])*"', '""', 'g');
    IF normal ~ 'like_regex' THEN
        RAISE EXCEPTION 'matcher: condition must not use like_regex' USING ERRCODE = '22023';
    END IF;
    IF normal ~ '\*\*' THEN
        RAISE EXCEPTION 'matcher: condition must not use the any-depth accessor (.**)'
            USING ERRCODE = '22023';
    END IF;
    IF normal ~ '\$""|\$[A-Za-z_]' THEN
        RAISE EXCEPTION 'matcher: condition must not use variables ($name)'
            USING ERRCODE = '22023';
    END IF;
    RETURN parsed;
END $$;

-- register_wait_v1 with a condition and a heartbeat. The heartbeat's interval is at least
-- one second and at most a year; its progress types are identifiers, none of them one of
-- the wait's event types (an event either completes a wait or reports progress on it).
CREATE FUNCTION matcher.register_wait_v2(
    tenant text,
    run_id text,
    "position" bigint,
    event_types text[],
    correlation_id text,
    deadline timestamptz DEFAULT NULL,
    external_job_id text DEFAULT NULL,
    wait_id uuid DEFAULT NULL,
    condition text DEFAULT NULL,
    heartbeat_interval interval DEFAULT NULL,
    progress_types text[] DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    stored matcher.waits;
    types text[] := matcher.checked_types(register_wait_v2.event_types);
    progress text[];
BEGIN
    IF (register_wait_v2.heartbeat_interval IS NULL)
        <> (register_wait_v2.progress_types IS NULL) THEN
        RAISE EXCEPTION 'matcher: a heartbeat needs both heartbeat_interval and progress_types'
            USING ERRCODE = '22023';
    END IF;
    IF register_wait_v2.heartbeat_interval IS NOT NULL THEN
        IF register_wait_v2.heartbeat_interval < interval '1 second'
            OR register_wait_v2.heartbeat_interval > interval '366 days' THEN
            RAISE EXCEPTION 'matcher: heartbeat_interval must be between 1 second and 366 days'
                USING ERRCODE = '22023';
        END IF;
        progress := matcher.checked_types(register_wait_v2.progress_types);
        IF progress && types THEN
            RAISE EXCEPTION 'matcher: a type cannot be both an event type and a progress type'
                USING ERRCODE = '22023';
        END IF;
    END IF;
    INSERT INTO matcher.waits AS w (
        id, tenant, run_id, "position", event_types, correlation_id, external_job_id, deadline,
        condition, progress_types, heartbeat_interval, heartbeat_due
    )
    VALUES (
        coalesce(register_wait_v2.wait_id, gen_random_uuid()),
        matcher.checked_ident('tenant', register_wait_v2.tenant),
        matcher.checked_ident('run_id', register_wait_v2.run_id),
        matcher.checked_position(register_wait_v2."position"),
        types,
        matcher.checked_ident('correlation_id', register_wait_v2.correlation_id),
        CASE WHEN register_wait_v2.external_job_id IS NULL THEN NULL
             ELSE matcher.checked_ident('external_job_id', register_wait_v2.external_job_id) END,
        register_wait_v2.deadline,
        matcher.checked_condition(register_wait_v2.condition),
        progress,
        register_wait_v2.heartbeat_interval,
        now() + register_wait_v2.heartbeat_interval
    )
    RETURNING * INTO stored;
    RETURN matcher.wait_json(stored);
END $$;

-- The wait's JSON with the new fields (null for a wait that has none of them).
CREATE OR REPLACE FUNCTION matcher.wait_json(w matcher.waits) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
RETURN jsonb_build_object(
    'id', w.id, 'tenant', w.tenant, 'run_id', w.run_id, 'position', w."position",
    'event_types', to_jsonb(w.event_types), 'correlation_id', w.correlation_id,
    'external_job_id', w.external_job_id, 'deadline', matcher.rfc3339(w.deadline),
    'state', w.state, 'created_at', matcher.rfc3339(w.created_at),
    'resolved_at', matcher.rfc3339(w.resolved_at), 'resolution', w.resolution,
    'resolved_by_producer', w.resolved_by_producer,
    'resolved_by_event_id', w.resolved_by_event_id,
    'condition', w.condition::text,
    'progress_types', to_jsonb(w.progress_types),
    'heartbeat_interval_s', extract(epoch FROM w.heartbeat_interval),
    'heartbeat_due', matcher.rfc3339(w.heartbeat_due),
    'last_progress_at', matcher.rfc3339(w.last_progress_at)
);

-- The resume's data: unchanged for every wait but one timed out by its heartbeat, whose
-- resume says so ("timeout_reason": "heartbeat"; a compatible extension: readers that do
-- not know the field see a timeout).
CREATE OR REPLACE FUNCTION matcher.resume_data(
    resolution_id uuid, outcome text, w matcher.waits, i matcher.inbox
) RETURNS json
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN w.resolution IS DISTINCT FROM 'heartbeat' THEN json_build_object(
    'resolution_id', resolution_id, 'tenant', w.tenant, 'run_id', w.run_id,
    'position', w."position", 'outcome', outcome, 'wait_id', w.id,
    'correlation_id', w.correlation_id, 'event_types', w.event_types,
    'event', CASE WHEN outcome = 'event' THEN json_build_object(
        'source', w.resolved_by_producer, 'id', w.resolved_by_event_id,
        'type', coalesce(i.type, ''), 'data', i.data, 'external_job_id', i.external_job_id,
        'occurred_at', matcher.rfc3339(i.occurred_at), 'topic', i.kafka_topic,
        'partition', i.kafka_partition, 'offset', i.kafka_offset,
        'received_at', matcher.rfc3339(coalesce(i.received_at, w.resolved_at))
    ) END,
    'created_at', matcher.rfc3339(w.created_at), 'resolved_at', matcher.rfc3339(w.resolved_at),
    'deadline', matcher.rfc3339(w.deadline)
) ELSE json_build_object(
    'resolution_id', resolution_id, 'tenant', w.tenant, 'run_id', w.run_id,
    'position', w."position", 'outcome', outcome, 'wait_id', w.id,
    'correlation_id', w.correlation_id, 'event_types', w.event_types,
    'event', NULL,
    'created_at', matcher.rfc3339(w.created_at), 'resolved_at', matcher.rfc3339(w.resolved_at),
    'deadline', matcher.rfc3339(w.deadline),
    'timeout_reason', 'heartbeat', 'last_progress_at', matcher.rfc3339(w.last_progress_at)
) END;

-- matcher.ingest_events of migration 0021, with conditions and progress events (see 0016 for
-- what the rest of it does and why it is shaped so).
CREATE OR REPLACE FUNCTION matcher.ingest_events(
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
    progress_for uuid[]; -- or the wait it reports progress on
    progressing uuid[];
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
        SELECT b.n, b.producer, b.event_id, b.tenant, b.correlation_id, b.type, b.data,
               (b.producer, b.event_id) IN (
                   SELECT c.p, c.e FROM unnest(claimed_producers, claimed_event_ids) AS c(p, e)
               ) AS claimed
        FROM unnest(
            ingest_events.producers, ingest_events.event_ids, ingest_events.tenants,
            ingest_events.correlation_ids, ingest_events.types, ingest_events.data
        ) WITH ORDINALITY AS b(producer, event_id, tenant, correlation_id, type, data, n)
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
               s.progress_of,
               f.fresh AND EXISTS (
                   SELECT 1 FROM matcher.match_queue AS q
                   WHERE q.tenant = f.tenant AND q.correlation_id = f.correlation_id
               ) AS queued
        FROM firsts AS f
        LEFT JOIN LATERAL (
            SELECT bool_or(l.id IS NULL) AS busy,
                   -- The oldest waiting wait that accepts it (created_at, then id): its
                   -- type, and its condition if it has one.
                   (array_agg(w.id ORDER BY w.created_at, w.id)
                       FILTER (WHERE coalesce(l.state, w.state) = 'waiting'
                                 AND f.type = ANY (w.event_types)
                                 AND (w.condition IS NULL
                                      OR matcher.condition_holds(f.data, w.condition))
                       ))[1] AS takes,
                   -- Else the oldest waiting wait it reports progress on.
                   (array_agg(w.id ORDER BY w.created_at, w.id)
                       FILTER (WHERE coalesce(l.state, w.state) = 'waiting'
                                 AND f.type = ANY (w.progress_types)))[1] AS progress_of,
                   -- Else the most recently resolved timed-out or cancelled one it would
                   -- have resolved, or reported progress on.
                   (array_agg(w.id ORDER BY coalesce(l.resolved_at, w.resolved_at,
                                                     w.created_at) DESC, w.id DESC)
                       FILTER (WHERE coalesce(l.state, w.state) IN ('timed_out', 'cancelled')
                                 AND (f.type = ANY (w.progress_types)
                                      OR f.type = ANY (w.event_types)
                                         AND (w.condition IS NULL
                                              OR matcher.condition_holds(f.data, w.condition)))
                       ))[1] AS late_for
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
           array_agg(CASE WHEN p.decided_here AND p.takes IS NULL THEN p.progress_of END
                     ORDER BY p.n),
           array_agg(CASE WHEN p.decided_here AND p.takes IS NULL AND p.progress_of IS NULL
                          THEN p.late_for END
                     ORDER BY p.n),
           count(*) FILTER (WHERE p.fresh),
           count(*) FILTER (WHERE p.fresh AND NOT p.decided_here),
           array_agg(p.tenant) FILTER (WHERE p.fresh AND p.to_rematch AND NOT p.queued),
           array_agg(p.correlation_id) FILTER (WHERE p.fresh AND p.to_rematch AND NOT p.queued)
    INTO fresh, resolves, progress_for, too_late_for, decided, deferred, queue_tenants, queue_correlations
    FROM placed AS p;

    -- The new events, each written once, with its final status.
    WITH stored AS (
        INSERT INTO matcher.inbox (
            producer, event_id, tenant, type, correlation_id, external_job_id, occurred_at,
            kafka_topic, kafka_partition, kafka_offset, data, status, consumed_by, late_for,
            trace_parent, progress_for
        )
        SELECT b.producer, b.event_id, b.tenant, b.type, b.correlation_id, b.external_job_id,
               b.occurred_at, b.topic, b.kafka_partition, b.kafka_offset, b.data,
               CASE WHEN resolves[b.n] IS NOT NULL THEN 'consumed'
                    WHEN progress_for[b.n] IS NOT NULL THEN 'progress'
                    WHEN too_late_for[b.n] IS NOT NULL THEN 'late'
                    ELSE 'pending' END,
               resolves[b.n], too_late_for[b.n], b.trace_parent, progress_for[b.n]
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

    -- Progress: each wait it was reported on (locked by this transaction, seen waiting) has
    -- its heartbeat due time moved on, one interval from now.
    progressing := ARRAY(
        SELECT DISTINCT u.w FROM unnest(progress_for) AS u(w) WHERE u.w IS NOT NULL
    );
    IF cardinality(progressing) > 0 THEN
        UPDATE matcher.waits AS w
        SET heartbeat_due = greatest(w.heartbeat_due, now() + w.heartbeat_interval),
            last_progress_at = now(), version = w.version + 1
        WHERE w.id = ANY (progressing)
          AND w.state = 'waiting';
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
