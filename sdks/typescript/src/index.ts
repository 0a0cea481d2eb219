export * from "./event.js";
export * from "./signing.js";
export * from "./http.js";
export * from "./publisher.js";
export * from "./errors.js";
export * from "./resume.js";
export * from "./worker-api.js";
export { ResumeWorker, Retry, runWorker, workerOptionsFromEnv, isTransient } from "./worker.js";
export type { Handler, Logger, LogLevel, WorkerOptions, Outcome as WorkerOutcome } from "./worker.js";
