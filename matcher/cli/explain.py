"""``matcher explain``: why a run is where it is."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import psycopg
import typer

from matcher.admin.explain import explain_run, explanation_body
from matcher.admin.filters import RunFilters
from matcher.cli.app import app
from matcher.cli.output import EXIT_USAGE, JsonFlag, fail, print_json, say
from matcher.cli.settings import parse_filters, quiet_clients, settings_for
from matcher.logs import quoted
from matcher.store.explain import AmbiguousRun, UnknownRun


@app.command()
def explain(
    run_id: Annotated[str, typer.Argument(help="The run to explain.")],
    tenant: Annotated[
        str | None, typer.Option(help="The run's tenant (needed when run ids repeat).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Why a run is where it is: resolved (by which event, or deadline, or cancel), or
    still waiting because of a missing signal, a mismatch, or a backlog. Needs Postgres;
    the consumer lag comes from Kafka when MATCHER_KAFKA_BOOTSTRAP_SERVERS is set."""
    # As `waits list` checks its filters: an argument that is not UTF-8 (or not storable)
    # is bad input, not a query.
    parse_filters(RunFilters, {"run_id": "RUN"}, run_id=run_id, tenant=tenant)
    settings = settings_for(kafka=False)
    quiet_clients()

    async def go() -> Any:
        async with await psycopg.AsyncConnection.connect(
            settings.database_url.get_secret_value(), autocommit=True
        ) as conn:
            return await explain_run(settings, conn, run_id, tenant)

    try:
        explanation = asyncio.run(go())
    except UnknownRun:
        fail([f"matcher: no waits for run {quoted(run_id)}"])
    except AmbiguousRun as exc:
        fail([f"matcher: {exc}: give --tenant"], code=EXIT_USAGE)
    wait = explanation.evidence["wait"]
    if as_json:
        print_json(explanation_body(run_id, explanation))
        return
    say(
        f"run {run_id} ({wait['tenant']}), position {wait['position']}, wait "
        f"{wait['id']}: {explanation.verdict.value}"
    )
    for reason in explanation.reasons:
        say(f"  - {reason}")
