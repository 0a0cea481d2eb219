-- Fan-in (docs/concepts/waits.md): one wait for several conditions, each event types and
-- a correlation id (and optionally a condition on the data), resolved when all of them,
-- any one, or at least N are met.
--
-- The wait is a row of matcher.waits as any other (its run, position, deadline, state,
-- outbox row and resume), with `needed` set; it is never matched by an event itself
-- (its own event_types and correlation_id, the union of its conditions' types and its
-- first condition's correlation id, are for reading). Each condition is a row too, with
-- `group_id` naming its wait: conditions are matched by the one path every wait is
-- matched by (ingest's statement, the rematch pass), with its rules (oldest first, each
-- event once, early events, late events, busy rows left to the rematch loop). What a
-- condition adds:
-- - matching one locks its wait's row too (SKIP LOCKED: a wait held elsewhere leaves the
--   key to the rematch loop, as a busy wait does), so that one transaction at a time
--   decides for a fan-in wait, whichever keys its conditions are on;
-- - two events of one batch that would meet conditions of one wait leave their keys to
--   the rematch pass, which counts what the wait still needs (an "any" wait is met once);
-- - a condition met has no resume of its own: matcher.resolve_waits counts its wait's
--   conditions met and resolves the wait when the rule is met (its resolved_by_* name
--   the event that completed it; its resume lists every event that counted);
-- - a fan-in wait resolved (rule met, deadline, cancel) closes the conditions still
--   open: timed out or cancelled with it (later events are then late, linked to the
--   condition), or, when the rule was met without them, 'matched' with resolution
--   'group' and no event (later events stay pending for other waits).

ALTER TABLE matcher.waits
    ADD COLUMN group_id uuid,
    ADD COLUMN condition_index integer,
    ADD COLUMN needed integer,
    ADD CONSTRAINT waits_condition_of_check
        CHECK ((group_id IS NULL) = (condition_index IS NULL)),
    ADD CONSTRAINT waits_needed_check
        CHECK (needed IS NULL OR (needed >= 1 AND group_id IS NULL)),
    DROP CONSTRAINT waits_resolution_check,
    ADD CONSTRAINT waits_resolution_check
        CHECK (resolution IN ('event', 'deadline', 'heartbeat', 'cancel', 'group'));

CREATE INDEX waits_by_group ON matcher.waits (group_id, condition_index)
    WHERE group_id IS NOT NULL;

-- matcher.resolve_waits of migration 0017, for fan-in: a condition met writes no outbox
-- row; its wait is resolved when its rule is met; a fan-in wait resolved closes its open
-- conditions. The caller holds the locks of the fan-in waits whose conditions it
-- resolves (ingest and the rematch pass lock them with the conditions).
CREATE OR REPLACE FUNCTION matcher.resolve_waits(
    wait_ids uuid[],
    new_state text,
    how text,
    outcome text,
    producers text[] DEFAULT NULL,
    event_ids text[] DEFAULT NULL,
    received_at timestamptz[] DEFAULT NULL
) RETURNS bigint
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    resolved_count bigint;
    -- A variable, not a constant: see migration 0013.
    still_waiting text := 'waiting';
    groups uuid[];
    fan_ins uuid[];
    complete uuid[];
    complete_producers text[];
    complete_event_ids text[];
    complete_received timestamptz[];
