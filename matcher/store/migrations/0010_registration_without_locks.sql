-- Registration takes no lock (invariant 2 by another proven scheme, and invariant 10).
--
-- Before: register_wait took the (tenant, correlation id) advisory lock in the caller's
-- transaction and looked for a pending event under it. Under REPEATABLE READ or
-- SERIALIZABLE the look ran in a snapshot older than the lock, so an event committed
-- meanwhile was missed for ever; and the lock lived until the caller committed, so one
-- worker transaction left open stopped every ingest batch that held its key.
--
-- Now registration only inserts the wait, and the insert queues its key here (a
-- statement trigger, so every way of inserting a wait is covered). The daemon's rematch
-- loop takes each queued key, after the wait committed, in a READ COMMITTED transaction of
-- its own, under the key's advisory lock (the one ingest takes), and matches the key's
-- waiting waits against its pending events. Whatever order the wait's commit and an
-- event's ingest come in, one of the two sees the other under that lock. Ingest defers to
-- this loop any key still queued (so the oldest pending event still wins) and any key whose
-- wait rows another transaction holds locked (a worker's cancel, say), instead of waiting.
--
-- No unique key on (tenant, correlation_id): an insert here must never wait for another
-- transaction's insert of the same key. The loop takes duplicates together.
CREATE TABLE matcher.match_queue (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant          text        NOT NULL,
    correlation_id  text        NOT NULL,
    not_before      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX match_queue_by_key ON matcher.match_queue (tenant, correlation_id);

CREATE FUNCTION matcher.queue_new_waits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO matcher.match_queue (tenant, correlation_id)
    SELECT DISTINCT tenant, correlation_id FROM new_waits WHERE state = 'waiting';
    IF FOUND THEN
        PERFORM pg_notify('matcher_match', '');  -- delivered at commit, never before
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER waits_queue_new
    AFTER INSERT ON matcher.waits
    REFERENCING NEW TABLE AS new_waits
    FOR EACH STATEMENT EXECUTE FUNCTION matcher.queue_new_waits();

-- Waits registered under the old scheme in a snapshot that missed their event get their
-- second look now.
INSERT INTO matcher.match_queue (tenant, correlation_id)
SELECT DISTINCT tenant, correlation_id FROM matcher.waits WHERE state = 'waiting';
