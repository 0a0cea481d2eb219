-- name: ping
-- Readiness: the server answers on a pooled connection.
SELECT 1;

