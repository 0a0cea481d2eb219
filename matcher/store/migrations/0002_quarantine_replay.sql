-- What became of a quarantined record that was replayed (after a key or schema fix):
-- 'accepted' (stored as a new event) or 'duplicate' (the inbox already had it).
ALTER TABLE matcher.quarantine
    ADD COLUMN replay_result text CHECK (replay_result IN ('accepted', 'duplicate'));
CREATE INDEX quarantine_unreplayed ON matcher.quarantine (reason, id) WHERE replayed_at IS NULL;
