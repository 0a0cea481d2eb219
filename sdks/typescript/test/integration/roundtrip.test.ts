// Against a running matcher (daemon, signatures required, the producer billing-svc with
// the HMAC key MATCHER_TEST_SIGNING_KEY): the TypeScript producer, the worker API and the
// resume worker, end to end.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, it } from "node:test";

import { Kafka, Partitioners, type Producer } from "kafkajs";

import {
  advance,
  cancelWait,
  committedResume,
  completionEvent,
  encode,
  EventPublisher,
  InvalidArgument,
  NotFound,
  recordJobId,
  recordLaunch,
  registerWait,
  ResumeWorker,
  signRecord,
  SigningKey,
  UnverifiedResume,
  verifyResume,
  type Resume,
} from "../../src/index.js";
import { BOOTSTRAP, DATABASE_URL, env, EVENTS_TOPIC, eventually, inTransaction, RESUME_TOPIC, scalar } from "./env.js";

const KEY = () => SigningKey.parse("k1", env("MATCHER_TEST_SIGNING_KEY"));
const TYPES = ["job.completed", "job.failed"];

function quickWorker(handled: Resume[], group = `ts-${randomUUID().slice(0, 8)}`): ResumeWorker {
  return new ResumeWorker(
    async (tx, resume) => {
      await tx.query("INSERT INTO ts_steps (run_id, resolution_id, outcome) VALUES ($1, $2, $3)", [
        resume.data.run_id,
        resume.data.resolution_id,
        resume.data.outcome,
      ]);
      handled.push(resume);
    },
    {
      bootstrapServers: BOOTSTRAP(),
      databaseUrl: DATABASE_URL(),
      resumeTopic: RESUME_TOPIC(),
      group,
      backoffS: 0.05,
      backoffMaxS: 0.5,
      sweepIntervalS: 0.5,
      commitIntervalMs: 100,
      sessionTimeoutMs: 6000,
      heartbeatIntervalMs: 500,
    },
  );
}

async function steps(runId: string): Promise<number> {
  return Number(await scalar<string>("SELECT count(*) FROM ts_steps WHERE run_id = $1", [runId]));
}

