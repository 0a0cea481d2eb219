-- The worker API, version 1 (docs/reference/worker-api.md): functions in the matcher schema
-- that a worker in any language calls inside its own transaction, so that registering a
-- wait, advancing a run and the worker's own writes commit together. The functions are the
-- API, the tables are not. A function's signature never changes once released: a change
-- is a new name (register_wait_v2), and the old one stays at least until the release after
-- the one that adds its successor.

-- Resumes a worker could not handle: the attempts so far, the last error, and when it
-- stopped trying (parked_at; NULL while it still retries). `matcher resumes retry` clears
-- parked_at, and the worker's sweep of the database hands the resume to it again.
CREATE TABLE matcher.worker_failures (
    resolution_id uuid PRIMARY KEY,
    wait_id uuid NOT NULL,
    tenant text NOT NULL,
    run_id text NOT NULL,
    "position" bigint NOT NULL,
    attempts integer NOT NULL,
    last_error text NOT NULL,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    last_failed_at timestamptz NOT NULL DEFAULT now(),
    parked_at timestamptz
);
CREATE INDEX worker_failures_by_run ON matcher.worker_failures (tenant, run_id);
CREATE INDEX worker_failures_parked ON matcher.worker_failures (parked_at)
    WHERE parked_at IS NOT NULL;

-- The sweep for resolutions no worker advanced reads the outbox by when each was
-- committed: a BRIN index, a few pages for the whole table, and nothing written per row
-- beyond the block range (created_at never changes, so updates stay HOT).
CREATE INDEX outbox_created_at ON matcher.outbox USING brin (created_at);
-- A run's advance time, for explain ("advanced at ...").
ALTER TABLE matcher.runs ADD COLUMN advanced_at timestamptz;

