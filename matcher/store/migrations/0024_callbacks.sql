-- A callback URL per wait (docs/concepts/waits.md, "A callback URL per wait"): a long
-- random token that completes exactly one wait when its URL on the webhook ingress is
-- POSTed. The token is the whole credential, so only its SHA-256 is kept: the table holds
-- nothing that could be presented as a token. No foreign key to the waits: the table never
-- holds a wait back, and a token whose wait is gone is simply unknown.
CREATE TABLE matcher.callbacks (
    token_sha256 bytea PRIMARY KEY CHECK (octet_length(token_sha256) = 32),
    wait_id uuid NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The producer that callback events are stored under: a name the producers file may not
-- use (the registry refuses it), so no signed event can take a callback's id.
CREATE FUNCTION matcher.callback_producer() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'callback';

-- A new token: 256 bits, base64url without padding (43 characters). Three random UUIDs
-- (122 random bits each, from the server's strong random source) hashed into 32 bytes:
-- Postgres has no random-bytes function without the pgcrypto extension.
CREATE FUNCTION matcher.new_callback_token() RETURNS text
LANGUAGE sql VOLATILE
RETURN translate(
    encode(
        sha256(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())
               || uuid_send(gen_random_uuid())),
        'base64'
    ),
    '+/=', '-_'
);

-- What a callback's answer says of its wait: the wait's state and how it was resolved,
-- and whether a callback did it. Nothing else of the wait (its tenant, run, key) is told
-- to whoever holds the URL.
CREATE FUNCTION matcher.callback_outcome(w matcher.waits) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
RETURN jsonb_build_object(
    'state', w.state, 'resolution', w.resolution, 'resolved_at', matcher.rfc3339(w.resolved_at),
    'by_callback', w.resolved_by_producer IS NOT DISTINCT FROM matcher.callback_producer()
);

-- A callback token for a waiting wait, in the caller's transaction (right after
-- register_wait_v2, so that the wait, the token and the worker's own state commit
-- together). Only its SHA-256 is stored: keep the token, it cannot be read back. A wait
-- has one token at a time: calling this again replaces it (the old URL answers 404), for
-- a token that leaked or was lost. No such wait: SQLSTATE P0002; a wait that is no longer
-- waiting: 22023.
CREATE FUNCTION matcher.issue_callback_v1(wait_id uuid) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    the_state text;
    fan_in boolean;
    token text := matcher.new_callback_token();
BEGIN
    SELECT w.state, w.needed IS NOT NULL OR w.group_id IS NOT NULL INTO the_state, fan_in
    FROM matcher.waits AS w WHERE w.id = issue_callback_v1.wait_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'matcher: no wait %', issue_callback_v1.wait_id USING ERRCODE = 'P0002';
    END IF;
    -- A fan-in wait is resolved by its conditions' events, under its own lock, which a
    -- callback does not take: it takes no callback, nor does a condition of it.
    IF fan_in THEN
        RAISE EXCEPTION 'matcher: wait % is a fan-in wait or one of its conditions: it takes '
            'no callback', issue_callback_v1.wait_id USING ERRCODE = '22023';
    END IF;
    IF the_state <> 'waiting' THEN
        RAISE EXCEPTION 'matcher: wait % is %, not waiting: it takes no callback',
            issue_callback_v1.wait_id, the_state USING ERRCODE = '22023';
    END IF;
    INSERT INTO matcher.callbacks AS c (token_sha256, wait_id)
    VALUES (sha256(convert_to(token, 'UTF8')), issue_callback_v1.wait_id)
    ON CONFLICT ON CONSTRAINT callbacks_wait_id_key DO UPDATE
    SET token_sha256 = EXCLUDED.token_sha256, created_at = now();
    RETURN token;
END $$;

