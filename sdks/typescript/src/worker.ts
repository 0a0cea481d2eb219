/**
 * The resume worker: consumes the resume topic and calls your handler once per
 * resolution, in the transaction that advances the run (docs/workers/resume-worker.md).
 *
 * For each resume, in one Postgres transaction: `matcher.advance_v1` (which verifies the
 * message byte for byte), then the handler on the same client, then COMMIT; only then is
 * the resume's Kafka offset counted as done. One resume per transaction (no batches).
 */
import { Kafka, type Consumer, type ConsumerConfig, type KafkaConfig } from "kafkajs";
import pg from "pg";

import { sqlState, UnverifiedResume } from "./errors.js";
import { crashPoint } from "./faults.js";
import { NotAResume, parseResume, type Resume, type ResumeData } from "./resume.js";
import { advance, recordWorkerFailure, unadvancedResolutions } from "./worker-api.js";

/** The run's next step: its writes on `tx` commit with the run's advance, once. It must
 * leave `tx` as it found it (no COMMIT, ROLLBACK or SET of its own). */
export type Handler = (tx: pg.PoolClient, resume: Resume) => Promise<void>;

/** Thrown by a handler whose run is not ready yet: the transaction rolls back and this
 * resume is handed to the handler again after `afterS` seconds; only this run waits. */
export class Retry extends Error {
  override readonly name = "Retry";
  constructor(
    readonly afterS: number,
    reason = "not ready",
  ) {
    super(reason);
  }
}

export type Outcome =
  | "advanced"
  | "duplicate"
  | "not_ready"
  | "transient"
  | "failed"
  | "parked"
  | "unverified"
  | "not_a_resume"
  | "filtered";

export type LogLevel = "debug" | "info" | "warn" | "error";
export type Logger = (level: LogLevel, message: string, fields?: Record<string, unknown>) => void;

export interface WorkerOptions {
  bootstrapServers: string | string[];
  databaseUrl?: string;
  /** A pool of your own instead of `databaseUrl` (not ended by the worker). */
  pool?: pg.Pool;
  resumeTopic?: string;
  group?: string;
  /** Only resumes it accepts are handled; the others are skipped (`filtered`). */
  accept?: (data: ResumeData) => boolean;
  /** Attempts running at once (connections used), default 8. */
  concurrency?: number;
  /** Resumes taken from Kafka and not done before fetching pauses, default 1000. */
  maxPending?: number;
  /** Failures before a resume is parked, default 5. */
  maxAttempts?: number;
  backoffS?: number;
  backoffMaxS?: number;
  commitIntervalMs?: number;
  sweepIntervalS?: number;
  sweepAfterS?: number;
  sweepWindowS?: number;
  shutdownTimeoutS?: number;
  sessionTimeoutMs?: number;
  heartbeatIntervalMs?: number;
  kafka?: Omit<KafkaConfig, "brokers">;
  consumer?: Partial<ConsumerConfig>;
  logger?: Logger;
}

type Source = "topic" | "sweep";

interface Tracker {
  pending: Set<number>;
  highest: number;
  committed: number;
}

interface Item {
  resume: Resume;
  source: Source;
  tracker?: Tracker;
  offset?: number;
  failures: number;
}

const TRANSIENT_STATES = new Set(["40001", "40P01", "55P03", "57P01", "57P02", "57P03", "53300"]);
const TRANSIENT_CODES = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE", "ENOTFOUND", "EAI_AGAIN"]);

/** The database away, a conflict or a deadlock: tried again, not counted against the resume. */
export function isTransient(error: unknown): boolean {
  const state = sqlState(error);
  if (state !== undefined) return state.startsWith("08") || TRANSIENT_STATES.has(state);
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code === "string" && TRANSIENT_CODES.has(code)) return true;
  const message = error instanceof Error ? error.message : "";
  return /Connection terminated|connection timeout|Client has encountered a connection error/i.test(message);
}

