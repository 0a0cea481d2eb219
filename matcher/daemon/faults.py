"""Test-only crash points: kill the daemon hard at a named place in its work.

``MATCHER_TEST_CRASH_AT=point[@n][,point[@n]...]`` makes the n-th arrival (default: the
first) at ``point`` SIGKILL this process: no exception, no cleanup, no flush, exactly
what a power cut or the OOM killer does. Unset (always, outside tests), it costs one
dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys

POINTS = (
    "ingest.in_transaction",  # inbox rows written, transaction not committed
    "ingest.after_db_commit",  # inbox committed, Kafka offsets not committed
    "relay.before_publish",  # resolution committed, resume not yet sent
    "relay.after_publish",  # resume acknowledged by Kafka, not marked published
    "sweeper.in_transaction",  # waits timed out, transaction not committed
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


def crash_point(name: str) -> None:
    remaining = _armed.get(name)
    if remaining is None:
        return
    if remaining > 1:
        _armed[name] = remaining - 1
        return
    sys.stderr.write(f"matcher: test crash point {name} reached; killing the process\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
