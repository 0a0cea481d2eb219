/**
 * Standard Webhooks signatures for Kafka records, as matcher verifies them
 * (schemas/signatures.md).
 *
 * Signed bytes: `{webhook-id}.{webhook-timestamp}.{content}` where content is the Kafka
 * value in structured mode, and in binary mode `matcher.binary.v1`, then a netstring
 * (`<length>:<bytes>,`) of each of the headers ce_source, ce_id, ce_type, ce_tenant,
 * ce_correlationid, ce_jobid, ce_time and content-type (empty when absent), then the value.
 */
import { createHmac, createPrivateKey, sign as edSign, type KeyObject } from "node:crypto";

import type { Header, KafkaRecord } from "./event.js";

export const BINARY_PREFIX = Buffer.from("matcher.binary.v1");
export const BINARY_HEADERS = [
  "ce_source",
  "ce_id",
  "ce_type",
  "ce_tenant",
  "ce_correlationid",
  "ce_jobid",
  "ce_time",
  "content-type",
] as const;

// PKCS#8 DER of an Ed25519 private key, before its 32-byte seed (RFC 8410).
const ED25519_PKCS8_PREFIX = Buffer.from("302e020100300506032b657004220420", "hex");

function b64decode(text: string): Buffer {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text)) throw new Error("a key's base64 is malformed");
  return Buffer.from(text, "base64");
}

/** A producer's signing key: `whsec_<base64>` (HMAC-SHA256 secret) or `whsk_<base64>`
 * (an Ed25519 secret key: the 32-byte seed, or the 64-byte seed + public key form). */
export class SigningKey {
  private constructor(
    readonly id: string,
    private readonly hmacSecret: Buffer | null,
    private readonly ed25519: KeyObject | null,
  ) {}

  static parse(id: string, text: string): SigningKey {
    const trimmed = text.trim();
    if (trimmed.startsWith("whsec_")) {
      const secret = b64decode(trimmed.slice("whsec_".length));
      if (secret.length === 0) throw new Error("empty HMAC secret");
      return new SigningKey(id, secret, null);
    }
    if (trimmed.startsWith("whsk_")) {
      const raw = b64decode(trimmed.slice("whsk_".length));
      if (raw.length !== 32 && raw.length !== 64) {
        throw new Error("an Ed25519 secret key holds 32 (or 64) bytes");
      }
      const der = Buffer.concat([ED25519_PKCS8_PREFIX, raw.subarray(0, 32)]);
      return new SigningKey(id, null, createPrivateKey({ key: der, format: "der", type: "pkcs8" }));
    }
    throw new Error("a key starts with whsec_ (HMAC) or whsk_ (Ed25519)");
  }

  /** One `webhook-signature` entry: `v1,<base64 HMAC-SHA256>` or `v1a,<base64 Ed25519>`. */
  sign(message: Buffer): string {
    if (this.hmacSecret !== null) {
      return `v1,${createHmac("sha256", this.hmacSecret).update(message).digest("base64")}`;
    }
    if (this.ed25519 === null) throw new Error("a key without material");
    return `v1a,${edSign(null, message, this.ed25519).toString("base64")}`;
  }
}

function netstring(value: Buffer): Buffer {
  return Buffer.concat([Buffer.from(`${value.length}:`), value, Buffer.from(",")]);
}

function headerValue(headers: readonly Header[], name: string): Buffer | undefined {
  let found: Buffer | undefined;
  for (const [key, value] of headers) if (key === name) found = value; // the last, as a dict keeps it
  return found;
}

/** The signed content of a binary-mode record. */
export function binaryContent(headers: readonly Header[], value: Buffer): Buffer {
  return Buffer.concat([
    BINARY_PREFIX,
    ...BINARY_HEADERS.map((name) => netstring(headerValue(headers, name) ?? Buffer.alloc(0))),
    value,
  ]);
}

/** Structured mode is exactly the media type application/cloudevents+json. */
export function isStructured(headers: readonly Header[]): boolean {
  const contentType = headerValue(headers, "content-type")?.toString("latin1") ?? "";
  return contentType.split(";", 1)[0]!.trim().toLowerCase() === "application/cloudevents+json";
}

/** The bytes a signature covers: `{id}.{timestamp}.{content}`. */
export function signedBytes(record: KafkaRecord, eventId: string, timestamp: string): Buffer {
  const content = isStructured(record.headers) ? record.value : binaryContent(record.headers, record.value);
  return Buffer.concat([Buffer.from(`${eventId}.${timestamp}.`, "utf8"), content]);
}

/** The record with webhook-id, webhook-timestamp and webhook-signature headers (any there
 * before are replaced); one signature per key (sign with the old and the new key while
 * rotating). `timestamp`: Unix seconds, now when not given. */
export function signRecord(
  record: KafkaRecord,
  eventId: string,
  keys: readonly SigningKey[],
  timestamp?: number,
): KafkaRecord {
  if (keys.length === 0) throw new Error("no signing key");
  const stamp = String(timestamp ?? Math.floor(Date.now() / 1000));
  const message = signedBytes(record, eventId, stamp);
  const signature = keys.map((key) => key.sign(message)).join(" ");
  const headers: Header[] = record.headers.filter(([name]) => !name.startsWith("webhook-"));
  headers.push(
    ["webhook-id", Buffer.from(eventId, "utf8")],
    ["webhook-timestamp", Buffer.from(stamp)],
    ["webhook-signature", Buffer.from(signature)],
  );
  return { ...record, headers };
}
