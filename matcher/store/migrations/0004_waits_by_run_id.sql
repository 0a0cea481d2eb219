-- explain and the admin API look runs up by run id alone (the tenant is optional there):
-- lead the index with run_id so that lookup stays on it.
DROP INDEX matcher.waits_by_run;
CREATE INDEX waits_by_run ON matcher.waits (run_id, tenant, position);
