-- Quarantine rows hold hostile records, so they are bounded, and they are judged again on
-- replay as they were the first time.
--
-- arrived_at: the arrival the gate judged the signature's freshness against (the broker's
--   append time), so that a replay judges it the same way rather than by the time the row
--   was written (NULL on older rows: received_at stands in).
-- raw_size, raw_sha256: the whole value's size and digest. raw_value keeps the value
--   whole when it is within the gate's limit, a prefix when not (raw_truncated: such a row
--   is never replayed, as what is kept is not what was signed).
ALTER TABLE matcher.quarantine
    ADD COLUMN arrived_at timestamptz,
    ADD COLUMN raw_size integer,
    ADD COLUMN raw_sha256 bytea,
    ADD COLUMN raw_truncated boolean NOT NULL DEFAULT false;

-- Retention deletes the oldest rows first.
CREATE INDEX quarantine_received ON matcher.quarantine (received_at);
