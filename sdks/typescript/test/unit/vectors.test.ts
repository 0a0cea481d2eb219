// The shared signature vectors (schemas/signature-vectors.json): the same signed bytes and
// the same signatures as matcher verifies and the Python producer makes.
import assert from "node:assert/strict";
import { createPublicKey, timingSafeEqual, createHmac, verify } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";

import { completionEvent, encode, signedBytes, signRecord, SigningKey, type Header, type KafkaRecord } from "../../src/index.js";

interface Case {
  name: string;
  mode: "binary" | "structured";
  scheme: "hmac-sha256" | "ed25519";
  signing_key: string;
  verifying_key: string;
  kafka_key_utf8: string;
  headers: [string, string][];
  value_utf8: string;
  webhook_id: string;
  webhook_timestamp: string;
  signed_bytes_base64: string;
  webhook_signature: string;
}

const VECTORS = process.env.MATCHER_SIGNATURE_VECTORS ?? new URL("../../../../../schemas/signature-vectors.json", import.meta.url);
const cases = (JSON.parse(readFileSync(VECTORS, "utf8")) as { cases: Case[] }).cases;

function recordOf(c: Case): KafkaRecord {
  return {
    key: Buffer.from(c.kafka_key_utf8, "utf8"),
    headers: c.headers.map(([name, value]): Header => [name, Buffer.from(value, "utf8")]),
    value: Buffer.from(c.value_utf8, "utf8"),
  };
}

function header(record: KafkaRecord, name: string): string | undefined {
  return record.headers.find(([n]) => n === name)?.[1].toString("utf8");
}

/** What matcher does with the verifying key. */
function verifies(c: Case, message: Buffer, signature: string): boolean {
  const [version, encoded = ""] = signature.split(",", 2);
  const given = Buffer.from(encoded, "base64");
  if (version === "v1" && c.verifying_key.startsWith("whsec_")) {
    const expected = createHmac("sha256", Buffer.from(c.verifying_key.slice(6), "base64")).update(message).digest();
    return expected.length === given.length && timingSafeEqual(expected, given);
  }
  if (version === "v1a" && c.verifying_key.startsWith("whpk_")) {
    const raw = Buffer.from(c.verifying_key.slice(5), "base64");
    const spki = Buffer.concat([Buffer.from("302a300506032b6570032100", "hex"), raw]);
    return verify(null, message, createPublicKey({ key: spki, format: "der", type: "spki" }), given);
  }
  return false;
}

describe("signature vectors", () => {
  assert.ok(cases.length >= 4, "the vectors file lost its cases");
  for (const c of cases) {
    describe(c.name, () => {
      it("builds the same signed bytes", () => {
        const signed = signedBytes(recordOf(c), c.webhook_id, c.webhook_timestamp);
        assert.equal(signed.toString("base64"), c.signed_bytes_base64);
      });

      it("makes the same signature, which the verifying key accepts", () => {
        const key = SigningKey.parse("k", c.signing_key);
        const signed = signRecord(recordOf(c), c.webhook_id, [key], Number(c.webhook_timestamp));
        assert.equal(header(signed, "webhook-signature"), c.webhook_signature);
        assert.equal(header(signed, "webhook-id"), c.webhook_id);
        assert.equal(header(signed, "webhook-timestamp"), c.webhook_timestamp);
        const message = Buffer.from(c.signed_bytes_base64, "base64");
        assert.ok(verifies(c, message, c.webhook_signature));
        assert.ok(!verifies(c, Buffer.concat([message, Buffer.from(" ")]), c.webhook_signature));
      });

      it("encodes the same record from the event", () => {
        const attrs = Object.fromEntries(
          c.mode === "binary"
            ? c.headers.filter(([n]) => n.startsWith("ce_")).map(([n, v]) => [n.slice(3), v])
            : Object.entries(JSON.parse(c.value_utf8) as Record<string, string>),
        ) as Record<string, string>;
        const data: unknown = c.mode === "binary" ? JSON.parse(c.value_utf8) : (JSON.parse(c.value_utf8) as { data: unknown }).data;
        const event = completionEvent({
          source: attrs.source!,
          type: attrs.type!,
          tenant: attrs.tenant!,
          correlationId: attrs.correlationid!,
          jobId: attrs.jobid,
          id: attrs.id,
          time: new Date(attrs.time!),
          data,
        });
        const record = encode(event, { structured: c.mode === "structured" });
        assert.equal(record.key.toString("utf8"), c.kafka_key_utf8);
        assert.deepEqual(
          record.headers.map(([n, v]) => [n, v.toString("utf8")]),
          c.headers,
        );
        assert.equal(record.value.toString("utf8"), c.value_utf8);
      });
    });
  }
});