-- An identifier as the SDKs check it: text with a character other than white space, at
-- most 512 bytes. White space is Unicode's (Python's str.isspace, the Python SDK's check),
-- spelled out rather than left to a regex class, whose meaning follows the database's
-- locale: the same text gets the same answer from every SDK and every database.
CREATE FUNCTION matcher.checked_ident(what text, value text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL OR translate(
        value,
        E'\t\n\u000B\f\r\u001C\u001D\u001E\u001F \u0085\u00A0\u1680\u2000\u2001\u2002'
        || E'\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200A\u2028\u2029\u202F\u205F\u3000',
        ''
    ) = '' THEN
        RAISE EXCEPTION 'matcher: % must be non-empty text', what USING ERRCODE = '22023';
    END IF;
    IF octet_length(value) > 512 THEN
        RAISE EXCEPTION 'matcher: % must be at most 512 bytes (UTF-8)', what
            USING ERRCODE = '22023';
    END IF;
    RETURN value;
END $$;

CREATE FUNCTION matcher.checked_types(event_types text[]) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    t text;
BEGIN
    IF event_types IS NULL OR cardinality(event_types) = 0 THEN
        RAISE EXCEPTION 'matcher: event_types must name at least one type' USING ERRCODE = '22023';
    END IF;
    FOREACH t IN ARRAY event_types LOOP
        PERFORM matcher.checked_ident('an event type', t);
    END LOOP;
    -- Sorted by code point (the C collation), as the Python SDK sorts them, whatever the
    -- database's own collation.
    RETURN ARRAY(
        SELECT d.u FROM (SELECT DISTINCT u FROM unnest(event_types) AS u) AS d
        ORDER BY d.u COLLATE "C"
    );
END $$;

CREATE FUNCTION matcher.checked_position("position" bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF "position" IS NULL OR "position" < 0 THEN
        RAISE EXCEPTION 'matcher: position must be 0 or more' USING ERRCODE = '22023';
    END IF;
    RETURN "position";
END $$;

-- A wait as the API answers it (the JSON Schema schemas/wait.schema.json); times are
-- RFC 3339 in UTC.
CREATE FUNCTION matcher.wait_json(w matcher.waits) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
RETURN jsonb_build_object(
    'id', w.id, 'tenant', w.tenant, 'run_id', w.run_id, 'position', w."position",
    'event_types', to_jsonb(w.event_types), 'correlation_id', w.correlation_id,
    'external_job_id', w.external_job_id, 'deadline', matcher.rfc3339(w.deadline),
    'state', w.state, 'created_at', matcher.rfc3339(w.created_at),
    'resolved_at', matcher.rfc3339(w.resolved_at), 'resolution', w.resolution,
    'resolved_by_producer', w.resolved_by_producer,
    'resolved_by_event_id', w.resolved_by_event_id
);

-- A launch as the API answers it (schemas/launch.schema.json).
CREATE FUNCTION matcher.launch_json(l matcher.launches) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
RETURN jsonb_build_object(
    'id', l.id, 'tenant', l.tenant, 'run_id', l.run_id, 'position', l."position",
    'idempotency_key', l.idempotency_key, 'correlation_id', l.correlation_id,
    'wait_id', l.wait_id, 'external_job_id', l.external_job_id, 'state', l.state,
    'created_at', matcher.rfc3339(l.created_at), 'updated_at', matcher.rfc3339(l.updated_at),
    'reconcile_attempts', l.reconcile_attempts
);

-- Register a wait, in the caller's transaction. It takes no lock: once the transaction
-- commits, the daemon matches it against events already stored, and ingest against events
-- to come (invariant 2). A deadline already past is accepted: the sweeper times the wait
-- out at its next pass, unless an event already stored matches it.
CREATE FUNCTION matcher.register_wait_v1(
    tenant text, run_id text, "position" bigint, event_types text[], correlation_id text,
    deadline timestamptz DEFAULT NULL, external_job_id text DEFAULT NULL,
    wait_id uuid DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    stored matcher.waits;
BEGIN
    INSERT INTO matcher.waits AS w (
        id, tenant, run_id, "position", event_types, correlation_id, external_job_id, deadline
    )
    VALUES (
        coalesce(register_wait_v1.wait_id, gen_random_uuid()),
        matcher.checked_ident('tenant', register_wait_v1.tenant),
        matcher.checked_ident('run_id', register_wait_v1.run_id),
        matcher.checked_position(register_wait_v1."position"),
        matcher.checked_types(register_wait_v1.event_types),
        matcher.checked_ident('correlation_id', register_wait_v1.correlation_id),
        CASE WHEN register_wait_v1.external_job_id IS NULL THEN NULL
             ELSE matcher.checked_ident('external_job_id', register_wait_v1.external_job_id) END,
        register_wait_v1.deadline
    )
    RETURNING * INTO stored;
    RETURN matcher.wait_json(stored);
END $$;

-- Record a launch intent and its wait, both or neither, BEFORE calling the external
-- system (give it the launch's idempotency_key and correlation_id; afterwards call
-- record_job_id_v1). Called again with the same tenant and idempotency key (a retry after
-- a crash), it returns the launch recorded the first time and adds nothing. The key
-- defaults to tenant:run_id:position; the correlation id to a new UUID.
CREATE FUNCTION matcher.record_launch_v1(
    tenant text, run_id text, "position" bigint, event_types text[],
    correlation_id text DEFAULT NULL, deadline timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    the_tenant text := matcher.checked_ident('tenant', record_launch_v1.tenant);
    the_run text := matcher.checked_ident('run_id', record_launch_v1.run_id);
    the_position bigint := matcher.checked_position(record_launch_v1."position");
    the_key text := coalesce(
        record_launch_v1.idempotency_key, the_tenant || ':' || the_run || ':' || the_position
    );
    the_correlation text := coalesce(record_launch_v1.correlation_id, gen_random_uuid()::text);
    the_types text[] := matcher.checked_types(record_launch_v1.event_types);
    the_wait uuid := gen_random_uuid();
    stored matcher.launches;
BEGIN
    PERFORM matcher.checked_ident('idempotency_key', the_key);
    PERFORM matcher.checked_ident('correlation_id', the_correlation);
    -- One statement, both rows or neither (the launch's foreign key to its wait is checked
    -- at its end). The unique key is the only synchronisation: a concurrent retry waits
    -- for the first insert to commit or roll back, then inserts nothing (READ COMMITTED),
    -- or fails with a serialization error to retry (REPEATABLE READ, SERIALIZABLE).
    WITH launch AS (
        INSERT INTO matcher.launches AS l (
            id, tenant, run_id, "position", idempotency_key, correlation_id, wait_id
        )
        VALUES (gen_random_uuid(), the_tenant, the_run, the_position, the_key, the_correlation,
                the_wait)
        ON CONFLICT ON CONSTRAINT launches_tenant_idempotency_key_key DO NOTHING
        RETURNING *
    ), wait AS (
        INSERT INTO matcher.waits (id, tenant, run_id, "position", event_types, correlation_id,
                                   deadline)
        SELECT launch.wait_id, launch.tenant, launch.run_id, launch."position", the_types,
               launch.correlation_id, record_launch_v1.deadline
        FROM launch
        RETURNING id
    )
    SELECT launch.* INTO stored FROM launch;
    IF stored.id IS NULL THEN  -- recorded before: the first one stands
        SELECT * INTO stored FROM matcher.launches AS l
        WHERE l.tenant = the_tenant AND l.idempotency_key = the_key;
    END IF;
    RETURN matcher.launch_json(stored);
END $$;

-- Store the external job id on a launch and its wait. True when this call stored it (or
-- the same id was stored before); false when another id is recorded already. No launch
-- with this id: SQLSTATE P0002 (no_data_found).
CREATE FUNCTION matcher.record_job_id_v1(launch_id uuid, external_job_id text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    stored_job_id text;
    recorded boolean;
BEGIN
    PERFORM matcher.checked_ident('external_job_id', record_job_id_v1.external_job_id);
    WITH launch AS (
        UPDATE matcher.launches AS l
        SET external_job_id = record_job_id_v1.external_job_id, state = 'submitted',
            updated_at = now()
        WHERE l.id = record_job_id_v1.launch_id AND l.state = 'intent'
        RETURNING l.id, l.wait_id
    ), wait AS (
        UPDATE matcher.waits AS w SET external_job_id = record_job_id_v1.external_job_id
        FROM launch WHERE w.id = launch.wait_id
        RETURNING w.id
    ), audit AS (
        INSERT INTO matcher.launch_audit (launch_id, actor, answer, external_job_id)
        SELECT id, 'worker', 'submitted', record_job_id_v1.external_job_id FROM launch
    )
    SELECT count(*) > 0 INTO recorded FROM launch;
    IF recorded THEN
        RETURN true;
    END IF;
    SELECT l.external_job_id INTO stored_job_id FROM matcher.launches AS l
    WHERE l.id = record_job_id_v1.launch_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'matcher: no launch %', record_job_id_v1.launch_id
            USING ERRCODE = 'P0002';
    END IF;
    RETURN stored_job_id IS NOT DISTINCT FROM record_job_id_v1.external_job_id;
END $$;

-- A wait by its id, as register_wait_v1 answered it, in its state now; NULL when there is
-- no such wait.
CREATE FUNCTION matcher.get_wait_v1(wait_id uuid) RETURNS jsonb
LANGUAGE sql STABLE
RETURN (SELECT matcher.wait_json(w) FROM matcher.waits AS w WHERE w.id = get_wait_v1.wait_id);

-- A launch by its id, in its state now; NULL when there is no such launch.
CREATE FUNCTION matcher.get_launch_v1(launch_id uuid) RETURNS jsonb
LANGUAGE sql STABLE
RETURN (
    SELECT matcher.launch_json(l) FROM matcher.launches AS l WHERE l.id = get_launch_v1.launch_id
);

-- Cancel a waiting wait: true when this call cancelled it (a resume with outcome
-- "cancelled" follows), false when it was resolved already.
CREATE FUNCTION matcher.cancel_wait_v1(wait_id uuid) RETURNS boolean
LANGUAGE sql
RETURN matcher.resolve_waits(ARRAY[cancel_wait_v1.wait_id], 'cancelled', 'cancel', 'cancelled') > 0;

-- The resume matcher committed for a wait (its latest resolution, or the one named),
-- exactly as the relay publishes it; NULL when there is none, or when its event has left
-- the inbox (past the dedupe window) and it can no longer be rebuilt.
CREATE FUNCTION matcher.committed_resume_v1(wait_id uuid, resolution_id uuid DEFAULT NULL)
RETURNS text
LANGUAGE sql STABLE
RETURN (
    SELECT matcher.resume_message(o.resolution_id, o.outcome, w, i)::text
    FROM matcher.outbox AS o
    JOIN matcher.waits AS w ON w.id = o.wait_id
    LEFT JOIN matcher.inbox AS i
      ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
      AND i.received_at = w.resolved_by_received_at
    WHERE o.wait_id = committed_resume_v1.wait_id
      AND (committed_resume_v1.resolution_id IS NULL
           OR o.resolution_id = committed_resume_v1.resolution_id)
      AND NOT (o.outcome = 'event' AND i.producer IS NULL)
    ORDER BY o.id DESC
    LIMIT 1
);

-- The resume's data when ``message`` is exactly (byte for byte) a resume matcher
-- committed: the message whose SHA-256 the relay recorded when it published it, or, not
-- published yet, the message rebuilt from the outbox, the wait and the event (once the
-- event has left the inbox only the first can be checked). Anything else raises SQLSTATE
-- MR001 (unverified resume): forged, altered, addressed to another run, or not a resume.
CREATE FUNCTION matcher.verify_resume_v1(message text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
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
    -- The common case, a published resume: one index lookup and a digest.
    SELECT o.message_sha256 INTO published FROM matcher.outbox AS o
    WHERE o.wait_id = the_wait AND o.resolution_id = the_resolution;
    IF published IS NOT NULL AND sha256(convert_to(message, 'UTF8')) = published THEN
        RETURN envelope -> 'data';
    END IF;
    SELECT matcher.resume_message(o.resolution_id, o.outcome, w, i)::text,
           o.outcome = 'event' AND i.producer IS NULL, o.message_sha256
    INTO committed, event_gone, published
    FROM matcher.outbox AS o
    JOIN matcher.waits AS w ON w.id = o.wait_id
    LEFT JOIN matcher.inbox AS i
      ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
      AND i.received_at = w.resolved_by_received_at
    WHERE o.wait_id = the_wait AND o.resolution_id = the_resolution;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'matcher: matcher committed no resolution % for wait %',
            the_resolution, the_wait USING ERRCODE = 'MR001';
    END IF;
    IF event_gone THEN
        IF published IS NULL OR sha256(convert_to(message, 'UTF8')) <> published THEN
            RAISE EXCEPTION 'matcher: resolution % cannot be checked: its event is no longer '
                'stored and the message is not the one published', the_resolution
                USING ERRCODE = 'MR001';
        END IF;
    ELSIF committed IS DISTINCT FROM message THEN
        RAISE EXCEPTION 'matcher: resume % differs from what matcher committed',
            the_resolution USING ERRCODE = 'MR001';
    END IF;
    RETURN envelope -> 'data';
END $$;

-- Advance the run past the resume's position, once (invariant 9), in the caller's
-- transaction, after verifying the message (MR001 if matcher did not commit it).
-- 'advanced': this call moved the run (do the run's next step in the same transaction);
-- 'duplicate': the run is past this position already (a redelivery: nothing to do);
-- 'behind': the run is at an earlier position (an earlier resume is not advanced yet:
-- try again later).
CREATE FUNCTION matcher.advance_v1(message text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    data jsonb := matcher.verify_resume_v1(message);
    the_tenant text := data ->> 'tenant';
    the_run text := data ->> 'run_id';
    the_position bigint := (data ->> 'position')::bigint;
    now_at bigint;
BEGIN
    INSERT INTO matcher.runs AS r (tenant, run_id, "position", last_resolution_id, version,
                                   advanced_at)
    VALUES (the_tenant, the_run, the_position + 1, (data ->> 'resolution_id')::uuid, 1, now())
    ON CONFLICT ON CONSTRAINT runs_pkey DO UPDATE
    SET "position" = EXCLUDED."position", last_resolution_id = EXCLUDED.last_resolution_id,
        version = r.version + 1, updated_at = now(), advanced_at = now()
    WHERE r."position" = the_position
    RETURNING r."position" INTO now_at;
    IF FOUND THEN
        DELETE FROM matcher.worker_failures AS f
        WHERE f.resolution_id = (data ->> 'resolution_id')::uuid;
        RETURN 'advanced';
    END IF;
    SELECT r."position" INTO now_at FROM matcher.runs AS r
    WHERE r.tenant = the_tenant AND r.run_id = the_run;
    RETURN CASE WHEN now_at > the_position THEN 'duplicate' ELSE 'behind' END;
END $$;

-- Resolutions committed between ``committed_after`` and ``committed_before`` whose run
-- was not advanced past them through advance_v1, and that are not parked: what a worker's
-- sweep of the database hands to its handler, so that a lost offset, an expired retention
-- or a deleted resume topic never strands a run. Oldest first; each with its message.
CREATE TYPE matcher.unadvanced_resolution_v1 AS (
    resolution_id uuid, wait_id uuid, tenant text, run_id text, "position" bigint,
    committed_at timestamptz, message text
);
CREATE FUNCTION matcher.unadvanced_resolutions_v1(
    tenant text DEFAULT NULL, run_prefix text DEFAULT NULL,
    committed_before timestamptz DEFAULT now() - interval '1 minute',
    committed_after timestamptz DEFAULT now() - interval '7 days',
    max_rows integer DEFAULT 100
) RETURNS SETOF matcher.unadvanced_resolution_v1
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT o.resolution_id, w.id, w.tenant, w.run_id, w."position", o.created_at,
           matcher.resume_message(o.resolution_id, o.outcome, w, i)::text
    FROM matcher.outbox AS o
    JOIN matcher.waits AS w ON w.id = o.wait_id
    LEFT JOIN matcher.inbox AS i
      ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
      AND i.received_at = w.resolved_by_received_at
    WHERE o.created_at >= unadvanced_resolutions_v1.committed_after
      AND o.created_at < unadvanced_resolutions_v1.committed_before
      AND (unadvanced_resolutions_v1.tenant IS NULL OR w.tenant = unadvanced_resolutions_v1.tenant)
      AND (unadvanced_resolutions_v1.run_prefix IS NULL
           OR starts_with(w.run_id, unadvanced_resolutions_v1.run_prefix))
      AND NOT (o.outcome = 'event' AND i.producer IS NULL)
      AND NOT EXISTS (
          SELECT 1 FROM matcher.runs AS r
          WHERE r.tenant = w.tenant AND r.run_id = w.run_id AND r."position" > w."position"
      )
      AND NOT EXISTS (
          SELECT 1 FROM matcher.worker_failures AS f
          WHERE f.resolution_id = o.resolution_id AND f.parked_at IS NOT NULL
      )
    ORDER BY o.id
    LIMIT unadvanced_resolutions_v1.max_rows;
END;

-- A worker's handler failed on this resume (its transaction rolled back): count the
-- attempt, keep the error (bounded), and park the resume once ``max_attempts`` are spent.
-- Returns the attempts so far and whether it is parked. The message is verified first.
CREATE TYPE matcher.worker_failure_v1 AS (attempts integer, parked boolean);
CREATE FUNCTION matcher.record_worker_failure_v1(message text, error text, max_attempts integer)
RETURNS matcher.worker_failure_v1
LANGUAGE plpgsql AS $$
DECLARE
    data jsonb := matcher.verify_resume_v1(message);
    counted matcher.worker_failure_v1;
BEGIN
    INSERT INTO matcher.worker_failures AS f (
        resolution_id, wait_id, tenant, run_id, "position", attempts, last_error, parked_at
    )
    VALUES (
        (data ->> 'resolution_id')::uuid, (data ->> 'wait_id')::uuid, data ->> 'tenant',
        data ->> 'run_id', (data ->> 'position')::bigint, 1, left(error, 2000),
        CASE WHEN max_attempts <= 1 THEN now() END
    )
    ON CONFLICT ON CONSTRAINT worker_failures_pkey DO UPDATE
    SET attempts = f.attempts + 1, last_error = left(EXCLUDED.last_error, 2000),
        last_failed_at = now(),
        parked_at = CASE WHEN f.attempts + 1 >= max_attempts THEN now() ELSE f.parked_at END
    RETURNING f.attempts, f.parked_at IS NOT NULL INTO counted;
    RETURN counted;
END $$;

-- Give parked resumes back to the workers (after fixing what failed them): their
-- attempts start again, and the workers' sweeps hand them to the handler. By resolution,
-- by wait, or by run (a tenant and a run id). Returns how many were parked.
CREATE FUNCTION matcher.retry_parked_v1(
    tenant text DEFAULT NULL, run_id text DEFAULT NULL, wait_id uuid DEFAULT NULL,
    resolution_id uuid DEFAULT NULL
) RETURNS integer
LANGUAGE sql
BEGIN ATOMIC
    WITH retried AS (
        UPDATE matcher.worker_failures AS f SET parked_at = NULL, attempts = 0
        WHERE f.parked_at IS NOT NULL
          AND (retry_parked_v1.tenant IS NULL OR f.tenant = retry_parked_v1.tenant)
          AND (retry_parked_v1.run_id IS NULL OR f.run_id = retry_parked_v1.run_id)
          AND (retry_parked_v1.wait_id IS NULL OR f.wait_id = retry_parked_v1.wait_id)
          AND (retry_parked_v1.resolution_id IS NULL
               OR f.resolution_id = retry_parked_v1.resolution_id)
        RETURNING 1
    )
    SELECT count(*)::integer FROM retried;
END;
