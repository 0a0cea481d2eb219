"""Launch intents: ``matcher launches show`` and ``matcher reconcile``."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Annotated

import typer

from matcher.cli.app import app, sub_app
from matcher.cli.output import JsonFlag, fail, print_json, say, when
from matcher.cli.settings import connect, load_object, settings_for, uuid_argument
from matcher.domain.events import BIGINT_MAX
from matcher.store.launches import audit_trail, get_launch
from matcher.store.launches import reconcile as run_reconcile

launches_app = sub_app("Launch intents and their audit trail.")


# The bound of `reconcile --older-than`: further back than any intent, and near enough that
# the time it names is a timestamp Postgres can hold.
_CENTURY_S = 100 * 365.25 * 86400


@app.command()
def reconcile(
    reconciler: Annotated[
        str,
        typer.Option(
            help="Your lookup: module:function, or a matcher.reconcilers entry point name. "
            "It gets a Launch and answers Found(external_job_id), NotFound() or Unknown(reason)."
        ),
    ],
    older_than: Annotated[
        float,
        typer.Option(
            min=0,
            max=_CENTURY_S,
            help="Only intents older than this many seconds (at most 100 years).",
        ),
    ] = 300.0,
    limit: Annotated[
        int, typer.Option(min=1, max=BIGINT_MAX, help="At most this many intents per run.")
    ] = 1000,
    as_json: JsonFlag = False,
) -> None:
    """Reconcile launch intents that never recorded a job id (the worker died around the
    external call): ask the external system, by idempotency key, what became of each."""
    settings = settings_for(kafka=False)
    function = load_object(reconciler, "--reconciler", "matcher.reconcilers")
    with connect(settings) as conn:
        results = asyncio.run(
            run_reconcile(
                conn,
                function,
                actor=reconciler,
                older_than=timedelta(seconds=older_than),
                limit=limit,
            )
        )
    if as_json:
        print_json([r.__dict__ for r in results])
        return
    for r in results:
        extra = f" job {r.external_job_id}" if r.external_job_id else ""
        note = f" ({r.detail})" if r.detail else ""
        say(f"{r.launch_id} run {r.run_id}: {r.answer}{extra}{note}")
    if not results:
        say("no launch intents to reconcile")


@launches_app.command("show")
def launches_show(
    launch_id: Annotated[str, typer.Argument(help="The launch's id.")],
    as_json: JsonFlag = False,
) -> None:
    """A launch intent and its audit trail."""
    key = uuid_argument(launch_id, "launch")
    with connect(settings_for(kafka=False)) as conn:
        launch = get_launch(conn, key)
        if launch is None:
            fail([f"matcher: no launch {launch_id}"])
        trail = audit_trail(conn, launch.id)
    if as_json:
        print_json({**launch.model_dump(), "audit": trail})
        return
    say(
        f"launch {launch.id} run {launch.run_id} pos {launch.position}: {launch.state.value}, "
        f"key {launch.idempotency_key}, correlation {launch.correlation_id}, "
        f"job {launch.external_job_id or '-'}"
    )
    for entry in trail:
        say(
            f"  {when(entry['at'])} {entry['actor']}: {entry['answer']}"
            + (f" {entry['external_job_id']}" if entry["external_job_id"] else "")
        )
