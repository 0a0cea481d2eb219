/**
 * matcher's SQL worker API (docs/reference/worker-api.md), called in the caller's
 * transaction: pass the `pg` client (a `Client` or a pool's `PoolClient`) that holds it,
 * so that a run's wait commits with the run's own state, and its advance with its next
 * step, or neither does. Arguments are passed by name, as the API asks.
 */
import type { ClientBase, QueryResultRow } from "pg";

import { translate } from "./errors.js";
import type { Resume, ResumeData } from "./resume.js";

/** A `pg` client (or anything with its `query`). */
export type Queryable = Pick<ClientBase, "query">;

type Json = Record<string, unknown>;

export interface WaitCondition {
  event_types: string[];
  correlation_id: string;
  condition?: string;
}

export interface WaitSpec {
  tenant: string;
  runId: string;
  position: number;
  /** The event types that resolve the wait (not with `conditions`). */
  eventTypes?: string[];
  /** What the producer's events will carry (not with `conditions`). */
  correlationId?: string;
  /** null or absent: never. */
  deadline?: Date | null;
  externalJobId?: string;
  /** A UUID of your choosing. */
  waitId?: string;
  /** An SQL/JSON path predicate on the event's data. */
  condition?: string;
  heartbeatIntervalS?: number;
  progressTypes?: string[];
  /** Fan-in: 2 to 32 conditions, with `rule` (`all`, `any`, `at_least`) and `atLeast`. */
  conditions?: WaitCondition[];
  rule?: "all" | "any" | "at_least";
  atLeast?: number;
}

export interface LaunchSpec {
  tenant: string;
  runId: string;
  position: number;
  eventTypes: string[];
  /** A new UUID when not given. */
  correlationId?: string;
  deadline?: Date | null;
  /** `tenant:runId:position` when not given. */
  idempotencyKey?: string;
}

async function call<R extends QueryResultRow>(db: Queryable, text: string, values: unknown[]): Promise<R[]> {
  try {
    const result = await db.query<R>(text, values);
    return result.rows;
  } catch (error) {
    throw translate(error);
  }
}

async function one<T>(db: Queryable, fn: string, args: [name: string, value: unknown, cast: string][]): Promise<T> {
  const given = args.filter(([, value]) => value !== undefined);
  const list = given.map(([name, , cast], i) => `${name} => $${i + 1}::${cast}`).join(", ");
  const rows = await call<{ answer: T }>(db, `SELECT matcher.${fn}(${list}) AS answer`, given.map(([, v]) => v));
  return rows[0]!.answer;
}

function messageOf(resume: Resume | string): string {
  return typeof resume === "string" ? resume : resume.text;
}

/** Stores a wait (`waiting`) and returns it as JSON (schemas/wait.schema.json). */
export function registerWait(db: Queryable, spec: WaitSpec): Promise<Json> {
  return one<Json>(db, "register_wait_v2", [
    ["tenant", spec.tenant, "text"],
    ['"position"', spec.position, "bigint"],
    ["run_id", spec.runId, "text"],
    ["event_types", spec.eventTypes, "text[]"],
    ["correlation_id", spec.correlationId, "text"],
    ["deadline", spec.deadline ?? undefined, "timestamptz"],
    ["external_job_id", spec.externalJobId, "text"],
    ["wait_id", spec.waitId, "uuid"],
    ["condition", spec.condition, "text"],
    ["heartbeat_interval", spec.heartbeatIntervalS === undefined ? undefined : `${spec.heartbeatIntervalS} seconds`, "interval"],
    ["progress_types", spec.progressTypes, "text[]"],
    ["conditions", spec.conditions === undefined ? undefined : JSON.stringify(spec.conditions), "jsonb"],
    ["rule", spec.rule, "text"],
    ["at_least", spec.atLeast, "integer"],
  ]);
}

/** Records a launch intent and its wait, both or neither, before you call the external
 * system; a retry with the same idempotency key returns the first launch. */
export function recordLaunch(db: Queryable, spec: LaunchSpec): Promise<Json> {
  return one<Json>(db, "record_launch_v1", [
    ["tenant", spec.tenant, "text"],
    ["run_id", spec.runId, "text"],
    ['"position"', spec.position, "bigint"],
    ["event_types", spec.eventTypes, "text[]"],
    ["correlation_id", spec.correlationId, "text"],
    ["deadline", spec.deadline ?? undefined, "timestamptz"],
    ["idempotency_key", spec.idempotencyKey, "text"],
  ]);
}

