-- name: ping
-- Readiness: the server answers on a pooled connection.
SELECT 1;

-- name: read_committed
-- The session's default level, for autocommit statements (see matcher.store.isolation).
SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED;
