"""The peer Restate: a real Restate server (``restate-server`` from the npm package
@restatedev/restate-server, installed by scripts/install-restate), single node, its
RocksDB and log on local disk, and the restate-sdk service of bench/restate_service.py
served over HTTP/2 by hypercorn and registered through the admin API.

N workflow runs each await a durable promise; once every run is suspended, N resolutions
go over the HTTP ingress (the workflow's shared handler), CONCURRENCY at a time; timed from
the first resolution sent to the last run completed (the server's ``completed_at``). The
same with an awakeable resolved by id, the promise resolved before its run starts (the
early event), and the latency of a resolution at offered rates (sent -> run completed).

    python -m bench.restate_peer --n N --reps R --rates 500,2000 --latency-s S --workdir DIR

The server and the service are started, and stopped however the run ends, by this module;
the last line printed is the JSON of bench.peers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.cpu import own_cpu_s
from bench.peers import (
    CONCURRENCY,
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

ROOT = Path(__file__).resolve().parents[1]
UP_TIMEOUT_S = 90.0
POLL_S = 0.2


def restate_binary() -> Path:
    """$BENCH_RESTATE_SERVER, or the pinned one scripts/install-restate installs (once)."""
    if os.environ.get("BENCH_RESTATE_SERVER"):
        found = Path(os.environ["BENCH_RESTATE_SERVER"])
    else:
        try:
            done = subprocess.run(
                [str(ROOT / "scripts/install-restate")], capture_output=True, text=True,
                timeout=600, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PeerUnavailable(f"scripts/install-restate failed: {exc}") from exc
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or ["no output"]
            raise PeerUnavailable(f"scripts/install-restate exited {done.returncode}: {lines[-1]}")
        found = Path(done.stdout.strip())
    if not found.is_file():
        raise PeerUnavailable(f"no restate-server at {found}")
    return found


def _config(workdir: Path, fabric: int, admin: int, ingress: int) -> Path:
    path = workdir / "restate.toml"
    path.write_text(
        f'node-name = "bench"\ncluster-name = "bench-{uuid.uuid4().hex[:6]}"\n'
        f'base-dir = "{workdir / "restate-data"}"\nlisten-mode = "tcp"\n'
        f'bind-address = "127.0.0.1:{fabric}"\n'
        f'advertised-address = "http://127.0.0.1:{fabric}/"\n'
        'disable-telemetry = true\nlog-filter = "warn"\n'
        f'[admin]\nbind-address = "127.0.0.1:{admin}"\ndisable-web-ui = true\n'
        f'[ingress]\nbind-address = "127.0.0.1:{ingress}"\n'
    )
    return path


class Restate:
    def __init__(self, server: Server, service: Server, admin: str, ingress: str) -> None:
        self.server, self.service = server, service
        self.admin, self.ingress = admin, ingress
        limits = httpx.Limits(max_connections=CONCURRENCY * 4, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(limits=limits, timeout=120)

    async def query(self, statement: str) -> list[dict[str, Any]]:
        response = await self.http.post(
            f"{self.admin}/query", json={"query": statement},
            headers={"accept": "application/json"},
        )  # fmt: skip
        response.raise_for_status()
        rows: list[dict[str, Any]] = response.json()["rows"]
        return rows

    async def post(self, path: str, body: Any = None) -> None:
        content = None if body is None else json.dumps(body).encode()
        response = await self.http.post(
            f"{self.ingress}{path}", content=content,
            headers={"content-type": "application/json"} if content else {},
        )  # fmt: skip
        response.raise_for_status()

    def alive(self) -> None:
        self.server.check_alive()
        self.service.check_alive()

    async def count(self, service: str, prefix: str, status: str) -> int:
        rows = await self.query(
            "SELECT count(*) AS n FROM sys_invocation"
            f" WHERE target_service_name = '{service}' AND target_handler_name = 'run'"
            f" AND target_service_key LIKE '{prefix}-%' AND status = '{status}'"
        )
        return int(rows[0]["n"])

    async def wait_status(self, service: str, prefix: str, status: str, count: int) -> None:
        async def done() -> bool:
            return await self.count(service, prefix, status) >= count

        await wait_for(
            f"{count} {service} runs {status}", done, 120 + count / 20, self.alive, POLL_S
        )

    async def completed_at(self, service: str, prefix: str) -> dict[str, float]:
        """Each completed run's completion time (epoch seconds, the server's clock) by key."""
        rows = await self.query(
            "SELECT target_service_key AS key, completed_at FROM sys_invocation"
            f" WHERE target_service_name = '{service}' AND target_handler_name = 'run'"
            f" AND target_service_key LIKE '{prefix}-%' AND status = 'completed'"
        )
        return {str(r["key"]): _epoch(r["completed_at"]) for r in rows}

    async def start_runs(self, service: str, count: int) -> tuple[str, list[str]]:
        prefix = uuid.uuid4().hex[:8]
        keys = [f"{prefix}-{i}" for i in range(count)]
        await few_at_a_time(count, lambda i: self.post(f"/{service}/{keys[i]}/run/send"))
        await self.wait_status(service, prefix, "suspended", count)
        return prefix, keys

    async def _window(
        self, started: float, cpu0: tuple[float, ...], service_name: str, prefix: str, n: int
    ) -> dict[str, float]:
        """Once the ``n`` runs completed: the CPU since ``cpu0``, read before their completion
        times are asked for, and the seconds from ``started`` to the last completion."""
        await self.wait_status(service_name, prefix, "completed", n)
        server, service = self.server.cpu() - cpu0[0], self.service.cpu() - cpu0[1]
        wall = time.time() - started
        ends = await self.completed_at(service_name, prefix)
        return {
            "seconds": max(ends.values()) - started, "server_cpu_s": server,
            "server_cores": server / wall, "service_cpu_s": service,
            "service_cores": service / wall, "client_cpu_s": own_cpu_s() - cpu0[2],
        }  # fmt: skip

    def _cpu(self) -> tuple[float, ...]:
        return (self.server.cpu(), self.service.cpu(), own_cpu_s())

    async def promises(self, n: int) -> dict[str, float]:
        prefix, keys = await self.start_runs("BenchWaiter", n)
        cpu0, started = self._cpu(), time.time()
        await few_at_a_time(n, lambda i: self.post(f"/BenchWaiter/{keys[i]}/complete", PAYLOAD))
        return await self._window(started, cpu0, "BenchWaiter", prefix, n)

    async def awakeables(self, n: int) -> dict[str, float]:
        prefix, _keys = await self.start_runs("BenchAwakeable", n)
        rows = await self.query(
            "SELECT service_key AS key, value_utf8 AS id FROM state"
            " WHERE service_name = 'BenchAwakeable' AND key = 'awakeable'"
            f" AND service_key LIKE '{prefix}-%'"
        )
        ids = [json.loads(r["id"]) for r in rows]
        assert len(ids) == n, f"{len(ids)} awakeable ids for {n} runs"
        cpu0, started = self._cpu(), time.time()
        await few_at_a_time(
            n, lambda i: self.post(f"/restate/awakeables/{ids[i]}/resolve", PAYLOAD)
        )
        return await self._window(started, cpu0, "BenchAwakeable", prefix, n)

    async def early(self, n: int) -> dict[str, float]:
        """The promise resolved before its run exists; then the runs started."""
        prefix = uuid.uuid4().hex[:8]
        keys = [f"{prefix}-{i}" for i in range(n)]
        cpu0, started = self._cpu(), time.time()
        await few_at_a_time(n, lambda i: self.post(f"/BenchWaiter/{keys[i]}/complete", PAYLOAD))
        await few_at_a_time(n, lambda i: self.post(f"/BenchWaiter/{keys[i]}/run/send"))
        return await self._window(started, cpu0, "BenchWaiter", prefix, n)

    async def latency(self, rate: int, seconds: float) -> dict[str, float]:
        count = max(1, int(rate * seconds))
        prefix, keys = await self.start_runs("BenchWaiter", count)
        due, achieved = await paced(
            count, rate, lambda i: self.post(f"/BenchWaiter/{keys[i]}/complete", PAYLOAD)
        )
        await self.wait_status("BenchWaiter", prefix, "completed", count)
        ends = await self.completed_at("BenchWaiter", prefix)
        found = percentiles([ends[key] - at for key, at in zip(keys, due, strict=True)])
        return {**found, "sent_per_s": achieved}


def _epoch(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value) / 1000  # milliseconds
    return datetime.fromisoformat(str(value)).timestamp()


@contextlib.asynccontextmanager
async def restate(workdir: Path) -> AsyncIterator[Restate]:
    fabric, admin_port, ingress_port, service_port = (free_port() for _ in range(4))
    config = _config(workdir, fabric, admin_port, ingress_port)
    admin, ingress = f"http://127.0.0.1:{admin_port}", f"http://127.0.0.1:{ingress_port}"
    server_argv = [str(restate_binary()), "--config-file", str(config), "--no-logo"]
    service_argv = [
        sys.executable, "-m", "hypercorn", "bench.restate_service:app",
        "--bind", f"127.0.0.1:{service_port}", "--workers", "0",
        "--graceful-timeout", "5", "--log-level", "WARNING",
    ]  # fmt: skip
    # The service is stopped after the server: it waits for the server's connections to
    # close before it exits.
    # (hypercorn, serving in its own process with --workers 0, stops on SIGINT, not SIGTERM.)
    service = Server("the service", service_argv, workdir / "service.log", signal.SIGINT, cwd=ROOT)
    with running(service):
        server = Server("restate-server", server_argv, workdir / "restate.log", cwd=workdir)
        with running(server):
            async with _registered(Restate(server, service, admin, ingress), service_port) as peer:
                yield peer


@contextlib.asynccontextmanager
async def _registered(peer: Restate, service_port: int) -> AsyncIterator[Restate]:
    """``peer`` once its server answers and the service is registered as a deployment
    through the admin API; its HTTP client closed after."""
    admin, ingress = peer.admin, peer.ingress

    async def up(url: str) -> bool:
        return (await peer.http.get(url)).status_code == 200

    async def registered() -> bool:
        response = await peer.http.post(
            f"{admin}/deployments", json={"uri": f"http://127.0.0.1:{service_port}/"}
        )
        if response.status_code >= 300:
            raise PeerUnavailable(f"registration: {response.status_code} {response.text}")
        return True

    try:
        await wait_for("restate admin", lambda: up(f"{admin}/health"), UP_TIMEOUT_S, peer.alive)
        await wait_for(
            "restate ingress", lambda: up(f"{ingress}/restate/health"), UP_TIMEOUT_S, peer.alive
        )
        await wait_for("the service's registration", registered, UP_TIMEOUT_S, peer.alive)
        yield peer
    finally:
        await peer.http.aclose()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[float]] = {}

    def record(prefix: str, found: dict[str, float]) -> None:
        runs.setdefault(prefix, []).append(args.n / found["seconds"])
        for key in ("server_cpu_s", "server_cores", "service_cpu_s", "service_cores"):
            runs.setdefault(f"{prefix.removeprefix('r_')}_{key}", []).append(found[key])

    async with restate(Path(args.workdir)) as peer:
        cpu0, started = peer.server.cpu(), time.time()
        await peer.promises(max(1, args.n // 4))  # warm-up, not recorded
        for _ in range(args.reps):
            record("r_restate", await peer.promises(args.n))
            record("r_restate_awakeable", await peer.awakeables(args.n))
            record("r_restate_early", await peer.early(args.n))
        for rate in args.rates:
            for _ in range(args.latency_reps):
                found = await peer.latency(rate, args.latency_s)
                for key, value in found.items():
                    runs.setdefault(f"restate_latency_{rate}_{key}", []).append(value)
        total, wall = peer.server.cpu() - cpu0, time.time() - started
    # The whole measurement, runs started and suspended between the timed windows included.
    runs["restate_server_all_cpu_s"] = [total]
    runs["restate_server_all_cores"] = [total / wall]
    return {"runs": runs, "figures": {}, "notes": []}


if __name__ == "__main__":
    peer_main(measure, __doc__)
