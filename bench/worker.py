"""The resume worker in the benchmark: its throughput (resumes advanced per second, a
trivial handler writing one row in the advance's transaction) and its latency (resume
published -> the handler's row written), beside the daemon's figures of the same run.

The handler is ``bench.worker:step``, run by ``matcher worker`` as a user would run it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from typing import Any

import psycopg

# The application table the handler writes: when each run's step was written (the clock
# inside the handler's transaction, just before it commits).
STEPS_TABLE = (
    "CREATE TABLE IF NOT EXISTS bench_steps (run_id text NOT NULL, at timestamptz NOT NULL)"
)
HANDLER = "bench.worker:step"


async def step(tx: psycopg.AsyncConnection[Any], resume: Any) -> None:
    """The trivial handler: one row, in the transaction that advanced the run."""
    await tx.execute(
        "INSERT INTO bench_steps (run_id, at) VALUES (%s, clock_timestamp())", [resume.run_id]
    )


def create_steps_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(STEPS_TABLE)


def worker_argv() -> list[str]:
    return [sys.executable, "-m", "matcher", "worker", "--handler", HANDLER]


def worker_env(kafka: str, url: str, resume_topic: str) -> dict[str, str]:
    """The worker's environment: this run's database and resume topic, a group of its own,
    the default concurrency, quick commits of its offsets."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("MATCHER_")}
    out.update(
        MATCHER_KAFKA_BOOTSTRAP_SERVERS=kafka, MATCHER_DATABASE_URL=url,
        MATCHER_RESUME_TOPIC=resume_topic,
        MATCHER_WORKER_GROUP=f"bench-worker-{uuid.uuid4().hex[:8]}",
        MATCHER_LOG_LEVEL="WARNING",
    )  # fmt: skip
    return out


def steps_written(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM bench_steps").fetchone()
    return int(row[0]) if row else 0


def step_times(url: str) -> dict[str, float]:
    """Run id -> when its step was written (epoch seconds)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT run_id, extract(epoch FROM at) FROM bench_steps").fetchall()
    return {row[0]: float(row[1]) for row in rows}


async def advanced_per_second(url: str, want: int, alive: Any, timeout_s: float = 600) -> float:
    """Wait until ``want`` steps are written (``alive()`` raises if the worker died), and
    return the rate from the first step written to the last seen: the group join is left
    out, as the daemon's figures leave it out."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*), extract(epoch FROM min(at)) FROM bench_steps"
            ).fetchone()
            assert row is not None
            if row[0] >= want:
                finished = time.time()
                return want / (finished - float(row[1]))
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker advanced {row[0]} of {want} runs in time")
            alive()
            await asyncio.sleep(0.02)


def latencies_ms(
    sent: dict[str, float], resumed: dict[str, float], written: dict[str, float]
) -> tuple[list[float], list[float]]:
    """Per event in the order sent, with a step written: (resume published -> step
    written) and (event sent -> step written), in seconds. Run ids are ``run-<correlation>``
    (bench.run.register_waits)."""
    after_resume: list[float] = []
    end_to_end: list[float] = []
    for correlation, sent_at in sent.items():
        at = written.get(f"run-{correlation}")
        if at is None or correlation not in resumed:
            continue
        after_resume.append(at - resumed[correlation])
        end_to_end.append(at - sent_at)
    return after_resume, end_to_end
