"""``matcher worker``: the resume worker, running your handler (as Celery, arq or Temporal
workers run theirs); and ``matcher resumes retry``: parked resumes given back to it."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Annotated, Any

import typer
from prometheus_client import disable_created_metrics, start_http_server

from matcher.cli.app import app
from matcher.cli.output import EXIT_USAGE, JsonFlag, fail, print_json, say
from matcher.cli.resumes import resumes_app
from matcher.cli.settings import (
    configure_logging,
    connect,
    load_object,
    quiet_clients,
    settings_for,
    uuid_argument,
)
from matcher.config import ConfigError, host_port, load_worker_settings
from matcher.sdk.worker import serve
from matcher.store.recovery import retry_parked


@app.command()
def worker(
    handler: Annotated[
        str,
        typer.Option(
            help="Your handler: module:function (importable from the current directory), or "
            "a matcher.handlers entry point. `async def handle(tx, resume)` or "
            "`def handle(tx, resume)`: tx is the transaction that advances the run."
        ),
    ],
    tenant: Annotated[
        list[str] | None,
        typer.Option(help="Only resumes of this tenant; repeat for several (default: all)."),
    ] = None,
    run_prefix: Annotated[
        str | None, typer.Option(help="Only resumes whose run id starts with this.")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, max=1000, help="Handlers at once (default 8).")
    ] = None,
    metrics_address: Annotated[
        str | None, typer.Option(help="HOST:PORT to serve Prometheus metrics on.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Log one JSON object per line.")] = False,
) -> None:
    """Consume the resume topic and, for each resume, advance its run and call the handler
    in one transaction, until SIGTERM or Ctrl-C (then finish or roll back, and exit 0).
    Settings: MATCHER_DATABASE_URL, MATCHER_KAFKA_BOOTSTRAP_SERVERS, MATCHER_RESUME_TOPIC
    and MATCHER_WORKER_* (docs/reference/configuration.md)."""
    overrides: dict[str, Any] = {}
    if tenant:
        overrides["worker_tenants"] = tenant
    if run_prefix is not None:
        overrides["worker_run_prefix"] = run_prefix
    if concurrency is not None:
        overrides["worker_concurrency"] = concurrency
    if metrics_address is not None:
        overrides["worker_metrics_address"] = metrics_address
    if as_json:
        overrides["log_format"] = "json"
    try:
        settings = load_worker_settings(**overrides)
    except ConfigError as exc:
        fail([f"matcher: configuration error: {p}" for p in exc.problems], code=EXIT_USAGE)
    sys.path.insert(0, os.getcwd())  # the handler's module, as `python -m` would find it
    function = load_object(handler, "--handler", "matcher.handlers")
    if not callable(function):
        fail([f"matcher: --handler {handler}: not a function"], code=EXIT_USAGE)
    configure_logging(settings)
    if settings.worker_metrics_address is not None:
        serve_metrics(settings.worker_metrics_address)
    asyncio.run(serve(function, settings))


def serve_metrics(address: str) -> None:
    """The worker's metrics over HTTP at ``address`` (HOST:PORT), without ``*_created``
    series (one per counter and histogram, a timestamp nothing reads). Only the worker
    command does this: a worker embedded in another program leaves that program's
    metrics as they are."""
    disable_created_metrics()  # type: ignore[no-untyped-call]  # (untyped upstream)
    host, port = host_port(address)
    start_http_server(port, addr=host)


@resumes_app.command("retry")
def resumes_retry(
    run: Annotated[str | None, typer.Option(help="The parked resumes of this run.")] = None,
    tenant: Annotated[str | None, typer.Option(help="The run's tenant (with --run).")] = None,
    wait: Annotated[str | None, typer.Option(help="The parked resume of this wait.")] = None,
    resolution: Annotated[str | None, typer.Option(help="This resolution's resume.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Give parked resumes back to the workers (after fixing what failed them): their
    attempts start again, and a worker's next sweep of the database hands them to its
    handler."""
    if sum(x is not None for x in (run, wait, resolution)) != 1:
        fail(["matcher: give one of --run, --wait or --resolution"], code=EXIT_USAGE)
    if run is not None and tenant is None:
        fail(["matcher: --run needs --tenant (run ids may repeat across tenants)"], EXIT_USAGE)
    wait_id = None if wait is None else uuid_argument(wait, "wait")
    resolution_id = None if resolution is None else uuid_argument(resolution, "resolution")
    quiet_clients()
    with connect(settings_for(kafka=False)) as conn:
        count = retry_parked(
            conn, tenant=tenant, run_id=run, wait_id=wait_id, resolution_id=resolution_id
        )
    if as_json:
        print_json({"retried": count})
    else:
        say(f"{count} parked resume(s) given back to the workers")


__all__ = ["resumes_retry", "worker"]
