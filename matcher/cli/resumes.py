"""``matcher resumes tail`` and ``matcher emit``: the two verbs that need only Kafka."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Annotated, Any

import typer
from matcher_producer.cli import load_key
from pydantic import ValidationError

from matcher.cli.app import app, sub_app
from matcher.cli.output import (
    EXIT_USAGE,
    JsonFlag,
    fail,
    one_line,
    print_json,
    say,
    validation_lines,
)
from matcher.cli.settings import quiet_clients, settings_for
from matcher.domain.events import CompletionEvent
from matcher.kafka.resumes import publish_event, tail

resumes_app = sub_app("Read the resume topic.")


@resumes_app.command("tail")
def resumes_tail(
    from_beginning: Annotated[
        bool, typer.Option(help="Start at the oldest resume, not at the newest.")
    ] = False,
    max_count: Annotated[
        int | None, typer.Option("--max", min=1, help="Stop after this many resumes.")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(min=0, help="Stop after this many seconds.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Print resumes as they are published: one line each (the resume's data). Needs
    Kafka only."""
    settings = settings_for(postgres=False)
    quiet_clients()

    def show(data: dict[str, Any]) -> None:
        if as_json:
            print(json.dumps(data), flush=True)
        else:
            event = data.get("event") or {}
            what = f"{event.get('source')}/{event.get('id')}" if event else "-"
            say(
                f"{data['tenant']} run={data['run_id']} pos={data['position']} "
                f"{data['outcome']} event={what} resolution={data['resolution_id']}"
            )

    asyncio.run(tail(settings, show, from_beginning, max_count, timeout))


@app.command()
def emit(
    tenant: Annotated[str, typer.Option(help="The tenant the event is for.")],
    event_type: Annotated[str, typer.Option("--type", help="Event type, e.g. job.completed.")],
    correlation: Annotated[str, typer.Option(help="Correlation id of the wait.")],
    event_id: Annotated[
        str | None, typer.Option("--id", help="Event id (default: a new UUID).")
    ] = None,
    source: Annotated[str, typer.Option(help="Producer (CloudEvents source).")] = "matcher-cli",
    data: Annotated[str | None, typer.Option(help="Payload, as JSON.")] = None,
    job_id: Annotated[str | None, typer.Option(help="External job id.")] = None,
    structured: Annotated[
        bool, typer.Option(help="Structured mode (whole event in the value), not binary.")
    ] = False,
    key_id: Annotated[
        str | None, typer.Option(help="Which key of a keyring file (TOML [keys] table).")
    ] = None,
    key_file: Annotated[
        str | None,
        typer.Option(help="Signing key: a whsec_/whsk_ line or a [keys] table. Default: unsigned."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Publish one completion event by hand (a CloudEvent on the events topic), signed
    with --key-file as the producer SDK signs. Needs Kafka only."""
    settings = settings_for(postgres=False)
    quiet_clients()
    try:
        payload = json.loads(data) if data is not None else None
    except ValueError as exc:
        fail([f"matcher: --data is not JSON: {exc}"], code=EXIT_USAGE)
    try:
        event = CompletionEvent(
            id=event_id or str(uuid.uuid4()),
            source=source,
            type=event_type,
            tenant=tenant,
            correlationid=correlation,
            jobid=job_id,
            data=payload,
        )
    except ValidationError as exc:
        options = {"correlationid": "--correlation", "jobid": "--job-id", "data": "--data"}
        fail(validation_lines(exc, options), EXIT_USAGE)
    signing_key = None
    if key_file is not None:
        try:
            signing_key = load_key(key_id, key_file)
        except (ValueError, OSError) as exc:
            fail([f"matcher: --key-file: {one_line(exc)}"], code=EXIT_USAGE)
    partition, offset = asyncio.run(
        publish_event(settings, event, structured=structured, signing_key=signing_key)
    )
    if as_json:
        print_json(
            {
                "source": event.source,
                "id": event.id,
                "topic": settings.events_topic,
                "partition": partition,
                "offset": offset,
            }
        )
    else:
        say(
            f"emitted {event.source}/{event.id} to {settings.events_topic} "
            f"(partition {partition}, offset {offset})"
        )
