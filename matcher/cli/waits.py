"""``matcher waits``: register, list and cancel waits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from matcher.admin.filters import WaitFilters
from matcher.cli import listing
from matcher.cli.app import sub_app
from matcher.cli.output import (
    EXIT_USAGE,
    JsonFlag,
    fail,
    print_json,
    say,
    validation_lines,
    when,
)
from matcher.cli.settings import connect, settings_for, uuid_argument
from matcher.domain.callbacks import CALLBACK_PATH
from matcher.domain.waits import Rule, Wait, WaitCondition, WaitSpec
from matcher.logs import quoted
from matcher.store.waits import cancel_wait, get_wait, issue_callback, register_wait

waits_app = sub_app("Register, list and cancel waits.")


def _parse_deadline(text: str) -> datetime:
    """--deadline: when the wait times out, which is after now (a wait that times out as it
    is registered is a mistake), and no later than a timestamp can be (the year 9999)."""
    now = datetime.now(UTC)
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not seconds > 0:  # NaN too
            fail([f"matcher: --deadline {quoted(text)}: must be more than 0 seconds"], EXIT_USAGE)
        try:
            return now + timedelta(seconds=seconds)
        except OverflowError:
            fail([f"matcher: --deadline {quoted(text)}: past the year 9999"], code=EXIT_USAGE)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(
            [f"matcher: --deadline {quoted(text)} is neither seconds nor an ISO-8601 time"],
            EXIT_USAGE,
        )
    if moment.tzinfo is None:
        fail(
            [f"matcher: --deadline {quoted(text)} needs a timezone, e.g. {text}Z"], code=EXIT_USAGE
        )
    try:
        moment.astimezone(UTC)  # 9999-12-31T23:00-05:00 is in the year 10000
    except OverflowError:
        fail([f"matcher: --deadline {quoted(text)}: past the year 9999"], code=EXIT_USAGE)
    if moment <= now:
        fail([f"matcher: --deadline {quoted(text)}: must be in the future"], code=EXIT_USAGE)
    return moment


def _fan_in_condition(text: str) -> WaitCondition:
    types, sep, correlation = text.partition("=")
    if not sep:
        fail([f"matcher: --fan-in {quoted(text)}: write TYPES=CORRELATION"], EXIT_USAGE)
    try:
        return WaitCondition(event_types=types.split(","), correlation_id=correlation)
    except ValidationError as exc:
        fail([f"matcher: --fan-in {quoted(text)}: {line}" for line in _messages(exc)], EXIT_USAGE)


def _messages(exc: ValidationError) -> list[str]:
    return [str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()]


def _checked_spec(**fields: Any) -> WaitSpec:
    """The wait the options describe, or the CLI's one line per problem."""
    try:
        return WaitSpec(**fields)
    except ValidationError as exc:
        options = {
            "run_id": "--run",
            "event_types": "--type",
            "correlation_id": "--correlation",
            "external_job_id": "--job-id",
            "heartbeat_interval_s": "--heartbeat",
            "progress_types": "--progress-type",
        }
        fail(validation_lines(exc, options), EXIT_USAGE)


