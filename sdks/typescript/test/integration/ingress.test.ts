// Against a running webhook ingress (MATCHER_TEST_INGRESS) whose producer ce-svc has the
// HMAC key MATCHER_TEST_SIGNING_KEY: postEvent in both modes is accepted (202); signed with
// another key, refused (401). The pytest driver checks that the runs were resumed.
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { completionEvent, postEvent, SigningKey } from "../../src/index.js";
import { env } from "./env.js";

const ingress = () => env("MATCHER_TEST_INGRESS");
const key = () => SigningKey.parse("k1", env("MATCHER_TEST_SIGNING_KEY"));

function event(correlationId: string) {
  return completionEvent({
    source: "ce-svc",
    type: "job.completed",
    tenant: "acme",
    correlationId,
    data: { status: "succeeded", note: "été" },
  });
}

describe("postEvent to the webhook ingress", () => {
  it("is accepted in binary mode, percent-encoded attributes and all", async () => {
    const answer = await postEvent(ingress(), "ce-svc", event("ts-http é 1"), [key()]);
    assert.equal(answer.status, 202, await answer.text());
  });

  it("is accepted in structured mode", async () => {
    const answer = await postEvent(ingress(), "ce-svc", event("ts-http-2"), [key()], { structured: true });
    assert.equal(answer.status, 202, await answer.text());
  });

  it("is refused when signed with a key the producer does not have", async () => {
    const other = SigningKey.parse("k1", "whsec_" + Buffer.from("not-the-producers-key-0123456789").toString("base64"));
    const answer = await postEvent(ingress(), "ce-svc", event("ts-http-3"), [other]);
    assert.equal(answer.status, 401);
    assert.equal(((await answer.json()) as { reason: string }).reason, "bad_signature");
  });
});
