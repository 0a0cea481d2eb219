-- name: park
-- The run waits (again) on these calls: its history, a fresh set of pending calls.
INSERT INTO matcher.agent_runs AS r (tenant, conversation, history, pending)
VALUES (%(tenant)s, %(conversation)s, %(history)s, %(pending)s)
ON CONFLICT (tenant, conversation) DO UPDATE
SET history = EXCLUDED.history, pending = EXCLUDED.pending, results = '{}', output = NULL,
    state = 'waiting', updated_at = now();

-- name: get
SELECT history, pending, results, output, state FROM matcher.agent_runs
WHERE tenant = %(tenant)s AND conversation = %(conversation)s;

-- name: add_result
UPDATE matcher.agent_runs
SET results = results || jsonb_build_object(%(call)s::text, %(result)s::jsonb), updated_at = now()
WHERE tenant = %(tenant)s AND conversation = %(conversation)s;

-- name: finish
UPDATE matcher.agent_runs
SET history = %(history)s, pending = '{}', results = '{}', output = %(output)s,
    state = 'done', updated_at = now()
WHERE tenant = %(tenant)s AND conversation = %(conversation)s;
