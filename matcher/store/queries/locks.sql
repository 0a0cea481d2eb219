-- name: hold
-- A lock on a name until the transaction ends (re-entrant within it); names hash to 64
-- bits, so two names may share a lock: that only serialises more, never less.
SELECT pg_advisory_xact_lock(hashtextextended(%(name)s, 0));
