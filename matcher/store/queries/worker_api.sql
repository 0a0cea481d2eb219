-- The worker API (migration 0019): every call of the Python SDK goes through these
-- functions, as a worker in any other language would.

-- name: register_wait
SELECT matcher.register_wait_v2(
    tenant => %(tenant)s, run_id => %(run_id)s, "position" => %(position)s,
    event_types => %(event_types)s::text[], correlation_id => %(correlation_id)s,
    deadline => %(deadline)s, external_job_id => %(external_job_id)s, wait_id => %(id)s,
    condition => %(condition)s,
    heartbeat_interval => make_interval(secs => %(heartbeat_interval_s)s::float8),
    progress_types => %(progress_types)s::text[],
    conditions => %(conditions)s::jsonb, rule => %(rule)s, at_least => %(at_least)s
);

-- name: record_launch
SELECT matcher.record_launch_v1(
    tenant => %(tenant)s, run_id => %(run_id)s, "position" => %(position)s,
    event_types => %(event_types)s::text[], correlation_id => %(correlation_id)s,
    deadline => %(deadline)s, idempotency_key => %(idempotency_key)s
);

-- name: record_job_id
SELECT matcher.record_job_id_v1(%(launch_id)s, %(external_job_id)s);

-- name: get_wait
SELECT matcher.get_wait_v1(%(wait_id)s);

-- name: get_launch
SELECT matcher.get_launch_v1(%(launch_id)s);

-- name: cancel_wait
SELECT matcher.cancel_wait_v1(%(wait_id)s);

-- name: issue_callback
SELECT matcher.issue_callback_v1(%(wait_id)s);

-- name: committed_resume
SELECT matcher.committed_resume_v1(%(wait_id)s, %(resolution_id)s);

-- name: verify_resume
SELECT matcher.verify_resume_v1(%(message)s);

-- name: advance
SELECT matcher.advance_v1(%(message)s);

-- name: advance_each
-- The resume worker's batch: each message (of distinct runs) advanced in one statement,
-- each answer by its place in the list. The list is sent in binary format: as text, every
-- quote of every message would be escaped on the way.
SELECT t.i, matcher.advance_v1(t.m)
FROM unnest(%(messages)b::text[]) WITH ORDINALITY AS t(m, i);

-- name: unadvanced_resolutions
SELECT resolution_id, wait_id, tenant, run_id, "position", committed_at, message
FROM matcher.unadvanced_resolutions_v1(
    tenant => %(tenant)s, run_prefix => %(run_prefix)s,
    committed_before => %(committed_before)s, committed_after => %(committed_after)s,
    max_rows => %(max_rows)s
);

-- name: record_worker_failure
SELECT attempts, parked
FROM matcher.record_worker_failure_v1(%(message)s, %(error)s, %(max_attempts)s);

-- name: retry_parked
SELECT matcher.retry_parked_v1(
    tenant => %(tenant)s, run_id => %(run_id)s, wait_id => %(wait_id)s,
    resolution_id => %(resolution_id)s
);
