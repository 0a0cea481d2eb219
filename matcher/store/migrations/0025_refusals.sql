-- Deliveries the webhook ingress refused, kept so that explain, the admin API and the
-- console can say "a delivery claiming this correlation id was refused" rather than
-- "nothing has arrived". Every claimed_* column is what the request said, unverified (its
-- signature failed, or was never reached): a hint for operators that changes no decision.
-- Bounded: the ingress records at most MATCHER_INGRESS_REFUSAL_RECORDS_PER_S, the janitor
-- deletes rows past MATCHER_QUARANTINE_RETENTION, and every text is cut to a bound here.
CREATE TABLE matcher.refusals (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    received_at timestamptz NOT NULL,
    via text NOT NULL CHECK (via IN ('webhook', 'callback')),
    producer text NOT NULL,  -- the URL's producer, '_unknown', or 'callback'
    reason text NOT NULL,
    detail text NOT NULL,
    http_status smallint NOT NULL,
    claimed_event_id text,
    claimed_type text,
    claimed_tenant text,
    claimed_correlation_id text
);
CREATE INDEX refusals_by_correlation ON matcher.refusals (claimed_correlation_id, id)
    WHERE claimed_correlation_id IS NOT NULL;
CREATE INDEX refusals_by_received ON matcher.refusals (received_at);

-- A refusal's time as the ingress gave it, when it is one and within a day of now;
-- else NULL (the row takes now()).
CREATE FUNCTION matcher.refusal_time(given text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t timestamptz;
BEGIN
    t := given::timestamptz;
    RETURN CASE WHEN abs(extract(epoch FROM t - now())) <= 86400 THEN t END;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;

-- The ingress's one way in: a batch of refusals as a JSON array. SECURITY DEFINER with
-- EXECUTE granted to no one by default, like complete_callback_v1: the ingress's role
-- needs EXECUTE on these two functions and nothing else. Rows past 1,000 in a batch are
-- ignored; texts are cut to their bounds; a row with no producer or reason is skipped.
CREATE FUNCTION matcher.record_refusals_v1(refused jsonb) RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH given AS (
        SELECT r FROM jsonb_array_elements(
            CASE WHEN jsonb_typeof(refused) = 'array' THEN refused ELSE '[]'::jsonb END
        ) WITH ORDINALITY AS a(r, n)
        WHERE n <= 1000 AND jsonb_typeof(r) = 'object'
    ), inserted AS (
        INSERT INTO matcher.refusals (
            received_at, via, producer, reason, detail, http_status,
            claimed_event_id, claimed_type, claimed_tenant, claimed_correlation_id
        )
        SELECT coalesce(matcher.refusal_time(r->>'received_at'), now()),
               CASE WHEN r->>'via' = 'callback' THEN 'callback' ELSE 'webhook' END,
               left(r->>'producer', 256), left(r->>'reason', 64),
               left(coalesce(r->>'detail', ''), 1000),
               CASE WHEN (r->>'http_status') ~ '^[1-5][0-9]{2}$'
                    THEN (r->>'http_status')::smallint ELSE 400 END,
               left(r->>'event_id', 512), left(r->>'type', 512),
               left(r->>'tenant', 512), left(r->>'correlation_id', 512)
        FROM given
        WHERE r->>'producer' IS NOT NULL AND r->>'reason' IS NOT NULL
        RETURNING 1
    )
    SELECT count(*)::integer FROM inserted
$$;

REVOKE EXECUTE ON FUNCTION matcher.record_refusals_v1(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION matcher.refusal_time(text) FROM PUBLIC;
