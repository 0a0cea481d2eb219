-- Resolving a wait is written once: matcher.resolve_waits is the conditional update
-- (invariant 3) and the outbox rows, in the caller's transaction, whatever resolves the
-- waits (an event: ingest or the rematch pass; the deadline: the sweeper; a cancel). And
-- the relay is woken one way: a statement trigger on the outbox sends NOTIFY
-- matcher_outbox, delivered at commit, so no path can write an outbox row and forget to.

CREATE FUNCTION matcher.resolve_waits(
    wait_ids uuid[],
    new_state text,         -- matched, timed_out or cancelled
    how text,               -- the resolution: event, deadline or cancel
    outcome text,           -- the resume's: event, timeout or cancelled
    producers text[] DEFAULT NULL,      -- for an event: the event of each wait
    event_ids text[] DEFAULT NULL,
    received_at timestamptz[] DEFAULT NULL  -- NULL entries: stored in this transaction
) RETURNS bigint
    LANGUAGE sql VOLATILE
BEGIN ATOMIC
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
        WHERE w.id = t.wait_id AND w.state = 'waiting'
        RETURNING w.id, w.tenant, w.run_id
    ), queued AS (
        INSERT INTO matcher.outbox (wait_id, tenant, run_id, outcome)
        SELECT id, tenant, run_id, resolve_waits.outcome FROM resolved
        RETURNING 1
    )
    SELECT count(*) FROM queued;
END;

CREATE FUNCTION matcher.wake_relay() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('matcher_outbox', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_wakes_relay
    AFTER INSERT ON matcher.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION matcher.wake_relay();
