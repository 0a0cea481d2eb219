// The services and topics of the test that runs these suites (set by its pytest driver).
import pg from "pg";

export function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: these suites run from tests/integration/test_typescript_sdk.py`);
  return value;
}

export const DATABASE_URL = () => env("MATCHER_DATABASE_URL");
export const BOOTSTRAP = () => env("MATCHER_KAFKA_BOOTSTRAP_SERVERS");
export const EVENTS_TOPIC = () => env("MATCHER_EVENTS_TOPIC");
export const RESUME_TOPIC = () => env("MATCHER_RESUME_TOPIC");

/** Runs `work` in a transaction of a new connection, committed unless it throws. */
export async function inTransaction<T>(work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: DATABASE_URL() });
  await client.connect();
  try {
    await client.query("BEGIN");
    const result = await work(client);
    await client.query("COMMIT");
    return result;
  } catch (error) {
    await client.query("ROLLBACK").catch(() => undefined);
    throw error;
  } finally {
    await client.end();
  }
}

export async function scalar<T>(sql: string, values: unknown[] = []): Promise<T> {
  const client = new pg.Client({ connectionString: DATABASE_URL() });
  await client.connect();
  try {
    const result = await client.query<T[]>({ text: sql, values, rowMode: "array" });
    return result.rows[0]?.[0] as T;
  } finally {
    await client.end();
  }
}

/** Waits until `check` holds, polling, and fails past `timeoutMs` saying what it waited for. */
export async function eventually(check: () => Promise<boolean> | boolean, what: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not reached within ${timeoutMs} ms: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
