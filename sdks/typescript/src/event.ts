/** Completion events as CloudEvents 1.0 in the Kafka protocol binding (binary or structured mode). */
import { randomUUID } from "node:crypto";

export interface CompletionEventInit {
  /** The producer, as registered with matcher. */
  source: string;
  /** The event's type, e.g. `job.completed`. */
  type: string;
  tenant: string;
  /** What the waiting run registered. */
  correlationId: string;
  /** JSON-serialisable. */
  data?: unknown;
  /** The external job's id (several events may share it). */
  jobId?: string;
  /** Unique per source; a new UUID when not given. */
  id?: string;
  /** When it happened; now when not given. */
  time?: Date;
}

export interface CompletionEvent {
  readonly source: string;
  readonly type: string;
  readonly tenant: string;
  readonly correlationId: string;
  readonly data: unknown;
  readonly jobId: string | undefined;
  readonly id: string;
  readonly time: Date;
}

export type Header = readonly [name: string, value: Buffer];

export interface KafkaRecord {
  readonly key: Buffer;
  readonly headers: readonly Header[];
  readonly value: Buffer;
}

export const KEY_SEPARATOR = "\x1f";

export function completionEvent(init: CompletionEventInit): CompletionEvent {
  return {
    source: init.source,
    type: init.type,
    tenant: init.tenant,
    correlationId: init.correlationId,
    data: init.data ?? null,
    jobId: init.jobId,
    id: init.id ?? randomUUID(),
    time: init.time ?? new Date(),
  };
}

/** The Kafka key of an event: tenant, U+001F, correlation id, in UTF-8; so one wait's
 * events keep their order on one partition. */
export function eventKey(tenant: string, correlationId: string): Buffer {
  return Buffer.from(`${tenant}${KEY_SEPARATOR}${correlationId}`, "utf8");
}

/** RFC 3339 in UTC with a `Z` (milliseconds when there are any). */
export function rfc3339(time: Date): string {
  const text = time.toISOString();
  return text.endsWith(".000Z") ? `${text.slice(0, -5)}Z` : text;
}

/** The CloudEvent attributes of an event, in the order the Python producer writes them. */
export function attributes(event: CompletionEvent): [string, string][] {
  const attrs: [string, string][] = [
    ["specversion", "1.0"],
    ["id", event.id],
    ["source", event.source],
    ["type", event.type],
    ["tenant", event.tenant],
    ["correlationid", event.correlationId],
    ["time", rfc3339(event.time)],
  ];
  if (event.jobId !== undefined) attrs.push(["jobid", event.jobId]);
  return attrs;
}

/** Compact JSON with every character outside ASCII escaped (`\uXXXX`), as Python's
 * `json.dumps(..., separators=(",", ":"))` writes it, so both SDKs send the same bytes. */
export function compactJson(value: unknown): string {
  const text = JSON.stringify(value ?? null);
  if (text === undefined) throw new TypeError("the event's data is not JSON-serialisable");
  return text.replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

export interface EncodeOptions {
  /** Structured mode: the whole CloudEvent as the value (`application/cloudevents+json`). */
  structured?: boolean;
}

/** The unsigned Kafka record of an event. */
export function encode(event: CompletionEvent, options: EncodeOptions = {}): KafkaRecord {
  const key = eventKey(event.tenant, event.correlationId);
  if (options.structured) {
    const envelope: Record<string, unknown> = Object.fromEntries(attributes(event));
    envelope.datacontenttype = "application/json";
    envelope.data = event.data;
    return {
      key,
      headers: [["content-type", Buffer.from("application/cloudevents+json")]],
      value: Buffer.from(compactJson(envelope), "utf8"),
    };
  }
  const headers: Header[] = attributes(event).map(([name, value]) => [`ce_${name}`, Buffer.from(value, "utf8")]);
  headers.push(["content-type", Buffer.from("application/json")]);
  return { key, headers, value: Buffer.from(compactJson(event.data), "utf8") };
}
