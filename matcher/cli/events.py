"""``matcher events`` and ``matcher quarantine``: the inbox, and the records refused."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import psycopg
import typer

from matcher.admin.filters import EventFilters, QuarantineFilters, RefusalFilters
from matcher.auth.gate import judge as gate_judge
from matcher.auth.registry import Registry, RegistryError, load_registry
from matcher.cli import listing
from matcher.cli.app import sub_app
from matcher.cli.output import EXIT_USAGE, JsonFlag, fail, one_line, print_json, say, when
from matcher.cli.settings import parse_filters, settings_for
from matcher.domain.events import BIGINT_MAX, QuarantinedRecord, RefusedDelivery, StoredEvent
from matcher.domain.records import RawRecord
from matcher.store.replay import replay

events_app = sub_app("Look at the event inbox.")


EVENTS = listing.Listing(
    "events",
    StoredEvent,
    ("source", "id", "tenant", "type", "correlation", "status", "received", "at"),
    lambda e: (e.producer, e.event_id, e.tenant, e.type, e.correlation_id, e.status,
               when(e.received_at), f"{e.kafka_partition}@{e.kafka_offset}"),
)  # fmt: skip


@events_app.command("list")
def events_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
    correlation: Annotated[str | None, typer.Option(help="Only this correlation id.")] = None,
    status: Annotated[str | None, typer.Option(help="pending, consumed, late or expired.")] = None,
    job_id: Annotated[str | None, typer.Option(help="Only this external job id.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (1-1000), newest first.")] = 100,
    offset: Annotated[int, typer.Option(help="Skip this many first.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """List stored events, newest first."""
    listing.show(
        EVENTS, EventFilters, as_json, tenant=tenant, correlation_id=correlation,
        status=status, external_job_id=job_id, limit=limit, offset=offset,
    )  # fmt: skip


quarantine_app = sub_app("Rejected records: see why, and replay them after fixing the cause.")


QUARANTINE = listing.Listing(
    "quarantine",
    QuarantinedRecord,
    ("id", "received", "at", "reason", "source", "event", "tenant", "detail"),
    lambda q: (q.id, when(q.received_at), f"{q.kafka_partition}@{q.kafka_offset}",
               q.reason + (f" (replayed: {q.replay_result})" if q.replayed_at else ""),
               q.producer or "-", q.event_id or "-", q.tenant or "-", q.detail or ""),
)  # fmt: skip


@quarantine_app.command("list")
def quarantine_list(
    reason: Annotated[
        str | None, typer.Option(help="Only this reason code (e.g. bad_signature).")
    ] = None,
    correlation: Annotated[str | None, typer.Option(help="Only this correlation id.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (1-1000), newest first.")] = 100,
    offset: Annotated[int, typer.Option(help="Skip this many first.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """List quarantined records, newest first, with the reason each was refused."""
    listing.show(
        QUARANTINE, QuarantineFilters, as_json, reason=reason, correlation_id=correlation,
        limit=limit, offset=offset,
    )  # fmt: skip


REFUSALS = listing.Listing(
    "refusals",
    RefusedDelivery,
    ("id", "received", "producer", "reason", "http", "claimed tenant", "claimed correlation",
     "detail"),
    lambda r: (r.id, when(r.received_at), r.producer, r.reason, r.http_status,
               r.claimed_tenant or "-", r.claimed_correlation_id or "-", r.detail),
)  # fmt: skip


@quarantine_app.command("refusals")
def quarantine_refusals(
    reason: Annotated[str | None, typer.Option(help="Only this reason code.")] = None,
    producer: Annotated[str | None, typer.Option(help="Only this producer (the URL's).")] = None,
    correlation: Annotated[
        str | None, typer.Option(help="Only those claiming this correlation id (unverified).")
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many (1-1000), newest first.")] = 100,
    offset: Annotated[int, typer.Option(help="Skip this many first.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """List deliveries the webhook ingress refused, newest first: the reason, the detail,
    and what each claimed (never verified)."""
    listing.show(
        REFUSALS, RefusalFilters, as_json, reason=reason, producer=producer,
        correlation_id=correlation, limit=limit, offset=offset,
    )  # fmt: skip


@quarantine_app.command("replay")
def quarantine_replay(
    record_id: Annotated[
        int | None,
        typer.Argument(
            help="The quarantine id to replay.", show_default=False, min=1, max=BIGINT_MAX
        ),
    ] = None,
    reason: Annotated[
        str | None, typer.Option(help="Replay every unreplayed record with this reason.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Judge quarantined records again with the current producers file and limits; those
    that pass are stored and matched like any other event (duplicates still recognised).
    A record is judged as of when it first arrived (signature timestamps included)."""
    if (record_id is None) == (reason is None):
        fail(["matcher: give a quarantine ID or --reason, not both"], code=EXIT_USAGE)
    if reason is not None:
        parse_filters(QuarantineFilters, {}, reason=reason)
    settings = settings_for(kafka=False)
    if settings.producers_file is None and not settings.allow_unsigned:
        fail(["matcher: MATCHER_PRODUCERS_FILE is not set: nothing to judge against"], EXIT_USAGE)
    try:
        registry = load_registry(settings.producers_file) if settings.producers_file else Registry()
    except RegistryError as exc:
        fail([f"matcher: {one_line(exc)}"], code=EXIT_USAGE)
    policy = settings.policy()

    def judge(record: RawRecord) -> Any:
        return gate_judge(record, registry, policy)

    async def go() -> Any:
        async with await psycopg.AsyncConnection.connect(
            settings.database_url.get_secret_value(), autocommit=True
        ) as conn:
            return await replay(conn, judge, quarantine_id=record_id, reason=reason)

    outcomes = asyncio.run(go())
    if as_json:
        print_json([o.__dict__ for o in outcomes])
    else:
        for o in outcomes:
            say(f"{o.id}: {o.result}" + (f" ({o.detail})" if o.detail else ""))
        if not outcomes:
            say("nothing to replay")
    if record_id is not None and not outcomes:
        fail([f"matcher: no unreplayed quarantine record {record_id}"])
