"""The ``matcher`` command line: the daemon, migrations, and the local stack."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
import time
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from matcher.config import ConfigError, Settings, load_settings

app = typer.Typer(
    help="matcher: durable waits for agent runs. Completion events from Kafka are matched "
    "to stored waits exactly once, and resumes are published for the next worker.\n\n"
    'Every setting is a MATCHER_* environment variable; `eval "$(matcher devstack env)"` '
    "points them at the local stack.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
devstack_app = typer.Typer(
    help="A local Apache Kafka (KRaft) and PostgreSQL for development and tests, kept in "
    ".devstack/ at the project root (or MATCHER_DEVSTACK_DIR).",
    no_args_is_help=True,
)
app.add_typer(devstack_app, name="devstack")

err = Console(stderr=True)
out = Console()


def _fail(lines: list[str], code: int = 1) -> NoReturn:
    for line in lines:
        print(line, file=sys.stderr)  # unwrapped: one line per problem, even on a narrow tty
    raise typer.Exit(code)


def _settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        _fail([f"matcher: configuration error: {p}" for p in exc.problems], code=2)


def _configure_logging(settings: Settings) -> None:
    from matcher import logs

    logs.configure(settings.log_level, settings.log_format)


@app.command()
def run() -> None:
    """Run the daemon in the foreground until SIGTERM or Ctrl-C (then exit 0)."""
    from matcher.daemon.app import StartupError
    from matcher.daemon.app import run as run_daemon

    settings = _settings()
    _configure_logging(settings)
    try:
        asyncio.run(run_daemon(settings))
    except StartupError as exc:
        _fail([f"matcher: cannot start: {exc}"])


@app.command()
def migrate(
    topics: Annotated[
        bool, typer.Option(help="Also create the events and resume topics if missing.")
    ] = True,
) -> None:
    """Apply pending database migrations and create the Kafka topics that are missing.

    Safe to run concurrently and repeatedly: an advisory lock serialises migrators and
    applied migrations are skipped.
    """
    from matcher.kafka.topics import ensure_topics
    from matcher.store.migrate import MigrationError
    from matcher.store.migrate import migrate as apply_migrations

    settings = _settings()
    try:
        applied = apply_migrations(settings.database_url.get_secret_value())
    except MigrationError as exc:
        _fail([f"matcher: migrate: {exc}"])
    for migration in applied:
        out.print(f"applied migration {migration.version:04d}_{migration.name}")
    if not applied:
        out.print("database schema is up to date")
    if topics:
        created = asyncio.run(
            ensure_topics(
                settings.kafka_client_options(),
                [settings.events_topic, settings.resume_topic],
                partitions=settings.topic_partitions,
                replication_factor=settings.topic_replication_factor,
            )
        )
        for name in created:
            out.print(f"created topic {name} ({settings.topic_partitions} partitions)")
        if not created:
            out.print("topics exist")


@devstack_app.command("up")
def devstack_up(
    fresh: Annotated[bool, typer.Option(help="Wipe Kafka's and Postgres' data first.")] = False,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for each service to become ready.")
    ] = 120.0,
) -> None:
    """Start Kafka and Postgres (idempotent: running services are left alone)."""
    from matcher.devstack.procs import DevstackError
    from matcher.devstack.stack import Devstack

    stack = Devstack()
    started = time.monotonic()
    try:
        with err.status("starting the devstack (the first start downloads Kafka's jars)"):
            stack.up(fresh=fresh, timeout=timeout)
    except DevstackError as exc:
        _fail([f"matcher devstack: {exc}"])
    err.print(f"devstack up in {time.monotonic() - started:.1f}s ({stack.home})")
    for key, value in stack.env().items():
        err.print(f"  {key}={value}", markup=False, highlight=False)


@devstack_app.command("down")
def devstack_down() -> None:
    """Stop Kafka and Postgres; their data is kept for the next `up`."""
    from matcher.devstack.procs import DevstackError
    from matcher.devstack.stack import Devstack

    try:
        Devstack().down()
    except DevstackError as exc:
        _fail([f"matcher devstack: {exc}"])
    err.print("devstack down")


@devstack_app.command("status")
def devstack_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show whether each service runs, where, and its log. Exit 1 if one is down."""
    from matcher.devstack.stack import Devstack
    from matcher.devstack.stack import as_json as statuses_json

    statuses = Devstack().status()
    if as_json:
        print(json.dumps(statuses_json(statuses), indent=2))
    else:
        table = Table("service", "state", "pid", "address", "log")
        for s in statuses:
            state = "[green]running[/]" if s.running else "[red]stopped[/]"
            table.add_row(s.name, state, str(s.pid or "-"), s.address, s.log)
        out.print(table)
    if not all(s.running for s in statuses):
        raise typer.Exit(1)


@devstack_app.command("env")
def devstack_env(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print shell exports for the stack: eval "$(matcher devstack env)"."""
    from matcher.devstack.procs import DevstackError
    from matcher.devstack.stack import Devstack

    try:
        variables = Devstack().env()
    except DevstackError as exc:
        _fail([f"matcher devstack: {exc}"])
    if as_json:
        print(json.dumps(variables))
    else:
        for key, value in variables.items():
            print(f"export {key}={shlex.quote(value)}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
