-- name: open_session
-- A signed-in session; the expired ones go at the same time (a handful a day).
WITH purged AS (
    DELETE FROM matcher.console_sessions WHERE expires_at <= now()
)
INSERT INTO matcher.console_sessions (id, expires_at)
VALUES (%(id)s, %(expires_at)s);

-- name: session_open
SELECT EXISTS (
    SELECT 1 FROM matcher.console_sessions WHERE id = %(id)s AND expires_at > now()
);

-- name: close_session
DELETE FROM matcher.console_sessions WHERE id = %(id)s;
