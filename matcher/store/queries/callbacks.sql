-- Callbacks (migration 0023): the ingress completes a wait by its callback token's digest.

-- name: complete_callback
SELECT matcher.complete_callback_v1(
    token_sha256 => %(token_sha256)s, data => %(data)s, event_type => %(event_type)s,
    trace_parent => %(trace_parent)s
);
