/**
 * Test-only crash points, as matcher's own: `MATCHER_TEST_CRASH_AT=point[@n][,point[@n]...]`
 * makes the n-th arrival (default: the first) at `point` SIGKILL this process (no cleanup,
 * no flush, what a power cut does). Unset, as always outside tests, it costs one lookup.
 */
export const CRASH_POINTS = [
  "worker.before_advance", // a transaction begun, the run not advanced
  "worker.in_handler", // advanced and the handler's writes done, not committed
  "worker.after_commit", // committed, the resume's offset not committed
] as const;

export type CrashPoint = (typeof CRASH_POINTS)[number];

function parse(spec: string): Map<string, number> {
  const armed = new Map<string, number>();
  for (const item of spec.split(",").map((part) => part.trim()).filter(Boolean)) {
    const [name = "", count = "1"] = item.split("@", 2);
    if (!(CRASH_POINTS as readonly string[]).includes(name)) {
      throw new Error(`unknown crash point ${JSON.stringify(name)}; known: ${CRASH_POINTS.join(", ")}`);
    }
    armed.set(name, Number.parseInt(count, 10));
  }
  return armed;
}

const armed = parse(process.env.MATCHER_TEST_CRASH_AT ?? "");

export function crashPoint(name: CrashPoint): void {
  const remaining = armed.get(name);
  if (remaining === undefined) return;
  if (remaining > 1) {
    armed.set(name, remaining - 1);
    return;
  }
  process.stderr.write(`matcher: test crash point ${name} reached; killing the process\n`);
  process.kill(process.pid, "SIGKILL");
}