const defaultLogger: Logger = (level, message, fields) => {
  if (level === "debug" || level === "info") return;
  process.stderr.write(`${JSON.stringify({ level, message, ...fields })}\n`);
};

function errorText(error: unknown): string {
  return error instanceof Error ? (error.stack ?? error.message) : String(error);
}

/** Settings from matcher's environment variables, as the Python worker reads them. */
export function workerOptionsFromEnv(env: NodeJS.ProcessEnv = process.env): WorkerOptions {
  const number = (name: string): number | undefined => {
    const text = env[name];
    return text === undefined || text === "" ? undefined : Number(text);
  };
  const bootstrap = env.MATCHER_KAFKA_BOOTSTRAP_SERVERS;
  if (!bootstrap) throw new Error("MATCHER_KAFKA_BOOTSTRAP_SERVERS is not set");
  const options: WorkerOptions = {
    bootstrapServers: bootstrap,
    databaseUrl: env.MATCHER_DATABASE_URL,
    resumeTopic: env.MATCHER_RESUME_TOPIC,
    group: env.MATCHER_WORKER_GROUP,
    maxAttempts: number("MATCHER_WORKER_MAX_ATTEMPTS"),
    backoffS: number("MATCHER_WORKER_BACKOFF_S"),
    backoffMaxS: number("MATCHER_WORKER_BACKOFF_MAX_S"),
    commitIntervalMs: number("MATCHER_WORKER_COMMIT_INTERVAL_MS"),
    sweepIntervalS: number("MATCHER_WORKER_SWEEP_INTERVAL_S"),
    sweepAfterS: number("MATCHER_WORKER_SWEEP_AFTER_S"),
    shutdownTimeoutS: number("MATCHER_WORKER_SHUTDOWN_TIMEOUT_S"),
    sessionTimeoutMs: number("MATCHER_KAFKA_SESSION_TIMEOUT_MS"),
    heartbeatIntervalMs: number("MATCHER_KAFKA_HEARTBEAT_INTERVAL_MS"),
  };
  return Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined)) as unknown as WorkerOptions;
}

export class ResumeWorker {
  /** Resumes taken, by outcome and source. */
  readonly counts = new Map<string, number>();
  /** Resolves once the consumer holds its partitions for the first time. */
  readonly assigned: Promise<void>;

  private readonly pool: pg.Pool;
  private readonly ownPool: boolean;
  private readonly consumer: Consumer;
  private readonly topic: string;
  private readonly log: Logger;
  private readonly o: Required<
    Pick<
      WorkerOptions,
      | "concurrency"
      | "maxPending"
      | "maxAttempts"
      | "backoffS"
      | "backoffMaxS"
      | "commitIntervalMs"
      | "sweepIntervalS"
      | "sweepAfterS"
      | "sweepWindowS"
      | "shutdownTimeoutS"
    >
  >;
  private trackers = new Map<number, Tracker>();
  private readonly queues = new Map<string, Item[]>(); // per run, in order
  private readonly ready: string[] = []; // runs whose head may be attempted now
  private readonly active = new Map<string, Promise<void>>(); // runs being attempted
  private readonly timers = new Set<NodeJS.Timeout>();
  private readonly swept = new Set<string>(); // resolution ids queued by the sweep
  private pendingCount = 0;
  private stopping = false;
  private started = false;
  private wake: (() => void) | null = null;
  private onAssigned: () => void = () => undefined;

