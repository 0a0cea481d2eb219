-- The gauges (every few seconds, per daemon) count waiting waits and find the oldest one.
-- Without an index that was a scan of every wait ever stored: at a million rows it took
-- a core for a tenth of a second each time and showed up as latency spikes.
CREATE INDEX waits_waiting ON matcher.waits (created_at) WHERE state = 'waiting';
