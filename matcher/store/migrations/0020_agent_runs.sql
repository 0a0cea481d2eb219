-- Agent runs parked on deferred tool calls (matcher.integrations.pydantic_ai): the run's
-- message history as its framework serialises it, the tool calls it waits for (each a
-- matcher wait, its run named '<prefix><conversation>/<tool call id>'), and the results
-- gathered so far. A run continues once every pending call has its result; the row is
-- written in the transaction that registers the waits, and again in the one that
-- advances them, so the history and the waits never disagree.
CREATE TABLE matcher.agent_runs (
    tenant text NOT NULL,
    conversation text NOT NULL,
    history jsonb NOT NULL,
    pending jsonb NOT NULL,                 -- {tool call id: wait id}
    results jsonb NOT NULL DEFAULT '{}',    -- {tool call id: resume}
    output jsonb,
    state text NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'done')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, conversation)
);