  constructor(
    private readonly handler: Handler,
    private readonly options: WorkerOptions,
  ) {
    this.log = options.logger ?? defaultLogger;
    this.topic = options.resumeTopic ?? "matcher.resumes";
    this.o = {
      concurrency: options.concurrency ?? 8,
      maxPending: options.maxPending ?? 1000,
      maxAttempts: options.maxAttempts ?? 5,
      backoffS: options.backoffS ?? 1,
      backoffMaxS: options.backoffMaxS ?? 60,
      commitIntervalMs: options.commitIntervalMs ?? 1000,
      sweepIntervalS: options.sweepIntervalS ?? 30,
      sweepAfterS: options.sweepAfterS ?? 60,
      sweepWindowS: options.sweepWindowS ?? 7 * 86400,
      shutdownTimeoutS: options.shutdownTimeoutS ?? 30,
    };
    if (options.pool) {
      this.pool = options.pool;
      this.ownPool = false;
    } else {
      if (!options.databaseUrl) throw new Error("the worker needs databaseUrl or pool");
      this.pool = new pg.Pool({
        connectionString: options.databaseUrl,
        max: this.o.concurrency + 1,
        connectionTimeoutMillis: 10_000,
        statement_timeout: 60_000,
        application_name: "matcher-worker-ts",
      });
      this.ownPool = true;
    }
    this.pool.on("error", (error) => this.log("warn", "idle database connection lost", { error: error.message }));
    const brokers = Array.isArray(options.bootstrapServers)
      ? options.bootstrapServers
      : options.bootstrapServers.split(",").map((s) => s.trim()).filter(Boolean);
    const kafka = new Kafka({ clientId: "matcher-worker", logLevel: 1, ...options.kafka, brokers });
    this.consumer = kafka.consumer({
      groupId: options.group ?? "matcher.worker",
      sessionTimeout: options.sessionTimeoutMs ?? 10_000,
      heartbeatInterval: options.heartbeatIntervalMs ?? 1_000,
      ...options.consumer,
    });
    this.assigned = new Promise((resolve) => (this.onAssigned = resolve));
    this.consumer.on(this.consumer.events.GROUP_JOIN, (event) => {
      const partitions = event.payload.memberAssignment[this.topic] ?? [];
      // Fetching restarts from the committed offsets: track the assigned partitions anew
      // (attempts running for the old trackers finish harmlessly).
      this.trackers = new Map(partitions.map((p) => [p, { pending: new Set(), highest: -1, committed: -1 }]));
      this.onAssigned();
    });
  }

  /** Runs until `stop()` (or the signal aborts); resolves once shut down. */
  async run(signal?: AbortSignal): Promise<void> {
    if (this.started) throw new Error("a worker runs once");
    this.started = true;
    await this.consumer.connect();
    await this.consumer.subscribe({ topic: this.topic, fromBeginning: true });
    await this.consumer.run({
      autoCommit: false,
      partitionsConsumedConcurrently: 1,
      eachMessage: async (payload) => {
        const { partition, message } = payload;
        while (this.pendingCount >= this.o.maxPending && !this.stopping) {
          await new Promise((resolve) => setTimeout(resolve, 50));
          await payload.heartbeat();
        }
        const tracker = this.trackers.get(partition);
        if (this.stopping || tracker === undefined) return; // not counted: read again later
        const offset = Number(message.offset);
        tracker.highest = Math.max(tracker.highest, offset);
        tracker.pending.add(offset);
        this.take(message.value ?? Buffer.alloc(0), "topic", tracker, offset);
      },
    });
    const commits = setInterval(() => void this.commit(), this.o.commitIntervalMs);
    const sweeps = setInterval(() => void this.sweep(), this.o.sweepIntervalS * 1000);
    const stopped = new Promise<void>((resolve) => {
      this.wake = resolve;
      if (this.stopping) resolve();
      signal?.addEventListener("abort", () => this.stop(), { once: true });
      if (signal?.aborted) this.stop();
    });
    try {
      await stopped;
    } finally {
      clearInterval(commits);
      clearInterval(sweeps);
      await this.shutdown();
    }
  }

  /** Graceful: stop fetching, let running attempts finish (up to the shutdown timeout),
   * commit the offsets of what committed, leave the group. */
  stop(): void {
    this.stopping = true;
    this.wake?.();
  }

  private async shutdown(): Promise<void> {
    for (const timer of this.timers) clearTimeout(timer);
    this.timers.clear();
    this.consumer.pause([{ topic: this.topic }]);
    const running = Promise.allSettled([...this.active.values()]);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise((resolve) => (timer = setTimeout(resolve, this.o.shutdownTimeoutS * 1000)));
    await Promise.race([running, timeout]);
    clearTimeout(timer);
    await this.commit();
    await this.consumer.disconnect();
    if (this.ownPool) await this.pool.end();
  }

