"""The latency runs' load generator: events sent at a rate by a process of its own.

It shares the machine with what it measures, so it is made cheap and kept apart:
librdkafka (confluent-kafka) rather than aiokafka, which sending one record at a time
(no linger) took half a core at 2,000/s, as much as the daemon; and a process rather
than a thread, so that the paced loop and the reader beside it (the Kafka floor's
consumer, in the benchmark's event loop) do not queue for one GIL. The producer is set
as one that cares about latency and loss would be: idempotent, acks=all, no linger, and
without Nagle's delay, which librdkafka leaves on by default (asyncio, and so aiokafka,
turns it off) and which held records back until the broker acknowledged earlier ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import confluent_kafka

SignedEvent = tuple[str, bytes, list[tuple[str, bytes]], bytes]  # correlation, key, headers, value

PRODUCER_CONFIG = {
    "enable.idempotence": True, "acks": "all", "linger.ms": 0, "socket.nagle.disable": True,
}  # fmt: skip
# By default, the longest the child may take to deliver what it was given once its
# schedule is done.
FLUSH_TIMEOUT_S = 60.0


class _Sender:
    def __init__(self, bootstrap: str, topic: str, flush_timeout_s: float) -> None:
        config = {"bootstrap.servers": bootstrap, **PRODUCER_CONFIG}
        self._producer = confluent_kafka.Producer(config)
        self._topic = topic
        self._flush_timeout_s = flush_timeout_s
        self._failures: list[str] = []

    def _delivered(self, error: object, _message: object) -> None:
        if error is not None:
            self._failures.append(str(error))

    def _produce(self, event: SignedEvent) -> float:
        _correlation, key, headers, value = event
        as_sent: list[tuple[str, str | bytes | None]] = list(headers)
        at = time.time()
        self._producer.produce(
            self._topic, value, key, headers=as_sent, on_delivery=self._delivered
        )
        self._producer.poll(0)
        return at

    def _flush(self) -> None:
        unsent = self._producer.flush(self._flush_timeout_s)
        if unsent or self._failures:
            raise RuntimeError(f"{unsent} events unsent; errors: {self._failures[:3]}")

    def send_now(self, event: SignedEvent) -> None:
        self._produce(event)
        self._flush()

    def paced(self, events: list[SignedEvent], rate: int) -> dict[str, float]:
        sent: dict[str, float] = {}
        started = time.perf_counter()
        for i, event in enumerate(events):
            # Paced to a schedule, not waiting for a condition: each event has its time.
            due = started + i / rate
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            sent[event[0]] = self._produce(event)
        self._flush()
        return sent


def _serve(requests: Connection, answers: Connection, sender: _Sender) -> None:
    """The child: a request at a time, ("now", event) or ("paced", events, rate), each
    answered with ("ok", result) or ("error", text); None, or the parent gone, ends it."""
    with contextlib.suppress(EOFError):
        while (request := requests.recv()) is not None:
            try:
                if request[0] == "now":
                    sender.send_now(request[1])
                    answers.send(("ok", None))
                else:
                    answers.send(("ok", sender.paced(request[1], request[2])))
            except Exception as exc:  # told to the parent, which raises it
                answers.send(("error", repr(exc)))


class PacedProducer:
    """The parent's handle on the child process (``python -m bench.paced``), for one
    topic; requests and answers travel as pickles over its stdin and stdout. A first
    event sent at once (``send_now``) also connects the producer and gets its producer
    id, which a schedule started on a new producer would charge to its first events."""

    def __init__(
        self, bootstrap: str, topic: str, flush_timeout_s: float = FLUSH_TIMEOUT_S
    ) -> None:
        self._flush_timeout_s = flush_timeout_s
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.paced", bootstrap, topic, str(flush_timeout_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None
        assert stdout is not None
        # The connections own descriptors of their own (they close them when done).
        self._requests = Connection(os.dup(stdin.fileno()), readable=False)
        self._answers = Connection(os.dup(stdout.fileno()), writable=False)
        stdin.close()
        stdout.close()

    async def _ask(self, request: tuple[Any, ...], timeout_s: float) -> Any:
        self._requests.send(request)
        if not await asyncio.to_thread(self._answers.poll, timeout_s):
            raise TimeoutError(f"the paced producer did not answer within {timeout_s:.0f} s")
        try:
            status, result = self._answers.recv()
        except EOFError:
            raise RuntimeError(
                f"the paced producer exited ({self._process.wait(10)}); see its stderr"
            ) from None
        if status != "ok":
            raise RuntimeError(f"the paced producer failed: {result}")
        return result

    @property
    def pid(self) -> int:
        return self._process.pid

    async def send_now(self, event: SignedEvent) -> None:
        await self._ask(("now", event), self._flush_timeout_s + 30)

    async def paced(self, events: list[SignedEvent], rate: int) -> dict[str, float]:
        """Send ``events`` at ``rate``/s, each when it is due; return when each was sent."""
        sent: dict[str, float] = await self._ask(
            ("paced", events, rate), len(events) / rate + self._flush_timeout_s + 30
        )
        return sent

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the child is gone already
            self._requests.send(None)
        self._requests.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        self._answers.close()


def main() -> None:
    bootstrap, topic, flush_timeout_s = sys.argv[1:4]
    # Our own descriptors for the pickles; stdout must carry nothing else.
    requests = Connection(os.dup(0), writable=False)
    answers = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    _serve(requests, answers, _Sender(bootstrap, topic, float(flush_timeout_s)))


if __name__ == "__main__":
    main()
