-- The relay builds each resume message in the claim query (json_build_object in C rather
-- than a pydantic model per row in the daemon: that was a fifth of the daemon's CPU).
-- Timestamps in the messages are RFC 3339 in UTC with a "Z", as pydantic writes them.
CREATE FUNCTION matcher.rfc3339(ts timestamptz) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
