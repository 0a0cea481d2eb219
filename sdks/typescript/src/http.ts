/**
 * CloudEvents over HTTP, signed as matcher's webhook ingress (`POST /v1/webhooks/{producer}`)
 * verifies them.
 *
 * - structured mode (`content-type: application/cloudevents+json`): the signed content is
 *   the body, exactly as any Standard Webhooks library signs it;
 * - binary mode: the ingress turns each `ce-<attr>` header into the Kafka record's
 *   `ce_<attr>` with its value percent-decoded (CloudEvents HTTP binding, 3.1.3.2), and the
 *   signature covers that record's binary content: `matcher.binary.v1`, then a netstring of
 *   each of the percent-decoded values of ce-source, ce-id, ce-type, ce-tenant,
 *   ce-correlationid, ce-jobid, ce-time and of content-type, then the body.
 *
 * `webhook-id` is the event's id in both modes.
 */
import type { CompletionEvent, Header } from "./event.js";
import { attributes, compactJson, encode } from "./event.js";
import type { SigningKey } from "./signing.js";
import { isStructured, signRecord } from "./signing.js";

export type HttpHeaders = [name: string, value: string][];

export interface HttpRequest {
  headers: HttpHeaders;
  body: Buffer;
}

/** Percent-encodes a ce- header value as the CloudEvents HTTP binding asks: space, `"`,
 * `%` and every byte outside printable ASCII (UTF-8 first). */
export function percentEncode(value: string): string {
  let out = "";
  for (const byte of Buffer.from(value, "utf8")) {
    const printable = byte > 0x20 && byte < 0x7f && byte !== 0x22 && byte !== 0x25;
    out += printable ? String.fromCharCode(byte) : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

/** The bytes of a percent-encoded value (as Python's `unquote_to_bytes`: a `%` not followed
 * by two hex digits stays as it is). */
export function percentDecode(value: string): Buffer {
  const raw = Buffer.from(value, "utf8");
  const out: number[] = [];
  for (let i = 0; i < raw.length; i++) {
    const byte = raw[i]!;
    if (byte === 0x25 && /^[0-9A-Fa-f]{2}$/.test(raw.subarray(i + 1, i + 3).toString("latin1"))) {
      out.push(parseInt(raw.subarray(i + 1, i + 3).toString("latin1"), 16));
      i += 2;
    } else {
      out.push(byte);
    }
  }
  return Buffer.from(out);
}

function isWebhook(name: string): boolean {
  const lower = name.toLowerCase();
  return lower.startsWith("webhook-") || lower.startsWith("svix-");
}

function asKafkaHeader(name: string, value: string): Header {
  if (name.startsWith("ce-")) return [`ce_${name.slice(3)}`, percentDecode(value)];
  return [name, Buffer.from(value, "latin1")];
}

function structuredId(body: Buffer): string {
  const document: unknown = JSON.parse(body.toString("utf8"));
  if (document !== null && typeof document === "object" && !Array.isArray(document)) {
    const id = (document as Record<string, unknown>).id;
    if (typeof id === "string") return id;
  }
  return "";
}

/** `headers` (without any webhook-* or svix-*) and the three Standard Webhooks headers. */
export function signHttp(
  headers: Iterable<readonly [string, string]>,
  body: Buffer,
  keys: readonly SigningKey[],
  timestamp?: number,
): HttpHeaders {
  const given: HttpHeaders = [];
  for (const [name, value] of headers) if (!isWebhook(name)) given.push([name.toLowerCase(), value]);
  const recordHeaders = given.map(([name, value]) => asKafkaHeader(name, value));
  let eventId: string;
  if (isStructured(recordHeaders)) {
    eventId = structuredId(body);
  } else {
    const found = recordHeaders.filter(([name]) => name === "ce_id").pop();
    eventId = found ? found[1].toString("utf8") : "";
  }
  if (!eventId) throw new Error("the event has no id (ce-id, or id in the structured body)");
  const signed = signRecord({ key: Buffer.alloc(0), headers: recordHeaders, value: body }, eventId, keys, timestamp);
  const webhook: HttpHeaders = signed.headers
    .filter(([name]) => name.startsWith("webhook-"))
    .map(([name, value]) => [name, value.toString("latin1")]);
  return [...given, ...webhook];
}

/** An event as an HTTP request for the ingress, signed: binary mode (ce- headers,
 * percent-encoded) or structured mode. */
export function httpRequest(
  event: CompletionEvent,
  keys: readonly SigningKey[],
  options: { structured?: boolean; timestamp?: number } = {},
): HttpRequest {
  if (options.structured) {
    const record = encode(event, { structured: true });
    const headers = signHttp([["content-type", "application/cloudevents+json"]], record.value, keys, options.timestamp);
    return { headers, body: record.value };
  }
  const unsigned: HttpHeaders = attributes(event).map(([name, value]) => [`ce-${name}`, percentEncode(value)]);
  unsigned.push(["content-type", "application/json"]);
  const body = Buffer.from(compactJson(event.data), "utf8");
  return { headers: signHttp(unsigned, body, keys, options.timestamp), body };
}

/** POSTs a signed event to the ingress (`{ingress}/v1/webhooks/{producer}`); resolves to
 * the response, whatever its status (2xx: accepted). */
export async function postEvent(
  ingress: string,
  producer: string,
  event: CompletionEvent,
  keys: readonly SigningKey[],
  options: { structured?: boolean; signal?: AbortSignal } = {},
): Promise<Response> {
  const request = httpRequest(event, keys, { structured: options.structured ?? false });
  const url = `${ingress.replace(/\/+$/, "")}/v1/webhooks/${encodeURIComponent(producer)}`;
  return fetch(url, {
    method: "POST",
    headers: request.headers,
    body: request.body,
    signal: options.signal ?? AbortSignal.timeout(30_000),
  });
}