BEGIN
    WITH target AS (
        SELECT *
        FROM unnest(
            resolve_waits.wait_ids,
            coalesce(resolve_waits.producers,
                     array_fill(NULL::text, ARRAY[cardinality(resolve_waits.wait_ids)])),
            coalesce(resolve_waits.event_ids,
                     array_fill(NULL::text, ARRAY[cardinality(resolve_waits.wait_ids)])),
            coalesce(resolve_waits.received_at,
                     array_fill(NULL::timestamptz, ARRAY[cardinality(resolve_waits.wait_ids)]))
        ) AS u(wait_id, producer, event_id, received_at)
    ), resolved AS (
        UPDATE matcher.waits AS w
        SET state = resolve_waits.new_state, resolved_at = now(),
            resolution = resolve_waits.how,
            resolved_by_producer = t.producer, resolved_by_event_id = t.event_id,
            resolved_by_received_at = CASE WHEN t.producer IS NULL THEN NULL
                                           ELSE coalesce(t.received_at, now()) END,
            version = w.version + 1
        FROM target AS t
        WHERE w.id = t.wait_id AND w.state = still_waiting
        RETURNING w.id, w.tenant, w.run_id, w.group_id, w.needed
    ), queued AS (
        INSERT INTO matcher.outbox (wait_id, tenant, run_id, outcome)
        SELECT id, tenant, run_id, resolve_waits.outcome FROM resolved
        WHERE group_id IS NULL
        RETURNING 1
    )
    SELECT count(*),
           array_agg(DISTINCT group_id) FILTER (WHERE group_id IS NOT NULL),
           array_agg(id) FILTER (WHERE needed IS NOT NULL)
    INTO resolved_count, groups, fan_ins
    FROM resolved;

    IF fan_ins IS NOT NULL THEN
        UPDATE matcher.waits AS c
        SET state = resolve_waits.new_state, resolved_at = now(),
            resolution = CASE WHEN resolve_waits.new_state = 'matched' THEN 'group'
                              ELSE resolve_waits.how END,
            version = c.version + 1
        WHERE c.group_id = ANY (fan_ins) AND c.state = still_waiting;
    END IF;

    IF groups IS NOT NULL THEN
        -- The fan-in waits whose rule is met now, each with the event that completed it
        -- (the last to arrive of those that counted).
        SELECT array_agg(p.id ORDER BY p.id), array_agg(last.producer ORDER BY p.id),
               array_agg(last.event_id ORDER BY p.id), array_agg(last.received_at ORDER BY p.id)
        INTO complete, complete_producers, complete_event_ids, complete_received
        FROM matcher.waits AS p
        CROSS JOIN LATERAL (
            SELECT c.resolved_by_producer AS producer, c.resolved_by_event_id AS event_id,
                   c.resolved_by_received_at AS received_at, count(*) OVER () AS met
            FROM matcher.waits AS c
            WHERE c.group_id = p.id AND c.state = 'matched' AND c.resolution = 'event'
            ORDER BY c.resolved_by_received_at DESC, c.condition_index DESC
            LIMIT 1
        ) AS last
        WHERE p.id = ANY (groups) AND p.state = still_waiting AND last.met >= p.needed;
        IF complete IS NOT NULL THEN
            PERFORM matcher.resolve_waits(
                complete, 'matched', 'event', 'event', complete_producers, complete_event_ids,
                complete_received);
        END IF;
    END IF;
    RETURN resolved_count;
END
$$;

