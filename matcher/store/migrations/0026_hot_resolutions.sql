-- The write path redesigned (issue 58): a resolution is one HOT update of its wait, a
-- resume waits in a thin queue that the relay empties, and the inbox insert and its
-- indexes lose what the guarantees do not need.
--
-- 1. A wait's resolution facts live on the wait: its resolution id and outcome (they were
--    the outbox row's), and the digest of its resume once that can no longer be rebuilt.
--    No index of matcher.waits names a column a resolution changes, in its keys or its
--    predicate, and the table leaves a fifth of each page free: a resolution is a HOT
--    update (one heap record, no index entry).
-- 2. The open waits, found by deadline, heartbeat and age, are a side table: a row per
--    waiting wait, inserted with the wait (by the insert trigger) and deleted in the
--    statement that resolves it.
-- 3. matcher.outbox becomes matcher.resume_queue: a row per resume to publish, inserted
--    with the resolution, deleted by the relay in the transaction that publishes it and
--    commits only after Kafka's acknowledgement (the delete is the mark). Published rows
--    no longer accumulate. matcher.resolutions is the view of every resolution.
-- 4. The inbox insert needs no ON CONFLICT (the ids are claimed first, in matcher.event_ids).
--
-- Carried over: every outbox row's resolution id, outcome and published digest move to its
-- wait; the unpublished ones are queued in their order, to be published once.

ALTER TABLE matcher.waits
    ADD COLUMN resolution_id uuid,
    ADD COLUMN outcome text,
    ADD COLUMN resume_sha256 bytea,
    ADD CONSTRAINT waits_outcome_check
        CHECK (outcome IN ('event', 'timeout', 'cancelled')),
    ADD CONSTRAINT waits_resolution_id_check
        CHECK ((resolution_id IS NULL) = (outcome IS NULL));
-- Room on each page for the resolved version of its rows (a HOT update stays on its page).
ALTER TABLE matcher.waits SET (fillfactor = 50);

UPDATE matcher.waits AS w
SET resolution_id = o.resolution_id, outcome = o.outcome, resume_sha256 = o.message_sha256
FROM matcher.outbox AS o
WHERE o.wait_id = w.id;

CREATE TABLE matcher.open_waits (
    wait_id uuid PRIMARY KEY,
    tenant text NOT NULL,  -- the console's lists filter by it before reading the wait
    created_at timestamptz NOT NULL,
    deadline timestamptz,
    heartbeat_due timestamptz,
    top_level boolean NOT NULL  -- not a fan-in wait's condition
);
CREATE INDEX open_waits_deadline ON matcher.open_waits (deadline) WHERE deadline IS NOT NULL;
CREATE INDEX open_waits_heartbeat_due ON matcher.open_waits (heartbeat_due)
    WHERE heartbeat_due IS NOT NULL;
CREATE INDEX open_waits_oldest ON matcher.open_waits (created_at, wait_id) WHERE top_level;
INSERT INTO matcher.open_waits (wait_id, tenant, created_at, deadline, heartbeat_due, top_level)
SELECT id, tenant, created_at, deadline, heartbeat_due, group_id IS NULL
FROM matcher.waits WHERE state = 'waiting';

DROP INDEX matcher.waits_deadline, matcher.waits_heartbeat_due, matcher.waits_waiting;
-- The recovery sweep (unadvanced_resolutions_v1) reads resolutions by when their wait was
-- registered: created_at never changes, and a summarizing index on it costs nothing per
-- resolution (on resolved_at, every resolution would be a non-HOT update in Postgres 15).
CREATE INDEX waits_created_at ON matcher.waits USING brin (created_at);