  private count(outcome: Outcome, source: Source): void {
    const key = `${outcome}/${source}`;
    this.counts.set(key, (this.counts.get(key) ?? 0) + 1);
  }

  /** A message from the topic or the sweep, queued behind its run's earlier resumes. */
  private take(value: Buffer | string, source: Source, tracker?: Tracker, offset?: number): void {
    let resume: Resume;
    try {
      resume = parseResume(value);
    } catch (error) {
      if (!(error instanceof NotAResume)) throw error;
      this.log("warn", "skipped a message that is not a resume", { source, offset });
      this.count("not_a_resume", source);
      if (tracker && offset !== undefined) tracker.pending.delete(offset);
      return;
    }
    if (this.options.accept && !this.options.accept(resume.data)) {
      this.count("filtered", source);
      if (tracker && offset !== undefined) tracker.pending.delete(offset);
      return;
    }
    const run = `${resume.data.tenant}\x1f${resume.data.run_id}`;
    const queue = this.queues.get(run);
    const item: Item = { resume, source, tracker, offset, failures: 0 };
    this.pendingCount++;
    if (queue) {
      queue.push(item);
    } else {
      this.queues.set(run, [item]);
      this.ready.push(run);
      this.pump();
    }
  }

  /** Starts attempts while there are ready runs and free slots. */
  private pump(): void {
    while (!this.stopping && this.active.size < this.o.concurrency && this.ready.length > 0) {
      const run = this.ready.shift()!;
      if (this.active.has(run)) continue;
      const attempt = this.attemptHead(run).finally(() => {
        this.active.delete(run);
        this.pump();
      });
      this.active.set(run, attempt);
    }
  }

  private later(run: string, afterS: number): void {
    const timer = setTimeout(() => {
      this.timers.delete(timer);
      this.ready.push(run);
      this.pump();
    }, afterS * 1000);
    this.timers.add(timer);
  }

  private backoff(failures: number): number {
    return Math.min(this.o.backoffS * 2 ** Math.max(0, failures - 1), this.o.backoffMaxS);
  }

  /** The run's first resume, attempted once; then the run is ready again, or waits. */
  private async attemptHead(run: string): Promise<void> {
    const queue = this.queues.get(run);
    const item = queue?.[0];
    if (!queue || !item) return;
    let retryAfterS: number | null;
    try {
      retryAfterS = await this.attempt(item);
    } catch (error) {
      this.log("error", "a resume's attempt failed unexpectedly", { error: errorText(error) });
      retryAfterS = this.backoff(++item.failures);
    }
    if (retryAfterS === null) {
      queue.shift();
      this.pendingCount--;
      if (item.source === "sweep") this.swept.delete(item.resume.data.resolution_id);
      if (item.tracker && item.offset !== undefined) item.tracker.pending.delete(item.offset);
      if (queue.length === 0) this.queues.delete(run);
      else this.ready.push(run);
    } else {
      this.later(run, retryAfterS);
    }
  }