-- A fan-in wait's conditions as JSON: each with its state and the event that met it.
-- PL/pgSQL: called, not inlined, and only for a fan-in wait (under a CASE), so that the
-- hot queries that may call it keep their plans for every other wait.
CREATE FUNCTION matcher.fan_in_json(fan_in uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
RETURN (
    SELECT jsonb_agg(jsonb_build_object(
        'id', c.id, 'index', c.condition_index, 'event_types', to_jsonb(c.event_types),
        'correlation_id', c.correlation_id, 'condition', c.condition::text,
        'state', CASE WHEN c.resolution = 'group' THEN 'not_needed' ELSE c.state END,
        'resolved_at', matcher.rfc3339(c.resolved_at),
        'event', CASE WHEN c.resolution = 'event' THEN jsonb_build_object(
            'source', c.resolved_by_producer, 'id', c.resolved_by_event_id,
            'received_at', matcher.rfc3339(c.resolved_by_received_at)) END
    ) ORDER BY c.condition_index)
    FROM matcher.waits AS c
    WHERE c.group_id = fan_in_json.fan_in
);
END $$;

-- The events that met a fan-in wait's conditions, in the order they arrived, each as a
-- resume's event is written, with the condition it met (PL/pgSQL: see fan_in_json).
CREATE FUNCTION matcher.fan_in_events(fan_in uuid) RETURNS json
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
RETURN (
    SELECT coalesce(json_agg(json_build_object(
        'condition', c.condition_index, 'correlation_id', c.correlation_id,
        'source', c.resolved_by_producer, 'id', c.resolved_by_event_id,
        'type', coalesce(i.type, ''), 'data', i.data, 'external_job_id', i.external_job_id,
        'occurred_at', matcher.rfc3339(i.occurred_at), 'topic', i.kafka_topic,
        'partition', i.kafka_partition, 'offset', i.kafka_offset,
        'received_at', matcher.rfc3339(c.resolved_by_received_at)
    ) ORDER BY c.resolved_by_received_at, c.condition_index), '[]'::json)
    FROM matcher.waits AS c
    LEFT JOIN matcher.inbox AS i
      ON i.producer = c.resolved_by_producer AND i.event_id = c.resolved_by_event_id
      AND i.received_at = c.resolved_by_received_at
    WHERE c.group_id = fan_in_events.fan_in AND c.resolution = 'event'
);
END $$;

-- The wait's JSON, with a fan-in wait's rule and conditions.
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
    'last_progress_at', matcher.rfc3339(w.last_progress_at),
    'needed', w.needed,
    'conditions', CASE WHEN w.needed IS NOT NULL THEN matcher.fan_in_json(w.id) END
);