CREATE OR REPLACE FUNCTION matcher.queue_new_waits() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO matcher.open_waits (
        wait_id, tenant, created_at, deadline, heartbeat_due, top_level
    )
    SELECT id, tenant, created_at, deadline, heartbeat_due, group_id IS NULL
    FROM new_waits WHERE state = 'waiting';
    INSERT INTO matcher.match_queue (tenant, correlation_id)
    SELECT DISTINCT tenant, correlation_id FROM new_waits WHERE state = 'waiting';
    IF FOUND THEN
        PERFORM pg_notify('matcher_match', '');  -- delivered at commit, never before
    END IF;
    RETURN NULL;
END
$$;

-- A waiting wait's deadline or heartbeat moved (progress events) moves on its open row,
-- whoever moved it. Only such updates fire it: a resolution sets neither column.
CREATE FUNCTION matcher.move_open_wait() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE matcher.open_waits
    SET deadline = NEW.deadline, heartbeat_due = NEW.heartbeat_due
    WHERE wait_id = NEW.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER waits_move_open AFTER UPDATE OF deadline, heartbeat_due ON matcher.waits
    FOR EACH ROW
    WHEN (NEW.state = 'waiting' AND (OLD.deadline IS DISTINCT FROM NEW.deadline
                                     OR OLD.heartbeat_due IS DISTINCT FROM NEW.heartbeat_due))
    EXECUTE FUNCTION matcher.move_open_wait();

-- The inbox's correlation index holds the events not consumed on arrival only: a consumed
-- event is found through the wait that consumed it (waits_match, then the inbox's primary
-- key), so an event matched as it arrives writes one index entry fewer. (Built on every
-- day of the inbox at once: a long lock on a big inbox; see the upgrade notes.)
DROP INDEX matcher.inbox_by_correlation;
CREATE INDEX inbox_by_correlation ON matcher.inbox (correlation_id)
    WHERE status <> 'consumed';

