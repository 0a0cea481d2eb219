-- name: for_replay
-- Records not yet replayed successfully: one by id, or all with a reason. Locked, so two
-- concurrent replays cannot both store the same record.
SELECT id, received_at, arrived_at, kafka_topic, kafka_partition, kafka_offset, kafka_key,
       raw_value, headers, raw_truncated, reason
FROM matcher.quarantine
WHERE replayed_at IS NULL
  AND (%(id)s::bigint IS NULL OR id = %(id)s)
  AND (%(reason)s::text IS NULL OR reason = %(reason)s)
ORDER BY id
FOR UPDATE SKIP LOCKED;

-- name: mark_replayed
UPDATE matcher.quarantine
SET replayed_at = now(), replay_result = %(result)s
WHERE id = %(id)s;

-- name: note_rejection
-- A replay that still fails keeps the row, with the reason as judged now.
UPDATE matcher.quarantine SET reason = %(reason)s, detail = %(detail)s WHERE id = %(id)s;
