-- The resume message is built in one place, by this function: the relay publishes what it
-- returns, and the worker SDK's advance() checks a resume against it, so that a message on
-- the resume topic that matcher did not commit (forged, altered, or re-addressed to
-- another run) advances nothing. (The JSON of matcher.domain.resume.ResumeCloudEvent; a
-- test holds the two equal.)
CREATE FUNCTION matcher.resume_message(
    resolution_id uuid, outcome text, w matcher.waits, i matcher.inbox
) RETURNS json
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN json_build_object(
        'specversion', '1.0',
        'id', resolution_id,
        'source', 'matcher',
        'type', 'matcher.resume',
        'subject', w.run_id,
        'time', matcher.rfc3339(w.resolved_at),
        'datacontenttype', 'application/json',
        'tenant', w.tenant,
        'data', json_build_object(
            'resolution_id', resolution_id,
            'tenant', w.tenant,
            'run_id', w.run_id,
            'position', w.position,
            'outcome', outcome,
            'wait_id', w.id,
            'correlation_id', w.correlation_id,
            'event_types', w.event_types,
            'event', CASE WHEN outcome = 'event' THEN json_build_object(
                'source', w.resolved_by_producer,
                'id', w.resolved_by_event_id,
                'type', coalesce(i.type, ''),
                'data', i.data,
                'external_job_id', i.external_job_id,
                'occurred_at', matcher.rfc3339(i.occurred_at),
                'topic', i.kafka_topic,
                'partition', i.kafka_partition,
                'offset', i.kafka_offset,
                'received_at', matcher.rfc3339(coalesce(i.received_at, w.resolved_at))
            ) END,
            'created_at', matcher.rfc3339(w.created_at),
            'resolved_at', matcher.rfc3339(w.resolved_at),
            'deadline', matcher.rfc3339(w.deadline)
        )
    );

-- The digest of the message as published: what checks a resume once its event has left the
-- inbox (its day dropped past the dedupe window) and the message can no longer be rebuilt.
ALTER TABLE matcher.outbox ADD COLUMN message_sha256 bytea;