-- Complete the wait whose token has this SHA-256 with an event of ``event_type`` (one of
-- the wait's types; NULL: its first, in the order the wait lists them) carrying ``data``.
-- The caller hashes the token, so the token itself never reaches the database after it
-- was issued (nor its logs). The event is stored like every other one: in the inbox, under
-- the producer 'callback' with the wait's id as its event id, claimed in
-- matcher.event_ids first, so a second callback for the wait is a duplicate whatever its
-- body. It resolves exactly this wait, never another wait of its key: the wait's
-- condition is not evaluated (the callback addresses the wait itself).
--
-- The answer's status: 'unknown' (no such token, or its wait is gone), 'accepted' (this
-- call resolved the wait), 'duplicate' (a callback for the wait was stored before),
-- 'resolved' (resolved by something else: the event is stored late, linked to the wait),
-- 'late' (timed out, cancelled, or past its deadline or heartbeat: stored late too; the
-- sweeper times a wait past its deadline out). With it, but for 'unknown', the outcome:
-- matcher.callback_outcome of the wait as it is now.
--
-- Invariant 2 as in ingest: the key's advisory lock first, then the id's claim, then the
-- wait. The wait's row is taken NOWAIT: nothing holding a key's lock waits for a row lock
-- (ingest would queue behind it); a wait that a worker or the sweeper holds raises 55P03
-- (lock_not_available): try again. SECURITY DEFINER, EXECUTE granted to no one by
-- default: the ingress may connect as a role that can call this function and nothing else.
CREATE FUNCTION matcher.complete_callback_v1(
    token_sha256 bytea, data jsonb, event_type text DEFAULT NULL, trace_parent text DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    w matcher.waits;
    the_type text;
    the_id text;
    the_producer text := matcher.callback_producer();
    received timestamptz := now();
    answer text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'matcher.complete_callback_v1 needs READ COMMITTED, not %',
            current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    SELECT x.* INTO w
    FROM matcher.callbacks AS c JOIN matcher.waits AS x ON x.id = c.wait_id
    WHERE c.token_sha256 = complete_callback_v1.token_sha256;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('status', 'unknown');
    END IF;
    the_type := coalesce(complete_callback_v1.event_type, w.event_types[1]);
    IF NOT the_type = ANY (w.event_types) THEN
        RAISE EXCEPTION 'matcher: the wait does not accept this event type'
            USING ERRCODE = '22023';
    END IF;
    the_id := w.id::text;

    PERFORM pg_advisory_xact_lock(matcher.wait_key(w.tenant, w.correlation_id));
    INSERT INTO matcher.event_ids (producer, event_id) VALUES (the_producer, the_id)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        SELECT x.* INTO w FROM matcher.waits AS x WHERE x.id = w.id;
        RETURN jsonb_build_object('status', 'duplicate', 'outcome', matcher.callback_outcome(w));
    END IF;

    SELECT x.* INTO w FROM matcher.waits AS x WHERE x.id = w.id FOR UPDATE NOWAIT;
    answer := CASE
        WHEN w.state = 'matched' THEN 'resolved'
        WHEN w.state <> 'waiting' OR w.deadline <= received OR w.heartbeat_due <= received
            THEN 'late'
        ELSE 'accepted' END;
    INSERT INTO matcher.inbox (
        producer, event_id, tenant, type, correlation_id, received_at, data, status,
        consumed_by, late_for, trace_parent
    )
    VALUES (
        the_producer, the_id, w.tenant, the_type, w.correlation_id, received,
        complete_callback_v1.data,
        CASE WHEN answer = 'accepted' THEN 'consumed' ELSE 'late' END,
        CASE WHEN answer = 'accepted' THEN w.id END,
        CASE WHEN answer = 'accepted' THEN NULL ELSE w.id END,
        complete_callback_v1.trace_parent
    );
    IF answer = 'accepted' THEN
        IF matcher.resolve_waits(ARRAY[w.id], 'matched', 'event', 'event', ARRAY[the_producer],
                                 ARRAY[the_id], ARRAY[received]) <> 1 THEN
            RAISE EXCEPTION 'a callback did not resolve its wait, locked and waiting: a bug';
        END IF;
        SELECT x.* INTO w FROM matcher.waits AS x WHERE x.id = w.id;
    END IF;
    RETURN jsonb_build_object('status', answer, 'outcome', matcher.callback_outcome(w));
END $$;
REVOKE EXECUTE ON FUNCTION matcher.complete_callback_v1(bytea, jsonb, text, text) FROM PUBLIC;
