-- The lock that serialises everything touching one (tenant, correlation id): registration
-- and ingest both take it first, so neither can miss the other (invariant 2). A hash
-- collision between two keys only makes them wait for each other; it never breaks a match.
CREATE FUNCTION matcher.wait_key(tenant text, correlation_id text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN hashtextextended(tenant || chr(31) || correlation_id, 0);

-- The core tables: waits, the event inbox, the resume outbox, runs, and quarantine.
-- Everything lives in the `matcher` schema so that the tables can share an application's
-- own database (the worker SDK registers waits inside the application's transaction).

CREATE TABLE matcher.waits (
    id              uuid PRIMARY KEY,
    tenant          text        NOT NULL,
    run_id          text        NOT NULL,
    position        bigint      NOT NULL,
    event_types     text[]      NOT NULL CHECK (cardinality(event_types) > 0),
    correlation_id  text        NOT NULL,
    external_job_id text,
    deadline        timestamptz,
    state           text        NOT NULL DEFAULT 'waiting'
                    CHECK (state IN ('waiting', 'matched', 'timed_out', 'cancelled')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    -- What resolved it: the event's (producer, event_id), or the deadline, or a cancel.
    resolution      text CHECK (resolution IN ('event', 'deadline', 'cancel')),
    resolved_by_producer text,
    resolved_by_event_id text,
    version         integer     NOT NULL DEFAULT 0,
    CHECK ((state = 'waiting') = (resolved_at IS NULL))
);
-- Match lookup: the waits of one (tenant, correlation id). Not only the waiting ones:
-- ingest also needs the timed-out and cancelled ones to recognise a late event.
CREATE INDEX waits_match ON matcher.waits (tenant, correlation_id);
-- Deadline sweep: the earliest deadlines of waiting waits.
CREATE INDEX waits_deadline ON matcher.waits (deadline) WHERE state = 'waiting' AND deadline IS NOT NULL;
CREATE INDEX waits_by_run ON matcher.waits (tenant, run_id, position);
CREATE INDEX waits_by_correlation ON matcher.waits (correlation_id);
CREATE INDEX waits_by_job ON matcher.waits (external_job_id) WHERE external_job_id IS NOT NULL;

CREATE TABLE matcher.inbox (
    producer        text        NOT NULL,  -- the CloudEvents source
    event_id        text        NOT NULL,  -- the CloudEvents id
    tenant          text        NOT NULL,
    type            text        NOT NULL,
    correlation_id  text        NOT NULL,
    external_job_id text,
    occurred_at     timestamptz,
    received_at     timestamptz NOT NULL DEFAULT now(),
    kafka_topic     text,
    kafka_partition integer,
    kafka_offset    bigint,
    data            jsonb,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'consumed', 'late', 'expired')),
    consumed_by     uuid,       -- the wait this event resolved
    late_for        uuid,       -- the wait it would have resolved, had it come in time
    status_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (producer, event_id)
);
-- Registration looks for pending events of one (tenant, correlation id), oldest first.
CREATE INDEX inbox_pending_match ON matcher.inbox (tenant, correlation_id, received_at)
    WHERE status = 'pending';
-- Expiry and the oldest-pending gauge.
CREATE INDEX inbox_pending_age ON matcher.inbox (received_at) WHERE status = 'pending';
-- Purge, oldest first, whatever the status.
CREATE INDEX inbox_received ON matcher.inbox (received_at);
CREATE INDEX inbox_by_correlation ON matcher.inbox (correlation_id);
CREATE INDEX inbox_by_job ON matcher.inbox (external_job_id) WHERE external_job_id IS NOT NULL;

-- A resolution waiting to be published. The resume message itself is built by the relay
-- from the wait and its event, so it is defined once, not in every path that resolves.
CREATE TABLE matcher.outbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resolution_id   uuid        NOT NULL UNIQUE DEFAULT gen_random_uuid(),
    -- One resolution per wait, enforced by the database as well as by the conditional update.
    wait_id         uuid        NOT NULL UNIQUE REFERENCES matcher.waits (id),
    tenant          text        NOT NULL,
    run_id          text        NOT NULL,
    outcome         text        NOT NULL CHECK (outcome IN ('event', 'timeout', 'cancelled')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz
);
CREATE INDEX outbox_unpublished ON matcher.outbox (id) WHERE published_at IS NULL;

-- The minimal run state the worker SDK's `advance` updates conditionally.
CREATE TABLE matcher.runs (
    tenant          text        NOT NULL,
    run_id          text        NOT NULL,
    position        bigint      NOT NULL DEFAULT 0,
    status          text        NOT NULL DEFAULT 'running',
    last_resolution_id uuid,
    version         integer     NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, run_id)
);

CREATE TABLE matcher.quarantine (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    received_at     timestamptz NOT NULL DEFAULT now(),
    kafka_topic     text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    kafka_key       bytea,
    raw_value       bytea,
    headers         jsonb       NOT NULL DEFAULT '[]',
    reason          text        NOT NULL,
    detail          text,
    -- Whatever could be read from the message, for explain and for operators.
    producer        text,
    event_id        text,
    tenant          text,
    type            text,
    correlation_id  text,
    replayed_at     timestamptz,
    -- A redelivered poison message is quarantined once.
    UNIQUE (kafka_topic, kafka_partition, kafka_offset)
);
CREATE INDEX quarantine_by_reason ON matcher.quarantine (reason, id);
CREATE INDEX quarantine_by_correlation ON matcher.quarantine (correlation_id)
    WHERE correlation_id IS NOT NULL;
