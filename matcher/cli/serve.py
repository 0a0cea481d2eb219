"""The long-running verbs: the daemon, the webhook ingress, and the migrations that come
before both. The daemon's and the ingress's modules are imported when their verb runs:
importing either costs seconds that every other verb would pay."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from matcher.auth.registry import RegistryError
from matcher.cli.app import app
from matcher.cli.output import (
    EXIT_FAILED,
    EXIT_NOT_MIGRATED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    JsonFlag,
    fail,
    one_line,
    print_json,
    say,
)
from matcher.cli.settings import configure_logging, quiet_clients, require_schema, settings_for
from matcher.config import ConfigError, load_ingress_settings
from matcher.kafka.topics import prepare_topics
from matcher.store.migrate import MigrationError
from matcher.store.migrate import migrate as apply_migrations


@app.command()
def run(
    admin_address: Annotated[
        str | None,
        typer.Option(
            envvar="MATCHER_ADMIN_ADDRESS",
            help="HOST:PORT of the admin HTTP API (health, metrics, explain).",
            show_default="127.0.0.1:9464",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Log one JSON object per line (MATCHER_LOG_FORMAT).")
    ] = False,
) -> None:
    """Run the daemon in the foreground until SIGTERM or Ctrl-C (then exit 0)."""
    from matcher.daemon.app import LoopFailed, StartupError  # the daemon: see the module
    from matcher.daemon.app import run as run_daemon

    overrides: dict[str, Any] = {}
    if admin_address is not None:
        overrides["admin_address"] = admin_address
    if as_json:
        overrides["log_format"] = "json"
    settings = settings_for(**overrides)
    if settings.producers_file is None and not settings.allow_unsigned:
        fail(
            [
                "matcher: configuration error: MATCHER_PRODUCERS_FILE is not set: without it "
                "no event can be authenticated (MATCHER_ALLOW_UNSIGNED=true accepts unsigned "
                "events, for local development)"
            ],
            code=EXIT_USAGE,
        )
    configure_logging(settings)
    require_schema(settings)
    try:
        asyncio.run(run_daemon(settings))
    except StartupError as exc:
        if isinstance(exc.__cause__, RegistryError):
            code = EXIT_USAGE
        elif "matcher migrate" in str(exc):  # a topic is missing
            code = EXIT_NOT_MIGRATED
        elif exc.__cause__ is not None:  # Kafka or Postgres did not answer
            code = EXIT_UNREACHABLE
        else:
            code = EXIT_FAILED
        fail([f"matcher: cannot start: {one_line(exc)}"], code)
    except LoopFailed as exc:
        fail([f"matcher: stopped because a loop failed: {exc} (the log above says why)"])


@app.command()
def ingress(
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            envvar="MATCHER_INGRESS_ADDRESS",
            help="HOST:PORT to listen on for webhooks (port 0: any free port).",
            show_default="127.0.0.1:8080",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Log one JSON object per line (MATCHER_LOG_FORMAT).")
    ] = False,
) -> None:
    """Run the webhook ingress until SIGTERM or Ctrl-C (then drain and exit 0).

    Serves POST /v1/webhooks/{producer}: authenticates the sender with the producer's keys
    and scheme from MATCHER_PRODUCERS_FILE, and answers 202 once Kafka acknowledged the
    record on the events topic (the daemon verifies it again). With MATCHER_DATABASE_URL
    it also serves POST /v1/callbacks/{token}: a wait's callback URL. Also /healthz,
    /readyz (Kafka reachable) and /metrics. Needs Kafka and the producers file; the
    database only for callbacks.
    """
    from matcher.ingress.server import run as run_ingress  # see the module

    overrides: dict[str, Any] = {}
    if address is not None:
        overrides["ingress_address"] = address
    if as_json:
        overrides["log_format"] = "json"
    try:
        settings = load_ingress_settings(**overrides)
    except ConfigError as exc:
        fail([f"matcher: configuration error: {p}" for p in exc.problems], code=EXIT_USAGE)
    if settings.producers_file is None:
        fail(
            [
                "matcher: configuration error: MATCHER_PRODUCERS_FILE is not set: the "
                "ingress authenticates every sender with the keys it names"
            ],
            code=EXIT_USAGE,
        )
    configure_logging(settings)
    try:
        asyncio.run(run_ingress(settings))
    except RegistryError as exc:
        fail([f"matcher: cannot start: {one_line(exc)}"], code=EXIT_USAGE)
    except OSError as exc:
        fail([f"matcher: cannot listen on {settings.ingress_address}: {exc.strerror or exc}"])


@app.command()
def migrate(
    topics: Annotated[
        bool,
        typer.Option(
            help="Also create the missing topics (events, resumes, dead letters) and give the "
            "events topic broker timestamps (message.timestamp.type=LogAppendTime). "
            "--no-topics needs no Kafka settings."
        ),
    ] = True,
    as_json: JsonFlag = False,
) -> None:
    """Apply pending database migrations and create the Kafka topics that are missing.

    Safe to run concurrently and repeatedly: an advisory lock serialises migrators and
    applied migrations are skipped.
    """
    settings = settings_for(kafka=topics)
    quiet_clients()
    try:
        applied = apply_migrations(settings.database_url.get_secret_value())
    except MigrationError as exc:
        fail([f"matcher: migrate: {one_line(exc)}"])
    done: list[str] = []
    if topics:
        try:
            done = asyncio.run(prepare_topics(settings))
        except RuntimeError as exc:  # the broker refused a topic
            fail([f"matcher: migrate: {one_line(exc)}"])
    if as_json:
        print_json(
            {
                "applied": [f"{m.version:04d}_{m.name}" for m in applied],
                "topics": done if topics else None,
            }
        )
        return
    for migration in applied:
        say(f"applied migration {migration.version:04d}_{migration.name}")
    if not applied:
        say("database schema is up to date")
    for line in done:
        say(line)
    if topics and not done:
        say("topics exist")
