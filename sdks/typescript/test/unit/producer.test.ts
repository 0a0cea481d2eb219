import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  binaryContent,
  compactJson,
  completionEvent,
  encode,
  httpRequest,
  parseResume,
  percentDecode,
  percentEncode,
  signHttp,
  signRecord,
  SigningKey,
  NotAResume,
  type Header,
} from "../../src/index.js";

const HMAC = SigningKey.parse("k", "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=");

describe("encode", () => {
  it("keys an event by tenant, U+001F, correlation id", () => {
    const event = completionEvent({ source: "s", type: "t", tenant: "acmé", correlationId: "c-1" });
    assert.deepEqual(encode(event).key, Buffer.from("acmé\x1fc-1", "utf8"));
  });

  it("writes JSON as Python's json.dumps does (non-ASCII escaped)", () => {
    assert.equal(compactJson({ a: "é😀", b: [1, null] }), '{"a":"\\u00e9\\ud83d\\ude00","b":[1,null]}');
  });

  it("leaves out the job id when there is none", () => {
    const event = completionEvent({ source: "s", type: "t", tenant: "a", correlationId: "c", time: new Date(0) });
    const names = encode(event).headers.map(([n]) => n);
    assert.ok(!names.includes("ce_jobid"));
    assert.equal(encode(event).headers.find(([n]) => n === "ce_time")?.[1].toString(), "1970-01-01T00:00:00Z");
  });

  it("refuses an unknown key format", () => {
    assert.throws(() => SigningKey.parse("k", "secret"), /whsec_/);
    assert.throws(() => SigningKey.parse("k", "whsk_AAAA"), /32/);
  });
});

describe("signHttp", () => {
  it("percent-encodes ce- values and signs the decoded bytes, as the ingress reads them", () => {
    const event = completionEvent({
      source: "billing-svc",
      type: "job.completed",
      tenant: "acme",
      correlationId: "corr 42 % é",
      data: { rows: 1 },
      time: new Date("2025-12-31T23:59:30Z"),
      id: "evt-1",
    });
    const request = httpRequest(event, [HMAC], { timestamp: 1767225600 });
    const correlation = request.headers.find(([n]) => n === "ce-correlationid")?.[1];
    assert.equal(correlation, "corr%2042%20%25%20%C3%A9");
    assert.equal(percentDecode(correlation).toString("utf8"), "corr 42 % é");
    // The same signature as the Kafka record the ingress forwards.
    const record = encode(event);
    const signed = signRecord(record, "evt-1", [HMAC], 1767225600);
    const want = signed.headers.find(([n]) => n === "webhook-signature")?.[1].toString();
    assert.equal(request.headers.find(([n]) => n === "webhook-signature")?.[1], want);
  });

  it("signs a structured body as it is, with the body's id", () => {
    const body = Buffer.from('{"id":"e-9","specversion":"1.0"}');
    const headers = signHttp([["Content-Type", "application/cloudevents+json"], ["webhook-signature", "old"]], body, [HMAC], 5);
    assert.deepEqual(headers.map(([n]) => n), ["content-type", "webhook-id", "webhook-timestamp", "webhook-signature"]);
    assert.equal(headers[1]![1], "e-9");
  });

  it("keeps a % that starts no escape, as Python's unquote_to_bytes", () => {
    assert.equal(percentDecode("100%").toString(), "100%");
    assert.equal(percentDecode("%zz%41").toString(), "%zzA");
    assert.equal(percentEncode("a\"b"), "a%22b");
  });

  it("netstrings absent headers as empty", () => {
    const headers: Header[] = [["ce_id", Buffer.from("x")]];
    assert.equal(binaryContent(headers, Buffer.from("v")).toString(), "matcher.binary.v10:,1:x,0:,0:,0:,0:,0:,0:,v");
  });
});

describe("parseResume", () => {
  it("refuses what is not a resume", () => {
    assert.throws(() => parseResume("nope"), NotAResume);
    assert.throws(() => parseResume('{"type":"matcher.resume","data":{}}'), NotAResume);
  });
});
