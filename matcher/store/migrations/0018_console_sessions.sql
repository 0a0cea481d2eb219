-- Console sessions kept server-side, so that signing out ends a session everywhere its
-- cookie was copied. The cookie stays signed with a key derived from the admin token (a
-- rotation still ends every session); a session is valid only while its row is here.
-- The id is the SHA-256 of the cookie's random part: the table holds nothing that could be
-- replayed as a cookie.
CREATE TABLE matcher.console_sessions (
    id bytea PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
