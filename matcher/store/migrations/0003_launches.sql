-- Launch intents: written, with the run's wait, BEFORE the external job is started, so a
-- worker that dies right after starting it leaves something to reconcile; and an audit of
-- every reconciliation answer.
CREATE TABLE matcher.launches (
    id              uuid PRIMARY KEY,
    tenant          text        NOT NULL,
    run_id          text        NOT NULL,
    position        bigint      NOT NULL,
    idempotency_key text        NOT NULL,
    correlation_id  text        NOT NULL,
    wait_id         uuid        NOT NULL REFERENCES matcher.waits (id),
    external_job_id text,
    state           text        NOT NULL DEFAULT 'intent'
                    CHECK (state IN ('intent', 'submitted', 'reconciled', 'failed')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    reconcile_attempts integer  NOT NULL DEFAULT 0,
    UNIQUE (tenant, idempotency_key)
);
-- Reconciliation looks for old intents that never got a job id.
CREATE INDEX launches_unsubmitted ON matcher.launches (created_at) WHERE state = 'intent';
CREATE INDEX launches_by_job ON matcher.launches (external_job_id)
    WHERE external_job_id IS NOT NULL;
CREATE INDEX launches_by_run ON matcher.launches (tenant, run_id, position);

CREATE TABLE matcher.launch_audit (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    launch_id       uuid        NOT NULL REFERENCES matcher.launches (id),
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text        NOT NULL,  -- who answered: the reconciler's name, or the SDK
    answer          text        NOT NULL
                    CHECK (answer IN ('submitted', 'found', 'not_found', 'unknown', 'error')),
    external_job_id text,
    detail          text
);
CREATE INDEX launch_audit_by_launch ON matcher.launch_audit (launch_id, id);
