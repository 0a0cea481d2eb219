// The resume worker the crash test kills (MATCHER_TEST_CRASH_AT names the point): its
// handler writes one row in `steps` per handled resume, a table with no unique key, so a
// resume handled twice would show as two rows.
import { runWorker, workerOptionsFromEnv } from "../../src/index.js";

await runWorker(
  async (tx, resume) => {
    await tx.query("INSERT INTO steps (run_id, resolution_id) VALUES ($1, $2)", [resume.data.run_id, resume.data.resolution_id]);
  },
  { ...workerOptionsFromEnv(), concurrency: 8 },
);
