// A run that waits for a job, the job's completion event, and the run's next step, exactly
// once: against `make run` (in the repository; then `eval "$(.venv/bin/matcher devstack env)"`).
//
//   npm run build && node dist/examples/round-trip.js
//
// MATCHER_SIGNING_KEY (whsec_... or whsk_...) signs the event as the producer
// MATCHER_EXAMPLE_SOURCE (default billing-svc); without it the event is unsigned, which
// `make run` accepts unless a producers file is configured.
import { randomUUID } from "node:crypto";

import pg from "pg";

import { completionEvent, EventPublisher, registerWait, ResumeWorker, SigningKey } from "../src/index.js";

const env = (name: string, fallback?: string): string => {
  const value = process.env[name] ?? fallback;
  if (value === undefined) throw new Error(`${name} is not set (eval "$(.venv/bin/matcher devstack env)")`);
  return value;
};
const databaseUrl = env("MATCHER_DATABASE_URL");
const bootstrapServers = env("MATCHER_KAFKA_BOOTSTRAP_SERVERS");
const runId = `ts-example-${randomUUID().slice(0, 8)}`;
const correlationId = `job-${randomUUID()}`;

// 1. The run goes to sleep: its wait commits with its own state, in one transaction.
const db = new pg.Client({ connectionString: databaseUrl });
await db.connect();
await db.query("CREATE TABLE IF NOT EXISTS example_runs (id text PRIMARY KEY, step int NOT NULL, outcome text)");
await db.query("BEGIN");
await db.query("INSERT INTO example_runs (id, step) VALUES ($1, 0)", [runId]);
await registerWait(db, { tenant: "acme", runId, position: 0, eventTypes: ["job.completed"], correlationId });
await db.query("COMMIT");
console.log(`run ${runId} waits for ${correlationId}`);

// 2. The job finishes: its producer publishes a (signed) completion event.
const key = process.env.MATCHER_SIGNING_KEY;
const publisher = new EventPublisher({
  bootstrapServers,
  topic: env("MATCHER_EVENTS_TOPIC", "matcher.events"),
  keys: key ? [SigningKey.parse("k1", key)] : [],
});
await publisher.connect();
await publisher.publish(
  completionEvent({
    source: env("MATCHER_EXAMPLE_SOURCE", "billing-svc"),
    type: "job.completed",
    tenant: "acme",
    correlationId,
    data: { rows: 1200 },
  }),
);
await publisher.disconnect();

// 3. The run's next step: the handler's write commits with the run's advance, once.
const worker = new ResumeWorker(
  async (tx, resume) => {
    await tx.query("UPDATE example_runs SET step = step + 1, outcome = $2 WHERE id = $1", [
      resume.data.run_id,
      resume.data.outcome,
    ]);
    if (resume.data.run_id === runId) worker.stop();
  },
  {
    bootstrapServers,
    databaseUrl,
    resumeTopic: env("MATCHER_RESUME_TOPIC", "matcher.resumes"),
    group: "example-ts-worker",
  },
);
const timeout = setTimeout(() => {
  console.error("no resume within 60 s: is `make run` running?");
  worker.stop();
}, 60_000);
await worker.run();
clearTimeout(timeout);
const { rows } = await db.query<{ step: number; outcome: string | null }>("SELECT step, outcome FROM example_runs WHERE id = $1", [runId]);
console.log(`run ${runId}: step ${rows[0]?.step}, outcome ${rows[0]?.outcome}`);
await db.end();
