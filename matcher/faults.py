"""Test-only faults: kill the daemon or a resume worker hard, or stall it, at a named
place in its work.

``MATCHER_TEST_CRASH_AT=point[@n][,point[@n]...]`` makes the n-th arrival (default: the
first) at ``point`` SIGKILL this process: no exception, no cleanup, no flush, exactly
what a power cut or the OOM killer does. Unset (always, outside tests), it costs one
dictionary lookup.

``MATCHER_TEST_STALL_AT=point@n:seconds`` blocks the whole process (event loop included,
heartbeats too) for that long at the n-th arrival: a batch that outlives the consumer's
poll interval and session.
"""

from __future__ import annotations

import os
import signal
import sys
import time

POINTS = (
    "ingest.in_transaction",  # inbox rows written, transaction not committed
    "ingest.after_db_commit",  # inbox committed, Kafka offsets not committed
    "relay.before_publish",  # resolution committed, resume not yet sent
    "relay.after_publish",  # resume acknowledged by Kafka, not marked published
    "sweeper.in_transaction",  # waits timed out, transaction not committed
    "rematch.in_transaction",  # queued keys taken and matched, transaction not committed
    "worker.before_advance",  # a resume worker's transaction begun, the run not advanced
    "worker.in_handler",  # advanced and the handler's writes done, not committed
    "worker.after_commit",  # committed, the resume's offset not committed
    "langgraph.after_advance",  # the LangGraph resumer: advanced, the graph not resumed
    "langgraph.after_invoke",  # the graph resumed, its checkpoints written, not committed
    "agent.after_run",  # a Pydantic AI run continued, its history not yet stored
)


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = item.partition("@")
        if name not in POINTS:
            raise ValueError(f"unknown crash point {name!r}; known: {', '.join(POINTS)}")
        armed[name] = int(count or "1")
    return armed


_armed = _parse(os.environ.get("MATCHER_TEST_CRASH_AT", ""))


def _parse_stalls(spec: str) -> dict[str, tuple[int, float]]:
    stalls: dict[str, tuple[int, float]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        where, _, seconds = item.partition(":")
        for name, count in _parse(where).items():
            stalls[name] = (count, float(seconds or "1"))
    return stalls


_stalls = _parse_stalls(os.environ.get("MATCHER_TEST_STALL_AT", ""))


def crash_point(name: str) -> None:
    stall = _stalls.get(name)
    if stall is not None:
        count, seconds = stall
        if count > 1:
            _stalls[name] = (count - 1, seconds)
        else:
            del _stalls[name]
            sys.stderr.write(f"matcher: test stall at {name} for {seconds}s\n")
            time.sleep(seconds)  # blocking on purpose: the loop and heartbeats stop too
    remaining = _armed.get(name)
    if remaining is None:
        return
    if remaining > 1:
        _armed[name] = remaining - 1
        return
    sys.stderr.write(f"matcher: test crash point {name} reached; killing the process\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