  /** One attempt: null when the resume is done with, else the seconds before the next. */
  private async attempt(item: Item): Promise<number | null> {
    const { resume, source } = item;
    let client: pg.PoolClient;
    try {
      client = await this.pool.connect();
    } catch (error) {
      this.log("warn", "the database is away", { error: errorText(error) });
      this.count("transient", source);
      return this.backoff(1);
    }
    let broken: Error | undefined;
    let failure: unknown;
    try {
      await client.query("BEGIN");
      crashPoint("worker.before_advance");
      const answer = await advance(client, resume);
      if (answer === "behind") {
        await client.query("ROLLBACK");
        this.count("not_ready", source);
        return this.backoff(1);
      }
      if (answer === "advanced") {
        try {
          await this.handler(client, resume);
        } catch (error) {
          await client.query("ROLLBACK");
          if (error instanceof Retry) {
            this.count("not_ready", source);
            return Math.max(0, error.afterS);
          }
          if (isTransient(error)) throw error;
          failure = error;
        }
        if (failure === undefined) crashPoint("worker.in_handler");
      }
      if (failure === undefined) {
        await client.query("COMMIT");
        crashPoint("worker.after_commit");
        this.count(answer, source);
        return null;
      }
    } catch (error) {
      await client.query("ROLLBACK").catch(() => undefined);
      if (error instanceof UnverifiedResume) {
        this.log("warn", "refused a resume matcher did not commit", { source, run_id: resume.data.run_id });
        this.count("unverified", source);
        return null;
      }
      if (isTransient(error)) {
        broken = error instanceof Error ? error : new Error(String(error));
        this.log("warn", "a database error, to try again", { error: errorText(error) });
        this.count("transient", source);
        return this.backoff(1);
      }
      failure = error;
    } finally {
      client.release(broken);
    }
    return this.failed(item, failure);
  }

  /** The handler failed: its failure counted in a transaction of its own. */
  private async failed(item: Item, failure: unknown): Promise<number | null> {
    const { resume, source } = item;
    item.failures++;
    try {
      const counted = await recordWorkerFailure(this.pool, resume, errorText(failure), this.o.maxAttempts);
      this.log("warn", "the handler failed", { run_id: resume.data.run_id, attempts: counted.attempts, parked: counted.parked });
      if (counted.parked) {
        this.count("parked", source);
        return null;
      }
      this.count("failed", source);
      return this.backoff(counted.attempts);
    } catch (error) {
      if (error instanceof UnverifiedResume) {
        this.count("unverified", source);
        return null;
      }
      this.count("transient", source);
      return this.backoff(item.failures);
    }
  }

  /** Commits each partition's offset up to its lowest resume not yet done. */
  private async commit(): Promise<void> {
    const offsets: { topic: string; partition: number; offset: string }[] = [];
    for (const [partition, tracker] of this.trackers) {
      const next = tracker.pending.size > 0 ? Math.min(...tracker.pending) : tracker.highest + 1;
      if (next > tracker.committed && next > 0) offsets.push({ topic: this.topic, partition, offset: String(next) });
    }
    if (offsets.length === 0) return;
    try {
      await this.consumer.commitOffsets(offsets);
      for (const { partition, offset } of offsets) {
        const tracker = this.trackers.get(partition);
        if (tracker) tracker.committed = Math.max(tracker.committed, Number(offset));
      }
    } catch (error) {
      this.log("info", "offsets not committed (a rebalance?); committed later", { error: errorText(error) });
    }
  }

  /** The database sweep: resolutions no worker advanced, handed over as if from the topic. */
  private async sweep(): Promise<void> {
    if (this.stopping) return;
    try {
      const now = Date.now();
      const found = await unadvancedResolutions(this.pool, {
        committedBefore: new Date(now - this.o.sweepAfterS * 1000),
        committedAfter: new Date(now - this.o.sweepWindowS * 1000),
        maxRows: 100,
      });
      for (const row of found) {
        if (this.swept.has(row.resolution_id) || this.stopping) continue;
        this.swept.add(row.resolution_id);
        this.take(row.message, "sweep");
      }
    } catch (error) {
      this.log("warn", "the sweep failed; it runs again", { error: errorText(error) });
    }
  }
}

/** Runs a worker until SIGTERM or SIGINT, then shuts it down gracefully (exit code 0). */
export async function runWorker(handler: Handler, options: WorkerOptions = workerOptionsFromEnv()): Promise<void> {
  const worker = new ResumeWorker(handler, options);
  const stop = () => worker.stop();
  process.once("SIGTERM", stop);
  process.once("SIGINT", stop);
  try {
    await worker.run();
  } finally {
    process.off("SIGTERM", stop);
    process.off("SIGINT", stop);
  }
}