-- The resume's data: a fan-in wait's adds "needed" and "events" (every event that
-- counted, in order of arrival; on a timeout, those that had arrived), its "event" being
-- the one that completed it. Every other resume is as migration 0022 writes it.
CREATE OR REPLACE FUNCTION matcher.resume_data(
    resolution_id uuid, outcome text, w matcher.waits, i matcher.inbox
) RETURNS json
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
WHEN w.needed IS NOT NULL THEN json_build_object(
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
    'deadline', matcher.rfc3339(w.deadline),
    'needed', w.needed, 'events', matcher.fan_in_events(w.id)
)
WHEN w.resolution IS DISTINCT FROM 'heartbeat' THEN json_build_object(
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

-- register_wait_v2 (not released before this migration) with fan-in: `conditions`, a
-- JSON array of {"event_types": [...], "correlation_id": "...", "condition": "..."}
-- (2 to 32 of them), instead of event_types and correlation_id; `rule` 'all' (the
-- default), 'any' or 'at_least' with `at_least` conditions. A fan-in wait has no
-- condition or heartbeat of its own.
DROP FUNCTION matcher.register_wait_v2(
    text, text, bigint, text[], text, timestamptz, text, uuid, text, interval, text[]
);
CREATE FUNCTION matcher.register_wait_v2(
    tenant text,
    run_id text,
    "position" bigint,
    event_types text[] DEFAULT NULL,
    correlation_id text DEFAULT NULL,
    deadline timestamptz DEFAULT NULL,
    external_job_id text DEFAULT NULL,
    wait_id uuid DEFAULT NULL,
    condition text DEFAULT NULL,
    heartbeat_interval interval DEFAULT NULL,
    progress_types text[] DEFAULT NULL,
    conditions jsonb DEFAULT NULL,
    rule text DEFAULT NULL,
    at_least integer DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    stored matcher.waits;
    types text[];
    progress text[];
    parts jsonb;
    part jsonb;
    n integer;
    needed integer;
    the_tenant text := matcher.checked_ident('tenant', register_wait_v2.tenant);
    the_run text := matcher.checked_ident('run_id', register_wait_v2.run_id);
    the_position bigint := matcher.checked_position(register_wait_v2."position");
    part_correlations text[] := '{}';
    part_conditions jsonpath[] := '{}';
    all_types text[] := '{}';
BEGIN
    IF register_wait_v2.conditions IS NULL THEN
        IF register_wait_v2.rule IS NOT NULL OR register_wait_v2.at_least IS NOT NULL THEN
            RAISE EXCEPTION 'matcher: rule and at_least are for a wait with conditions'
                USING ERRCODE = '22023';
        END IF;
        types := matcher.checked_types(register_wait_v2.event_types);
    ELSE
        IF register_wait_v2.event_types IS NOT NULL OR register_wait_v2.correlation_id IS NOT NULL
           OR register_wait_v2.condition IS NOT NULL
           OR register_wait_v2.heartbeat_interval IS NOT NULL
           OR register_wait_v2.progress_types IS NOT NULL THEN
            RAISE EXCEPTION 'matcher: a wait with conditions takes its event types, correlation '
                'ids and data conditions from them (and has no heartbeat)'
                USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(register_wait_v2.conditions) IS DISTINCT FROM 'array'
           OR jsonb_array_length(register_wait_v2.conditions) NOT BETWEEN 2 AND 32 THEN
            RAISE EXCEPTION 'matcher: conditions must be an array of 2 to 32 conditions'
                USING ERRCODE = '22023';
        END IF;
        n := jsonb_array_length(register_wait_v2.conditions);
        needed := CASE coalesce(register_wait_v2.rule, 'all')
                      WHEN 'all' THEN n WHEN 'any' THEN 1
                      WHEN 'at_least' THEN register_wait_v2.at_least END;
        IF needed IS NULL OR needed NOT BETWEEN 1 AND n
           OR (register_wait_v2.at_least IS NOT NULL
               AND coalesce(register_wait_v2.rule, 'all') <> 'at_least') THEN
            RAISE EXCEPTION 'matcher: rule must be all, any, or at_least with at_least between 1 '
                'and the number of conditions (%)', n USING ERRCODE = '22023';
        END IF;
        FOR part IN SELECT value FROM jsonb_array_elements(register_wait_v2.conditions) LOOP
            IF jsonb_typeof(part) IS DISTINCT FROM 'object'
               OR jsonb_typeof(part -> 'event_types') IS DISTINCT FROM 'array'
               OR jsonb_typeof(part -> 'correlation_id') IS DISTINCT FROM 'string'
               OR (part ? 'condition' AND jsonb_typeof(part -> 'condition') NOT IN ('string', 'null'))
               OR EXISTS (SELECT 1 FROM jsonb_object_keys(part) AS k
                          WHERE k NOT IN ('event_types', 'correlation_id', 'condition')) THEN
                RAISE EXCEPTION 'matcher: each condition is {"event_types": [...], '
                    '"correlation_id": "...", "condition": "..." (optional)}'
                    USING ERRCODE = '22023';
            END IF;
            IF EXISTS (SELECT 1 FROM jsonb_array_elements(part -> 'event_types') AS t
                       WHERE jsonb_typeof(t) <> 'string') THEN
                RAISE EXCEPTION 'matcher: a condition''s event_types must be strings'
                    USING ERRCODE = '22023';
            END IF;
            types := matcher.checked_types(
                ARRAY(SELECT jsonb_array_elements_text(part -> 'event_types')));
            all_types := all_types || types;
            part_correlations := part_correlations
                || matcher.checked_ident('correlation_id', part ->> 'correlation_id');
            part_conditions := part_conditions || matcher.checked_condition(part ->> 'condition');
        END LOOP;
        types := matcher.checked_types(all_types);
    END IF;
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
        condition, progress_types, heartbeat_interval, heartbeat_due, needed
    )
    VALUES (
        coalesce(register_wait_v2.wait_id, gen_random_uuid()),
        the_tenant, the_run, the_position, types,
        CASE WHEN register_wait_v2.conditions IS NULL
             THEN matcher.checked_ident('correlation_id', register_wait_v2.correlation_id)
             ELSE part_correlations[1] END,
        CASE WHEN register_wait_v2.external_job_id IS NULL THEN NULL
             ELSE matcher.checked_ident('external_job_id', register_wait_v2.external_job_id) END,
        register_wait_v2.deadline,
        matcher.checked_condition(register_wait_v2.condition),
        progress,
        register_wait_v2.heartbeat_interval,
        now() + register_wait_v2.heartbeat_interval,
        needed
    )
    RETURNING * INTO stored;
    IF register_wait_v2.conditions IS NOT NULL THEN
        INSERT INTO matcher.waits (
            id, tenant, run_id, "position", event_types, correlation_id, condition, group_id,
            condition_index
        )
        SELECT gen_random_uuid(), the_tenant, the_run, the_position,
               matcher.checked_types(
                   ARRAY(SELECT jsonb_array_elements_text(p.value -> 'event_types'))),
               part_correlations[p.ordinality], part_conditions[p.ordinality], stored.id,
               p.ordinality - 1
        FROM jsonb_array_elements(register_wait_v2.conditions) WITH ORDINALITY AS p;
    END IF;
    RETURN matcher.wait_json(stored);
END $$;

-- matcher.ingest_events of migration 0022, for fan-in: a fan-in wait is never matched
-- itself; a condition's wait is locked with it; two new events meeting conditions of one
-- fan-in wait leave their keys to the rematch pass (see 0016 for the rest).
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
               s.progress_of, s.takes_group,
               f.fresh AND EXISTS (
                   SELECT 1 FROM matcher.match_queue AS q
                   WHERE q.tenant = f.tenant AND q.correlation_id = f.correlation_id
               ) AS queued
        FROM firsts AS f
        LEFT JOIN LATERAL (
            SELECT bool_or(l.id IS NULL
                           OR (w.group_id IS NOT NULL AND w.state = 'waiting' AND g.id IS NULL)
                   ) AS busy,
                   -- The oldest waiting wait that accepts it (created_at, then id): its
                   -- type, and its condition if it has one.
                   (array_agg(w.id ORDER BY w.created_at, w.id)
                       FILTER (WHERE coalesce(l.state, w.state) = 'waiting'
                                 AND f.type = ANY (w.event_types)
                                 AND (w.condition IS NULL
                                      OR matcher.condition_holds(f.data, w.condition))
                       ))[1] AS takes,
                   -- The fan-in wait of the condition it meets, if that is one.
                   (array_agg(w.group_id ORDER BY w.created_at, w.id)
                       FILTER (WHERE coalesce(l.state, w.state) = 'waiting'
                                 AND f.type = ANY (w.event_types)
                                 AND (w.condition IS NULL
                                      OR matcher.condition_holds(f.data, w.condition))
                       ))[1] AS takes_group,
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
            -- A fan-in condition's wait is locked with it (one transaction at a time
            -- decides for a fan-in wait); held elsewhere, the condition is busy.
            LEFT JOIN LATERAL (
                SELECT p.id FROM matcher.waits AS p
                WHERE p.id = w.group_id AND w.state = 'waiting'
                FOR UPDATE SKIP LOCKED
            ) AS g ON true
            WHERE f.fresh AND w.tenant = f.tenant AND w.correlation_id = f.correlation_id
              AND w.state <> 'matched' AND w.needed IS NULL
        ) AS s ON true
    ), placed AS (
        SELECT k.*, k.fresh AND NOT (k.queued OR k.to_rematch) AS decided_here
        FROM (
            -- A key is decided here unless a wait of it is busy, or two new events find
            -- waiting waits in it (their order would decide which takes which), or two
            -- new events meet conditions of one fan-in wait (what it still needs decides
            -- whether the second counts).
            SELECT l.*,
                   (l.tenant, l.correlation_id) IN (
                       SELECT o.tenant, o.correlation_id FROM looked AS o
                       GROUP BY o.tenant, o.correlation_id
                       HAVING bool_or(o.busy) OR count(o.takes) > 1
                       UNION ALL
                       SELECT o.tenant, o.correlation_id FROM looked AS o
                       WHERE o.takes_group IN (
                           SELECT x.takes_group FROM looked AS x
                           WHERE x.takes_group IS NOT NULL
                           GROUP BY x.takes_group HAVING count(*) > 1
                       )
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
