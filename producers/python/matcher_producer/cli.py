"""matcher-emit: send one signed completion event by hand."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tomllib
import uuid
from pathlib import Path

from matcher_producer.event import CompletionEvent
from matcher_producer.publisher import EventPublisher
from matcher_producer.signing import SigningKey


def load_key(key_id: str | None, key_file: str | None, env: str = "MATCHER_EMIT_KEY") -> SigningKey:
    """A key from a file (one ``whsec_``/``whsk_`` line, or a TOML ``[keys]`` table of
    id = key from which ``key_id`` picks one) or from the environment."""
    if key_file is None:
        text = os.environ.get(env)
        if not text:
            raise ValueError(f"give --key-file or set {env} (or --unsigned)")
        return SigningKey.parse(key_id or "env", text)
    content = Path(key_file).read_text()
    if content.strip().startswith(("whsec_", "whsk_")):
        return SigningKey.parse(key_id or Path(key_file).stem, content)
    keys = tomllib.loads(content).get("keys", {})
    if key_id is None:
        if len(keys) != 1:
            raise ValueError(f"{key_file} holds {len(keys)} keys: choose one with --key-id")
        key_id = next(iter(keys))
    if key_id not in keys:
        raise ValueError(f"{key_file} has no key {key_id!r}")
    return SigningKey.parse(key_id, str(keys[key_id]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="matcher-emit", description="Send one signed completion event to matcher."
    )
    parser.add_argument(
        "--bootstrap-servers", default=os.environ.get("MATCHER_KAFKA_BOOTSTRAP_SERVERS")
    )
    parser.add_argument("--topic", default=os.environ.get("MATCHER_EVENTS_TOPIC", "matcher.events"))
    parser.add_argument("--source", required=True, help="the producer, as registered")
    parser.add_argument("--type", required=True, help="event type, e.g. job.completed")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--correlation", required=True, help="the wait's correlation id")
    parser.add_argument("--id", default=None, help="event id (default: a new UUID)")
    parser.add_argument("--job-id", default=None)
    parser.add_argument("--data", default=None, help="payload as JSON")
    parser.add_argument("--key-id", default=None)
    parser.add_argument("--key-file", default=None)
    parser.add_argument("--unsigned", action="store_true", help="send without a signature")
    parser.add_argument("--structured", action="store_true", help="structured mode")
    args = parser.parse_args(argv)
    if not args.bootstrap_servers:
        parser.error("give --bootstrap-servers or set MATCHER_KAFKA_BOOTSTRAP_SERVERS")
    try:
        data = json.loads(args.data) if args.data is not None else None
        key = None if args.unsigned else load_key(args.key_id, args.key_file)
    except (ValueError, OSError) as exc:
        print(f"matcher-emit: {exc}", file=sys.stderr)
        sys.exit(2)
    event = CompletionEvent(
        source=args.source,
        type=args.type,
        tenant=args.tenant,
        correlation_id=args.correlation,
        data=data,
        job_id=args.job_id,
        id=args.id or str(uuid.uuid4()),
    )

    async def send() -> None:
        async with EventPublisher(
            args.bootstrap_servers, args.topic, key, structured=args.structured
        ) as publisher:
            await publisher.publish(event)

    asyncio.run(send())
    print(f"emitted {event.source}/{event.id} to {args.topic}")


if __name__ == "__main__":
    main()
