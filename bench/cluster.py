"""A private 3-broker Kafka cluster for the benchmark's replicated figures.

The cluster lives in its own devstack directory (the jar cache shared with the main
stack, so nothing downloads twice) and is purged when the block ends, however it ends.
Only its brokers are used: the devstack starts a Postgres beside them, which stays idle
while the benchmark keeps using the main stack's, so that a figure measured on the
cluster differs from the single broker's by Kafka's replication alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from matcher_devstack.stack import Devstack

from matcher.kafka.deadlines import close_admin
from matcher.kafka.topics import topic_configs

BROKERS = 3
# A cold start of four JVMs (three brokers and the controller) on two cores takes about
# a minute; the devstack's own per-service readiness bound is 120 s.
UP_TIMEOUT_S = 300.0
DOWN_TIMEOUT_S = 120.0


class ClusterUnavailable(Exception):
    """The cluster could not be started; the message says why (for the results' notes)."""


def _cli(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "matcher", "devstack", *args],
        env=env, capture_output=True, text=True, check=False, timeout=timeout,
    )  # fmt: skip


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


@contextlib.contextmanager
def private_cluster() -> Iterator[str]:
    """Start the cluster and yield its bootstrap servers (every broker); purge it after.
    Raises ClusterUnavailable when it does not come up (no Java, a port, a timeout)."""
    home = Path(tempfile.mkdtemp(prefix="matcher-bench-cluster-"))
    # Postgres runs as an unprivileged account when we are root: the directory must be
    # searchable by it (mkdtemp makes it private).
    home.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATCHER_")}
    env.update(MATCHER_DEVSTACK_DIR=str(home), MATCHER_DEVSTACK_CACHE=str(Devstack().cache))
    try:
        try:
            up = _cli(
                env, "up", "--brokers", str(BROKERS), "--no-standby", "--json",
                timeout=UP_TIMEOUT_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise ClusterUnavailable(
                f"`devstack up` did not return within {exc.timeout:.0f}s"
            ) from exc
        if up.returncode != 0:
            raise ClusterUnavailable(
                f"`devstack up` exited {up.returncode}: {_last_line(up.stderr or up.stdout)}"
            )
        try:
            bootstrap = str(json.loads(up.stdout)["env"]["MATCHER_KAFKA_BOOTSTRAP_SERVERS"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ClusterUnavailable(
                f"`devstack up --json` printed no bootstrap servers: {exc}"
            ) from exc
        if len(bootstrap.split(",")) != BROKERS:
            raise ClusterUnavailable(f"expected {BROKERS} brokers, the cluster has {bootstrap}")
        yield bootstrap
    finally:
        # Stops whatever did start, even after a failed or timed-out `up`.
        with contextlib.suppress(subprocess.TimeoutExpired):
            _cli(env, "down", "--purge", timeout=DOWN_TIMEOUT_S)
        shutil.rmtree(home, ignore_errors=True)


async def replication(bootstrap: str, topic: str, partitions: int) -> tuple[int, str]:
    """(the fewest replicas of any partition of ``topic``, its min.insync.replicas): what
    the replicated figures were measured with, read back from the cluster. A topic just
    created may not be in every broker's metadata yet: asked again until it is."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        async with asyncio.timeout(60):
            while True:
                described = await admin.describe_topics([topic])
                replicas = [len(p["replicas"]) for t in described for p in t["partitions"]]
                if len(replicas) == partitions:
                    break
                await asyncio.sleep(0.2)
    finally:
        await close_admin(admin, 30.0)
    configs = await topic_configs({"bootstrap_servers": bootstrap}, topic)
    return min(replicas), configs.get("min.insync.replicas", ("?", False))[0]