CREATE TABLE matcher.resume_queue (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    wait_id uuid NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TRIGGER resume_queue_wakes_relay AFTER INSERT ON matcher.resume_queue
    FOR EACH STATEMENT EXECUTE FUNCTION matcher.wake_relay();
INSERT INTO matcher.resume_queue (wait_id, created_at)
SELECT wait_id, created_at FROM matcher.outbox WHERE published_at IS NULL ORDER BY id;

-- Functions whose bodies were bound to matcher.outbox when they were created.
DROP FUNCTION matcher.committed_resume_v1(uuid, uuid);
DROP FUNCTION matcher.unadvanced_resolutions_v1(text, text, timestamptz, timestamptz, integer);
DROP TABLE matcher.outbox;

-- Every resolution that has a resume (a fan-in wait's conditions have none), and whether
-- the relay has published it (acknowledged by Kafka: its queue row is gone).
CREATE VIEW matcher.resolutions AS
SELECT w.resolution_id, w.id AS wait_id, w.tenant, w.run_id, w.outcome,
       w.resolved_at, NOT EXISTS (
           SELECT 1 FROM matcher.resume_queue AS q WHERE q.wait_id = w.id
       ) AS published,
       w.resume_sha256
FROM matcher.waits AS w
WHERE w.resolution_id IS NOT NULL;

-- matcher.resolve_waits of migration 0023: the wait row takes the resolution id and
-- outcome in the resolving update (HOT), its open row is deleted, its resume queued.
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
            -- A fan-in wait's condition has no resume of its own.
            resolution_id = CASE WHEN w.group_id IS NULL THEN gen_random_uuid() END,
            outcome = CASE WHEN w.group_id IS NULL THEN resolve_waits.outcome END,
            version = w.version + 1
        FROM target AS t
        WHERE w.id = t.wait_id AND w.state = still_waiting
        RETURNING w.id, w.group_id, w.needed
    ), closed AS (
        -- By key (= ANY of an array), never a join: a join's plan may read every open wait.
        DELETE FROM matcher.open_waits AS o WHERE o.wait_id = ANY (ARRAY(SELECT id FROM resolved))
    ), queued AS (
        INSERT INTO matcher.resume_queue (wait_id)
        SELECT id FROM resolved WHERE group_id IS NULL
    )
    SELECT count(*),
           array_agg(DISTINCT group_id) FILTER (WHERE group_id IS NOT NULL),
           array_agg(id) FILTER (WHERE needed IS NOT NULL)
    INTO resolved_count, groups, fan_ins
    FROM resolved;

    IF fan_ins IS NOT NULL THEN
        WITH closed_conditions AS (
            UPDATE matcher.waits AS c
            SET state = resolve_waits.new_state, resolved_at = now(),
                resolution = CASE WHEN resolve_waits.new_state = 'matched' THEN 'group'
                                  ELSE resolve_waits.how END,
                version = c.version + 1
            WHERE c.group_id = ANY (fan_ins) AND c.state = still_waiting
            RETURNING c.id
        )
        DELETE FROM matcher.open_waits AS o
        WHERE o.wait_id = ANY (ARRAY(SELECT id FROM closed_conditions));
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

-- The resume matcher committed for a wait, exactly as the relay publishes it; NULL when
-- there is none, or when its event has left the inbox and it can no longer be rebuilt.
CREATE FUNCTION matcher.committed_resume_v1(wait_id uuid, resolution_id uuid DEFAULT NULL)
RETURNS text
LANGUAGE sql STABLE
RETURN (
    SELECT matcher.resume_message(w.resolution_id, w.outcome, w, i)::text
    FROM matcher.waits AS w
    LEFT JOIN matcher.inbox AS i
      ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
      AND i.received_at = w.resolved_by_received_at
    WHERE w.id = committed_resume_v1.wait_id AND w.resolution_id IS NOT NULL
      AND (committed_resume_v1.resolution_id IS NULL
           OR w.resolution_id = committed_resume_v1.resolution_id)
      AND NOT (w.outcome = 'event' AND i.producer IS NULL)
);

-- Resolutions no worker has advanced, of waits registered in the window (see the index
-- waits_created_at above), resolved before committed_before.
CREATE FUNCTION matcher.unadvanced_resolutions_v1(
    tenant text DEFAULT NULL, run_prefix text DEFAULT NULL,
    committed_before timestamptz DEFAULT now() - interval '1 minute',
    committed_after timestamptz DEFAULT now() - interval '7 days',
    max_rows integer DEFAULT 100
) RETURNS SETOF matcher.unadvanced_resolution_v1
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT w.resolution_id, w.id, w.tenant, w.run_id, w."position", w.resolved_at,
           matcher.resume_message(w.resolution_id, w.outcome, w, i)::text
    FROM matcher.waits AS w
    LEFT JOIN matcher.inbox AS i
      ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
      AND i.received_at = w.resolved_by_received_at
    WHERE w.created_at >= unadvanced_resolutions_v1.committed_after
      AND w.created_at < unadvanced_resolutions_v1.committed_before
      AND w.resolution_id IS NOT NULL
      AND w.resolved_at >= unadvanced_resolutions_v1.committed_after
      AND w.resolved_at < unadvanced_resolutions_v1.committed_before
      AND (unadvanced_resolutions_v1.tenant IS NULL OR w.tenant = unadvanced_resolutions_v1.tenant)
      AND (unadvanced_resolutions_v1.run_prefix IS NULL
           OR starts_with(w.run_id, unadvanced_resolutions_v1.run_prefix))
      AND NOT (w.outcome = 'event' AND i.producer IS NULL)
      AND NOT EXISTS (
          SELECT 1 FROM matcher.runs AS r
          WHERE r.tenant = w.tenant AND r.run_id = w.run_id AND r."position" > w."position"
      )
      AND NOT EXISTS (
          SELECT 1 FROM matcher.worker_failures AS f
          WHERE f.resolution_id = w.resolution_id AND f.parked_at IS NOT NULL
      )
    ORDER BY w.resolved_at, w.id
    LIMIT unadvanced_resolutions_v1.max_rows;
END;

-- matcher.verify_resume_v1 of migration 0019, reading the resolution from its wait: the
-- digest recorded once the event left the inbox, else the message rebuilt.
CREATE OR REPLACE FUNCTION matcher.verify_resume_v1(message text) RETURNS jsonb
    LANGUAGE plpgsql STABLE
AS $$
DECLARE
    envelope jsonb;
    the_wait uuid;
    the_resolution uuid;
    committed text;
    event_gone boolean;
    published bytea;
BEGIN
    BEGIN
        envelope := message::jsonb;
        the_wait := (envelope -> 'data' ->> 'wait_id')::uuid;
        the_resolution := (envelope -> 'data' ->> 'resolution_id')::uuid;
    EXCEPTION WHEN others THEN
        RAISE EXCEPTION 'matcher: not a resume matcher committed (not a resume message)'
            USING ERRCODE = 'MR001';
    END;
    -- A digest recorded (its event has left the inbox): one index lookup.
    SELECT w.resume_sha256 INTO published FROM matcher.waits AS w
    WHERE w.id = the_wait AND w.resolution_id = the_resolution;
    IF published IS NOT NULL AND sha256(convert_to(message, 'UTF8')) = published THEN
        RETURN envelope -> 'data';
    END IF;
    SELECT matcher.resume_message(w.resolution_id, w.outcome, w, i)::text,
           w.outcome = 'event' AND i.producer IS NULL
    INTO committed, event_gone
    FROM matcher.waits AS w
    LEFT JOIN matcher.inbox AS i
      ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
      AND i.received_at = w.resolved_by_received_at
    WHERE w.id = the_wait AND w.resolution_id = the_resolution;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'matcher: matcher committed no resolution % for wait %',
            the_resolution, the_wait USING ERRCODE = 'MR001';
    END IF;
    IF event_gone THEN
        RAISE EXCEPTION 'matcher: resolution % cannot be checked: its event is no longer '
            'stored and the message is not the one published', the_resolution
            USING ERRCODE = 'MR001';
    ELSIF committed IS DISTINCT FROM message THEN
        RAISE EXCEPTION 'matcher: resume % differs from what matcher committed',
            the_resolution USING ERRCODE = 'MR001';
    END IF;
    RETURN envelope -> 'data';
END $$;

-- matcher.ingest_events of migration 0023: the inbox insert without ON CONFLICT (see 0023
-- and 0016 for the rest).
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
    -- another batch claimed and has not committed makes this wait for its end (the primary
    -- key's check), and then retry the batch, which sees it stored: what ON CONFLICT DO
    -- NOTHING did, without the confirm record it writes for every row (migration 0026).
    -- Sorted, after the sorted key locks, so two batches sharing ids wait in one direction
    -- only.
    BEGIN
        WITH claimed AS (
            INSERT INTO matcher.event_ids (producer, event_id)
            SELECT DISTINCT u.p, u.e
            FROM unnest(ingest_events.producers, ingest_events.event_ids) AS u(p, e)
            WHERE NOT EXISTS (
                SELECT 1 FROM matcher.event_ids AS x WHERE x.producer = u.p AND x.event_id = u.e
            )
            ORDER BY u.p, u.e
            RETURNING producer, event_id
        )
        SELECT coalesce(array_agg(producer), '{}'), coalesce(array_agg(event_id), '{}')
        INTO claimed_producers, claimed_event_ids
        FROM claimed;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'an event id of the batch was claimed by a concurrent batch'
            USING ERRCODE = 'serialization_failure';
    END;

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
        RETURNING 1
    )
    SELECT count(*) INTO accepted FROM stored;
    -- The ids were claimed first, so no other transaction can have stored one of these
    -- events meanwhile (hence no ON CONFLICT, whose confirm record every row would pay).
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

    -- Invariant 3: the waits resolved, with their resumes queued (the relay is woken at
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
