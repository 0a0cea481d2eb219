"""The resume worker's metrics (Prometheus' default registry, so that a worker embedded
in an application exports them with the application's own). Labels take fixed values."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# What became of each resume a worker took (one per attempt for retried and failed).
OUTCOMES = (
    "advanced",  # the run advanced and the handler's writes committed
    "duplicate",  # the run was past it already (a redelivery)
    "not_ready",  # the handler asked for a retry, or an earlier resume is pending
    "transient",  # the database was away: retried, not counted against the resume
    "failed",  # the handler failed (an attempt counted)
    "parked",  # failed past the attempts, or not ready past the limit
    "unverified",  # not a resume matcher committed: dropped
    "not_a_resume",  # not a matcher.resume message at all: skipped
    "filtered",  # another application's (tenant, run prefix, predicate): skipped
)

RESUMES = Counter(
    "matcher_worker_resumes_total",
    "Resumes a worker took, by what became of them (retried ones once per attempt).",
    ["outcome", "source"],
)
for _outcome in OUTCOMES:
    for _source in ("topic", "sweep"):
        RESUMES.labels(_outcome, _source)
HANDLER_SECONDS = Histogram(
    "matcher_worker_handler_duration_seconds",
    "One attempt: the advance, the handler and the commit, in one transaction (of its "
    "batch, when resumes shared one).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
BATCH_SIZE = Histogram(
    "matcher_worker_batch_size",
    "Resumes attempted in one transaction.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000),
)
IN_FLIGHT = Gauge("matcher_worker_in_flight", "Attempts running now.")
WAITING = Gauge(
    "matcher_worker_waiting_retry",
    "Runs whose resume waits to be tried again (not ready, or failed and backing off).",
)
SWEPT = Counter(
    "matcher_worker_swept_total",
    "Resolutions the database sweep found that no worker had advanced.",
)
