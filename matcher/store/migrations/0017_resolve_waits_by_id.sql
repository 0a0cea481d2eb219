-- matcher.resolve_waits finds the waits it resolves by their ids, whatever the statistics
-- say.
--
-- Why: its UPDATE asked for `w.id = t.wait_id AND w.state = 'waiting'`, and the second
-- condition is the predicate of the partial index waits_waiting. When the statistics
-- undercount waiting waits (a burst registered since the last ANALYZE, as in a benchmark
-- that registers its waits first, or a busy day), the planner took that index for a few
-- rows and chose to read every waiting wait and hash-join them with the batch. PL/pgSQL
-- keeps that plan for the session, so every call paid for it: measured at 500 events/s
-- with 8,000 waits registered, 1.3 ms of a 2.2 ms ingest call for 2.3 events, 60 % of
-- Postgres' time at that rate.
--
-- Now the state is compared with a variable, which a generic plan cannot match with the
-- index's predicate: the only index left that serves the join is the primary key, one
-- probe per wait resolved. Generic plans are forced (custom plans would put 'waiting' back
-- as a constant), as in matcher.ingest_events. The body, arguments and result are
-- otherwise those of migration 0013.

CREATE OR REPLACE FUNCTION matcher.resolve_waits(
    wait_ids uuid[],
    new_state text,
    how text,
    outcome text,
    producers text[] DEFAULT NULL,
    event_ids text[] DEFAULT NULL,
    received_at timestamptz[] DEFAULT NULL
) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    resolved_count bigint;
    -- A variable, not a constant: see above.
    still_waiting text := 'waiting';
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
        RETURNING w.id, w.tenant, w.run_id
    ), queued AS (
        INSERT INTO matcher.outbox (wait_id, tenant, run_id, outcome)
        SELECT id, tenant, run_id, resolve_waits.outcome FROM resolved
        RETURNING 1
    )
    SELECT count(*) INTO resolved_count FROM queued;
    RETURN resolved_count;
END
$$;