/** Stores the external job's id on the launch and its wait: true when stored (or the same
 * id was), false when a different id is recorded already; `NotFound` without the launch. */
export function recordJobId(db: Queryable, launchId: string, externalJobId: string): Promise<boolean> {
  return one<boolean>(db, "record_job_id_v1", [
    ["launch_id", launchId, "uuid"],
    ["external_job_id", externalJobId, "text"],
  ]);
}

/** True when this call cancelled the wait (a `cancelled` resume follows), false when it
 * was resolved already. */
export function cancelWait(db: Queryable, waitId: string): Promise<boolean> {
  return one<boolean>(db, "cancel_wait_v1", [["wait_id", waitId, "uuid"]]);
}

/** The wait in its state now, or null. */
export function getWait(db: Queryable, waitId: string): Promise<Json | null> {
  return one<Json | null>(db, "get_wait_v1", [["wait_id", waitId, "uuid"]]);
}

/** The resume's data when the message is exactly a resume matcher committed; throws
 * `UnverifiedResume` (MR001) otherwise. Give it the message as published. */
export function verifyResume(db: Queryable, resume: Resume | string): Promise<ResumeData> {
  return one<ResumeData>(db, "verify_resume_v1", [["message", messageOf(resume), "text"]]);
}

export type AdvanceResult = "advanced" | "duplicate" | "behind";

/** Verifies the message (`UnverifiedResume` if matcher did not commit it), then moves the
 * run past the resume's position, once: `advanced` (do the next step in this transaction),
 * `duplicate` (commit, nothing to do), `behind` (roll back, try later). */
export function advance(db: Queryable, resume: Resume | string): Promise<AdvanceResult> {
  return one<AdvanceResult>(db, "advance_v1", [["message", messageOf(resume), "text"]]);
}

/** The resume matcher committed for a wait (its latest resolution, or the one named),
 * exactly as published; null when there is none (or its event left the inbox). */
export function committedResume(db: Queryable, waitId: string, resolutionId?: string): Promise<string | null> {
  return one<string | null>(db, "committed_resume_v1", [
    ["wait_id", waitId, "uuid"],
    ["resolution_id", resolutionId, "uuid"],
  ]);
}

export interface UnadvancedResolution {
  resolution_id: string;
  wait_id: string;
  tenant: string;
  run_id: string;
  position: string;
  committed_at: Date;
  /** The resume as published. */
  message: string;
}

export interface UnadvancedQuery {
  tenant?: string;
  runPrefix?: string;
  /** Default: a minute ago. */
  committedBefore?: Date;
  /** Default: 7 days ago. */
  committedAfter?: Date;
  /** Default 100. */
  maxRows?: number;
}

/** Resolutions committed in the window whose run no worker advanced past them, not parked;
 * oldest first. */
export async function unadvancedResolutions(db: Queryable, query: UnadvancedQuery = {}): Promise<UnadvancedResolution[]> {
  const args: [string, unknown, string][] = [
    ["tenant", query.tenant, "text"],
    ["run_prefix", query.runPrefix, "text"],
    ["committed_before", query.committedBefore, "timestamptz"],
    ["committed_after", query.committedAfter, "timestamptz"],
    ["max_rows", query.maxRows, "integer"],
  ];
  const given = args.filter(([, value]) => value !== undefined);
  const list = given.map(([name, , cast], i) => `${name} => $${i + 1}::${cast}`).join(", ");
  return call<UnadvancedResolution & QueryResultRow>(
    db,
    `SELECT * FROM matcher.unadvanced_resolutions_v1(${list})`,
    given.map(([, v]) => v),
  );
}

export interface WorkerFailure {
  attempts: number;
  parked: boolean;
}

/** A handler failed on this resume and its transaction rolled back: call this in a new
 * transaction. Counts the attempt, keeps the error, parks the resume after `maxAttempts`. */
export async function recordWorkerFailure(
  db: Queryable,
  resume: Resume | string,
  error: string,
  maxAttempts: number,
): Promise<WorkerFailure> {
  const rows = await call<{ attempts: number; parked: boolean }>(
    db,
    "SELECT (f).attempts, (f).parked FROM (SELECT matcher.record_worker_failure_v1(" +
      "message => $1::text, error => $2::text, max_attempts => $3::integer) AS f) AS answer",
    [messageOf(resume), error, maxAttempts],
  );
  const row = rows[0]!;
  return { attempts: Number(row.attempts), parked: row.parked };
}
