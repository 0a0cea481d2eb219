"""The webhook ingress under load, with and without slow clients attacking it.

    python -m bench.ingress_load [--seconds 20] [--senders 16] [--slowloris 1100]
                                 [--slow-bodies 300]

Starts ``matcher ingress`` (its defaults: 1024 connections, 64 slots) on the services named
by MATCHER_KAFKA_BOOTSTRAP_SERVERS (topics of its own), then drives legitimate signed
Standard Webhooks requests from ``--senders`` concurrent senders for ``--seconds``: once
alone, once while another process holds ``--slowloris`` connections trickling headers and
``--slow-bodies`` connections trickling declared 100 kB bodies from another address
(127.0.0.2), reopening each as soon as it is closed. Prints one JSON object: accepted
requests per second, latency p50/p99 and the answers that were not 202, for each run, and
the connections the ingress evicted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import standardwebhooks

from matcher.config import IngressSettings
from matcher.kafka.topics import EVENT_TOPIC_CONFIGS, delete_topics, ensure_topics

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # noqa: S105 (a benchmark key)
PRODUCERS = f"""
[producers."bench"]
tenants = ["acme"]
types = ["batch.completed"]
webhook.scheme = "standard-webhooks"
webhook.mapping = {{ type = "{{/type}}", correlationid = "{{/data/id}}", tenant = "acme" }}
[[producers."bench".keys]]
id = "k1"
hmac_secret = "{SECRET}"
"""


async def _senders(address: str, senders: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    answers: Counter[str] = Counter()
    hook = standardwebhooks.Webhook(SECRET)
    deadline = time.monotonic() + seconds
    counter = iter(range(10**9))

    async def send(http: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            n = next(counter)
            body = json.dumps({"type": "batch.completed", "data": {"id": f"batch_{n}"}})
            msg_id = f"msg_{n}_{uuid.uuid4().hex[:8]}"
            now = datetime.now(UTC)
            headers = {
                "content-type": "application/json",
                "webhook-id": msg_id,
                "webhook-timestamp": str(int(now.timestamp())),
                "webhook-signature": hook.sign(msg_id, now, body),
            }
            began = time.monotonic()
            try:
                answer = await http.post(f"{address}/v1/webhooks/bench", content=body,
                                         headers=headers)  # fmt: skip
                answers[f"{answer.status_code} {_reason(answer)}".strip()] += 1
            except httpx.HTTPError:
                answers["no answer"] += 1
                continue
            if answer.status_code == 202:
                latencies.append(time.monotonic() - began)

    limits = httpx.Limits(max_connections=senders, max_keepalive_connections=senders)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        began = time.monotonic()
        await asyncio.gather(*(send(http) for _ in range(senders)))
        took = time.monotonic() - began
    ordered = sorted(latencies)
    return {
        "accepted_per_s": round(len(latencies) / took, 1),
        "p50_ms": round(1000 * statistics.median(ordered), 2) if ordered else None,
        "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 2) if ordered else None,
        "answers": {str(k): v for k, v in sorted(answers.items())},
    }


def _reason(answer: httpx.Response) -> str:
    if answer.status_code == 202:
        return ""
    try:
        return str(answer.json().get("reason", ""))
    except ValueError:
        return answer.text[:40]


async def _hold(host: str, port: int, kind: str, stop: asyncio.Event) -> None:
    """One slow client, reopened as soon as it is closed."""
    head = b"POST /v1/webhooks/bench HTTP/1.1\r\nHost: x\r\n"
    if kind == "body":
        head += b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
    while not stop.is_set():
        try:
            # From 127.0.0.2: another host, as the ingress sees it.
            reader, writer = await asyncio.open_connection(host, port, local_addr=("127.0.0.2", 0))
        except OSError:
            await asyncio.sleep(0.05)
            continue
        try:
            writer.write(head)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1):
                        if await reader.read(4096) == b"":
                            break
                writer.write(b"X-Slow: 1\r\n" if kind == "headers" else b" ")
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


async def _attack(address: str, slowloris: int, slow_bodies: int) -> None:
    host, _, port = address.removeprefix("http://").partition(":")
    stop = asyncio.Event()
    kinds = ["headers"] * slowloris + ["body"] * slow_bodies
    tasks = [asyncio.create_task(_hold(host, int(port), kind, stop)) for kind in kinds]
    with contextlib.suppress(EOFError, KeyboardInterrupt):
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)


def _start_ingress(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "matcher", "ingress", "--address", "127.0.0.1:0", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        if '"ingress listening"' in line:
            # Its log is read on (and dropped): a full pipe would stop the ingress.
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process, json.loads(line)["address"]
    raise RuntimeError("the ingress did not start")


def _evicted(address: str) -> float:
    text = httpx.get(f"{address}/metrics", timeout=10).text
    found = re.search(r"^matcher_ingress_connections_evicted_total (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--senders", type=int, default=16)
    parser.add_argument("--slowloris", type=int, default=1100)
    parser.add_argument("--slow-bodies", type=int, default=300)
    parser.add_argument("--attack-only", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack_only:
        asyncio.run(_attack(args.attack_only, args.slowloris, args.slow_bodies))
        return
    settings = IngressSettings()
    topic = f"bench.ingress.{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topics(settings.kafka_client_options(), [topic], partitions=6,
                              configs={topic: EVENT_TOPIC_CONFIGS}))  # fmt: skip
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as directory:
        producers = Path(directory) / "producers.toml"
        producers.write_text(PRODUCERS)
        env = {
            **os.environ,
            "MATCHER_EVENTS_TOPIC": topic,
            "MATCHER_PRODUCERS_FILE": str(producers),
            "MATCHER_ALLOW_UNSIGNED": "false",
        }
        ingress, address = _start_ingress(env)
        try:
            results["without_attack"] = asyncio.run(_senders(address, args.senders, args.seconds))
            attacker = subprocess.Popen(
                [sys.executable, "-m", "bench.ingress_load", "--attack-only", address,
                 "--slowloris", str(args.slowloris), "--slow-bodies", str(args.slow_bodies)],
                stdin=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                time.sleep(5)  # the attack takes its connections first
                results["with_attack"] = asyncio.run(_senders(address, args.senders, args.seconds))
            finally:
                assert attacker.stdin is not None
                attacker.stdin.close()
                attacker.wait(60)
            results["connections_evicted"] = _evicted(address)
        finally:
            ingress.terminate()
            ingress.wait(60)
    with contextlib.suppress(Exception):
        asyncio.run(delete_topics(settings.kafka_client_options(), [topic]))
    results["settings"] = vars(args) | {"attack_only": None}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
