/** Resume messages (schemas/resume.schema.json): what matcher publishes on the resume topic. */

export type Outcome = "event" | "timeout" | "cancelled";

export interface ResumeEvent {
  source: string;
  id: string;
  type: string;
  data: unknown;
  occurred_at?: string | null;
  received_at?: string;
  external_job_id?: string | null;
  [key: string]: unknown;
}

/** A resume's `data`, as `matcher.verify_resume_v1` returns it. Keys are the wire's. */
export interface ResumeData {
  resolution_id: string;
  tenant: string;
  run_id: string;
  position: number;
  outcome: Outcome;
  wait_id: string;
  correlation_id: string;
  event_types: string[];
  created_at: string;
  resolved_at: string;
  deadline?: string | null;
  event?: ResumeEvent | null;
  events?: ResumeEvent[] | null;
  needed?: number | null;
  timeout_reason?: "heartbeat" | null;
  last_progress_at?: string | null;
  [key: string]: unknown;
}

export interface ResumeMessage {
  specversion: "1.0";
  id: string;
  source: "matcher";
  type: "matcher.resume";
  subject: string;
  time: string;
  tenant: string;
  datacontenttype?: string;
  traceparent?: string | null;
  data: ResumeData;
}

/** A resume as received: its parsed content and its text exactly as published (which is
 * what the worker API verifies, byte for byte: never re-encode it). */
export interface Resume {
  readonly text: string;
  readonly message: ResumeMessage;
  readonly data: ResumeData;
}

export class NotAResume extends Error {
  override readonly name = "NotAResume";
}

/** Parses a resume topic message (its value's bytes or text). Unverified: the worker
 * verifies it in the transaction that advances the run. */
export function parseResume(value: Buffer | string): Resume {
  const text = typeof value === "string" ? value : value.toString("utf8");
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new NotAResume("not JSON");
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) throw new NotAResume("not an object");
  const message = parsed as Partial<ResumeMessage>;
  const data = message.data;
  if (
    message.type !== "matcher.resume" ||
    data === null ||
    typeof data !== "object" ||
    typeof data.run_id !== "string" ||
    typeof data.tenant !== "string" ||
    typeof data.position !== "number" ||
    typeof data.resolution_id !== "string" ||
    typeof data.wait_id !== "string"
  ) {
    throw new NotAResume("not a matcher.resume with its run, position and resolution");
  }
  return { text, message: message as ResumeMessage, data };
}
