-- name: begin
-- Sent in the first round trip of a pipelined transaction (see matcher.store.pipelined).
-- The level is named: the daemon's matching needs READ COMMITTED whatever the default.
BEGIN ISOLATION LEVEL READ COMMITTED;

-- name: commit
COMMIT;

-- name: rollback
-- A block that raised, or a statement that failed: nothing of it stays. In a pipeline
-- with no BEGIN it ends the implicit transaction of the statements before it.
ROLLBACK;