@waits_app.command("add")
def waits_add(
    tenant: Annotated[str, typer.Option(help="Tenant the wait belongs to.")],
    run: Annotated[str, typer.Option(help="Run id.")],
    position: Annotated[int, typer.Option(help="The run's position this wait is for.")],
    event_type: Annotated[
        list[str] | None,
        typer.Option("--type", help="An accepted event type; repeat for several."),
    ] = None,
    correlation: Annotated[
        str | None, typer.Option(help="Correlation id the event will carry.")
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(help="Seconds from now, or an ISO-8601 time with a timezone."),
    ] = None,
    job_id: Annotated[str | None, typer.Option(help="External job id, if known.")] = None,
    condition: Annotated[
        str | None,
        typer.Option(
            help="An SQL/JSON path predicate the event's data must satisfy, e.g."
            " '$.status == \"succeeded\"'."
        ),
    ] = None,
    heartbeat: Annotated[
        float | None,
        typer.Option(
            help="Seconds of silence (no progress event) after which the wait times out;"
            " needs --progress-type."
        ),
    ] = None,
    progress_type: Annotated[
        list[str] | None,
        typer.Option(help="An event type that reports progress; repeat for several."),
    ] = None,
    fan_in: Annotated[
        list[str] | None,
        typer.Option(
            help="Fan-in: a condition, TYPES=CORRELATION (types comma-separated), instead of"
            " --type and --correlation; repeat for each (2 to 32)."
        ),
    ] = None,
    rule: Annotated[
        Rule | None, typer.Option(help="With --fan-in: all (the default), any or at_least.")
    ] = None,
    at_least: Annotated[
        int | None, typer.Option(help="With --rule at_least: how many conditions.")
    ] = None,
    callback: Annotated[
        bool,
        typer.Option(
            "--callback",
            help="Also issue a callback token (in the same transaction): POSTing JSON to"
            " the ingress's /v1/callbacks/TOKEN completes this wait. Printed once: only"
            " its digest is stored.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Register a wait. If a matching event already arrived, it resolves at once."""
    spec = _checked_spec(
        tenant=tenant,
        run_id=run,
        position=position,
        event_types=event_type or None,
        correlation_id=correlation,
        deadline=_parse_deadline(deadline) if deadline is not None else None,
        external_job_id=job_id,
        condition=condition,
        heartbeat_interval_s=heartbeat,
        progress_types=progress_type or None,
        conditions=None if not fan_in else [_fan_in_condition(c) for c in fan_in],
        rule=rule,
        at_least=at_least,
    )
    _register_and_show(spec, callback=callback, as_json=as_json)


def _register_and_show(spec: WaitSpec, *, callback: bool, as_json: bool) -> None:
    """Store the wait (and its callback token, in the same transaction) and print it."""
    with connect(settings_for(kafka=False)) as conn:
        try:
            with conn.transaction():
                wait = register_wait(conn, spec)
                token = issue_callback(conn, wait.id) if callback else None
        except ValueError as exc:  # refused by the database (a condition that does not parse)
            fail([f"matcher: {exc}"], EXIT_USAGE)
    path = None if token is None else CALLBACK_PATH + token
    if as_json:
        extra = {} if token is None else {"callback_token": token, "callback_path": path}
        print_json({**wait.model_dump(), **extra})
    else:
        say(f"wait {wait.id} {wait.state.value}")
        if path is not None:
            say(f"callback {path}")


WAITS = listing.Listing(
    "waits",
    Wait,
    ("id", "tenant", "run", "pos", "types", "correlation", "state", "created"),
    lambda w: (w.id, w.tenant, w.run_id, w.position, ",".join(w.event_types), w.correlation_id,
               w.state.value, when(w.created_at)),
)  # fmt: skip


@waits_app.command("list")
def waits_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
    state: Annotated[
        str | None, typer.Option(help="waiting, matched, timed_out or cancelled.")
    ] = None,
    run: Annotated[str | None, typer.Option(help="Only this run id.")] = None,
    correlation: Annotated[str | None, typer.Option(help="Only this correlation id.")] = None,
    job_id: Annotated[str | None, typer.Option(help="Only this external job id.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (1-1000), newest first.")] = 100,
    offset: Annotated[int, typer.Option(help="Skip this many first.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """List waits, newest first."""
    listing.show(
        WAITS, WaitFilters, as_json, tenant=tenant, state=state, run_id=run,
        correlation_id=correlation, external_job_id=job_id, limit=limit, offset=offset,
    )  # fmt: skip


@waits_app.command("cancel")
def waits_cancel(
    wait_id: Annotated[str, typer.Argument(help="The wait's id.")],
    as_json: JsonFlag = False,
) -> None:
    """Cancel a waiting wait (a resume with outcome `cancelled` is published)."""
    key = uuid_argument(wait_id, "wait")
    with connect(settings_for(kafka=False)) as conn:
        wait = get_wait(conn, key)
        if wait is None:
            fail([f"matcher: no wait {wait_id}"])
        if not cancel_wait(conn, wait.id):
            fail([f"matcher: wait {wait_id} is already {wait.state.value}"])
        cancelled = get_wait(conn, wait.id)
    if as_json:
        print_json(cancelled)
    else:
        say(f"wait {wait_id} cancelled")
