-- name: record
-- A batch of the ingress's refused deliveries (matcher.record_refusals_v1 bounds them).
SELECT matcher.record_refusals_v1(%(refused)s::jsonb) AS recorded;