describe("the TypeScript SDK against matcher", () => {
  let raw: Producer;

  before(async () => {
    await inTransaction(async (db) => {
      await db.query("CREATE TABLE IF NOT EXISTS ts_steps (run_id text, resolution_id uuid, outcome text)");
    });
    raw = new Kafka({ clientId: "ts-test", brokers: BOOTSTRAP().split(","), logLevel: 1 }).producer({
      createPartitioner: Partitioners.DefaultPartitioner,
    });
    await raw.connect();
  });

  after(async () => {
    await raw.disconnect();
  });

  it("refuses arguments and unknown launches with the API's SQLSTATEs", async () => {
    await assert.rejects(
      inTransaction((db) => registerWait(db, { tenant: " ", runId: "r", position: 0, eventTypes: TYPES, correlationId: "c" })),
      InvalidArgument,
    );
    await assert.rejects(inTransaction((db) => recordJobId(db, randomUUID(), "job-1")), NotFound);
  });

  it("publishes signed events that resume runs, each advanced exactly once", async () => {
    const tag = randomUUID().slice(0, 8);
    const binary = { run: `ts-run-bin-${tag}`, correlation: `ts-bin-${tag}` };
    const structured = { run: `ts-run-str-${tag}`, correlation: `ts-str-${tag}` };
    const launched = { run: `ts-run-launch-${tag}` };
    // The waits, with the run's own state, in one transaction.
    const launch = await inTransaction(async (db) => {
      for (const w of [binary, structured]) {
        await registerWait(db, { tenant: "acme", runId: w.run, position: 0, eventTypes: TYPES, correlationId: w.correlation });
      }
      return recordLaunch(db, { tenant: "acme", runId: launched.run, position: 0, eventTypes: TYPES });
    });
    assert.equal(typeof launch.correlation_id, "string");
    assert.equal(await inTransaction((db) => recordJobId(db, String(launch.id), "ext-1")), true);

    for (const [wait, mode] of [[binary, false], [structured, true]] as const) {
      const publisher = new EventPublisher({ bootstrapServers: BOOTSTRAP(), topic: EVENTS_TOPIC(), keys: KEY(), structured: mode, kafka: { logLevel: 1 } });
      await publisher.connect();
      try {
        await publisher.publish(
          completionEvent({ source: "billing-svc", type: "job.completed", tenant: "acme", correlationId: wait.correlation, data: { rows: 7 }, jobId: "job-7" }),
        );
      } finally {
        await publisher.disconnect();
      }
    }
    const cancelled = await inTransaction((db) => cancelWait(db, String(launch.wait_id)));
    assert.equal(cancelled, true);

    const handled: Resume[] = [];
    const worker = quickWorker(handled);
    const running = worker.run();
    try {
      await eventually(
        async () => (await steps(binary.run)) + (await steps(structured.run)) + (await steps(launched.run)) === 3,
        "the three runs handled",
      );
    } finally {
      worker.stop();
      await running;
    }
    const outcomes = Object.fromEntries(handled.map((r) => [r.data.run_id, r.data.outcome]));
    assert.deepEqual(outcomes, { [binary.run]: "event", [structured.run]: "event", [launched.run]: "cancelled" });
    const byEvent = handled.find((r) => r.data.run_id === binary.run)!;
    assert.deepEqual(byEvent.data.event?.data, { rows: 7 });
    for (const run of [binary.run, structured.run, launched.run]) {
      assert.equal(Number(await scalar<string>("SELECT version FROM matcher.runs WHERE tenant = 'acme' AND run_id = $1", [run])), 1);
    }

    // Every resume again, to a worker of another group: all duplicates, no handler call.
    const again: Resume[] = [];
    const second = quickWorker(again);
    const secondRun = second.run();
    try {
      await eventually(() => (second.counts.get("duplicate/topic") ?? 0) >= 3, "the redeliveries seen as duplicates");
    } finally {
      second.stop();
      await secondRun;
    }
    assert.equal(again.length, 0);
    for (const run of [binary.run, structured.run, launched.run]) assert.equal(await steps(run), 1);

    // What matcher committed verifies, as published, and advancing it again is a duplicate.
    const text = await inTransaction((db) => committedResume(db, byEvent.data.wait_id));
    assert.equal(text, byEvent.text);
    const data = await inTransaction((db) => verifyResume(db, byEvent));
    assert.equal(data.resolution_id, byEvent.data.resolution_id);
    assert.equal(await inTransaction((db) => advance(db, byEvent)), "duplicate");
  });

  it("refuses a forged resume (MR001), in the API and in the worker", async () => {
    const tag = randomUUID().slice(0, 8);
    const run = `ts-run-forged-${tag}`;
    const wait = await inTransaction((db) =>
      registerWait(db, { tenant: "acme", runId: run, position: 0, eventTypes: TYPES, correlationId: `ts-forged-${tag}` }),
    );
    await inTransaction((db) => cancelWait(db, String(wait.id)));
    let genuine: string | null = null;
    await eventually(async () => (genuine = await inTransaction((db) => committedResume(db, String(wait.id)))) !== null, "the resume committed");
    const other = (text: string) => text.replace(/"run_id"( ?): ?"([^"]*)"/, '"run_id"$1: "$2-other"');
    assert.notEqual(other(genuine!), genuine);
    const forged = genuine!.replace(/"outcome"( ?): ?"cancelled"/, '"outcome"$1: "event"');
    assert.notEqual(forged, genuine);
    await assert.rejects(inTransaction((db) => advance(db, forged)), UnverifiedResume);
    await assert.rejects(inTransaction((db) => verifyResume(db, forged)), UnverifiedResume);
    // Re-encoded (whitespace), it is refused too: the message must be as published.
    await assert.rejects(inTransaction((db) => verifyResume(db, JSON.stringify(JSON.parse(genuine!), null, 1))), UnverifiedResume);

    // On the topic, the worker skips it and counts it; the run is not advanced by it.
    await raw.send({ topic: RESUME_TOPIC(), messages: [{ key: `${run}-other`, value: other(genuine!) }] });
    const handled: Resume[] = [];
    const worker = quickWorker(handled);
    const running = worker.run();
    try {
      await eventually(() => (worker.counts.get("unverified/topic") ?? 0) >= 1, "the forged resume refused");
      await eventually(async () => (await steps(run)) === 1, "the genuine resume handled");
    } finally {
      worker.stop();
      await running;
    }
    assert.equal(handled.filter((r) => r.data.run_id === `${run}-other`).length, 0);
    assert.equal(await steps(`${run}-other`), 0);
  });

  it("has a tampered event quarantined, not matched", async () => {
    const tag = randomUUID().slice(0, 8);
    const run = `ts-run-tampered-${tag}`;
    const correlation = `ts-tampered-${tag}`;
    await inTransaction((db) => registerWait(db, { tenant: "acme", runId: run, position: 0, eventTypes: TYPES, correlationId: correlation }));
    const event = completionEvent({ source: "billing-svc", type: "job.completed", tenant: "acme", correlationId: `${correlation}-x`, data: { rows: 1 } });
    const signed = signRecord(encode(event), event.id, [KEY()]);
    // A header changed after signing: the event now claims the waiting run's correlation id.
    const headers = Object.fromEntries(
      signed.headers.map(([name, value]) => [name, name === "ce_correlationid" ? Buffer.from(correlation) : value]),
    );
    await raw.send({ topic: EVENTS_TOPIC(), messages: [{ key: signed.key, value: signed.value, headers }] });
    await eventually(
      async () => (await scalar<string | null>("SELECT reason FROM matcher.quarantine WHERE event_id = $1", [event.id])) === "bad_signature",
      "the tampered event quarantined as bad_signature",
    );
    assert.equal(await scalar<string>("SELECT state FROM matcher.waits WHERE run_id = $1", [run]), "waiting");
  });
});
