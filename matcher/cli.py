"""The ``matcher`` command line: the daemon, migrations, inspection, and the local stack.

Every expected failure is one line on stderr, ``matcher: ...``, and one of these exit codes
(the README lists them too):

- 0: done;
- 1: the operation failed (no such run, wait or launch; a wait already resolved; a loop of
  the daemon died; a migration refused);
- 2: bad usage or configuration (an unknown option, a bad option value, a bad MATCHER_*
  setting, an unreadable producers or key file);
- 3: a service could not be reached, or failed: Postgres or Kafka;
- 4: the database or Kafka is not set up for this matcher (no matcher schema, an older
  one, a missing topic): run ``matcher migrate``;
- 130: interrupted (Ctrl-C).

Every option can also come from the environment: ``MATCHER_<COMMAND>_<OPTION>``, the
option's own name in capitals with dashes as underscores (``matcher waits list --job-id``
is ``MATCHER_WAITS_LIST_JOB_ID``, ``matcher explain --json`` is ``MATCHER_EXPLAIN_JSON``);
``--help`` shows each one.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import shlex
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import BaseModel, SecretStr, ValidationError, field_validator
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer import _click as click  # typer vendors click: its commands are these
from typer._click import exceptions as click_errors
from typer.core import TyperGroup, TyperOption

from matcher import __version__
from matcher.config import KafkaSettings, Settings, _describe
from matcher.domain.events import BIGINT_MAX
from matcher.logs import escape, quoted

if TYPE_CHECKING:
    from matcher.store.views import View

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_MIGRATED = 4
EXIT_INTERRUPTED = 130

_HELP = (
    "matcher: durable waits for agent runs. Completion events from Kafka are matched to "
    "stored waits exactly once, and resumes are published for the next worker.\n\n"
    'Every setting is a MATCHER_* environment variable; `eval "$(matcher devstack env)"` '
    "points them at the local stack. Every option can also be set as "
    "MATCHER_<COMMAND>_<OPTION> (e.g. MATCHER_WAITS_LIST_JOB_ID, MATCHER_EXPLAIN_JSON).\n\n"
    "Exit codes: 0 done, 1 the operation failed, 2 bad usage or configuration, 3 Postgres "
    "or Kafka unreachable, 4 not migrated (run `matcher migrate`), 130 interrupted."
)


def _typer(help_text: str) -> typer.Typer:
    # No markup in help texts: "[keys]" is a TOML table, not a style.
    return typer.Typer(help=help_text, no_args_is_help=True, rich_markup_mode=None)


app = typer.Typer(
    help=_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"show_default": True},
)
devstack_app = _typer(
    "A local Apache Kafka (KRaft) and PostgreSQL for development and tests, kept in "
    ".devstack/ at the project root (or MATCHER_DEVSTACK_DIR). One broker and one server "
    "by default; `up --brokers 3 --standby` runs a cluster and a synchronous standby, "
    "which the stop-, start-, pause-, resume-broker, failover and rejoin commands break "
    "on purpose."
)
app.add_typer(devstack_app, name="devstack")
waits_app = _typer("Register, list and cancel waits.")
app.add_typer(waits_app, name="waits")
events_app = _typer("Look at the event inbox.")
app.add_typer(events_app, name="events")
resumes_app = _typer("Read the resume topic.")
app.add_typer(resumes_app, name="resumes")
launches_app = _typer("Launch intents and their audit trail.")
app.add_typer(launches_app, name="launches")
quarantine_app = _typer("Rejected records: see why, and replay them after fixing the cause.")
app.add_typer(quarantine_app, name="quarantine")

err = Console(stderr=True)
out = Console()

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _version(value: bool) -> None:
    if value:
        _say(f"matcher {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    pass


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _say(line: str, *, stderr: bool = False) -> None:
    """Print a line for a person. Every human-readable line goes through here (tables
    through ``_table``): what it shows is often stored text a sender chose, or an argument
    that is not UTF-8, and a terminal would act on the control characters in it."""
    print(escape(line), file=sys.stderr if stderr else sys.stdout, flush=True)


def _fail(lines: Sequence[str], code: int = EXIT_FAILED) -> NoReturn:
    for line in lines:
        _say(line, stderr=True)  # unwrapped: one line per problem, even on a narrow tty
    raise typer.Exit(code)


# Settings. A verb asks only for the services it uses: `waits list` needs no Kafka
# settings, `emit` no database URL.


class _AnyServices(Settings):
    """The settings with both services optional (empty: not configured)."""

    kafka_bootstrap_servers: str = ""
    database_url: SecretStr = SecretStr("")

    @field_validator("kafka_bootstrap_servers")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        return value if value == "" else Settings._check_bootstrap(value)

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: SecretStr) -> SecretStr:
        return value if value.get_secret_value() == "" else Settings._check_database_url(value)


def _settings(*, postgres: bool = True, kafka: bool = True, **overrides: Any) -> Settings:
    problems: list[str] = []
    settings: Settings | None = None
    try:
        settings = _AnyServices(**overrides)
    except ValidationError as exc:
        problems = [_describe(e) for e in exc.errors()]
    wanted = {"database_url": postgres, "kafka_bootstrap_servers": kafka}
    for field, needed in wanted.items():
        if needed and not _given(field, settings, overrides):
            problems.append(f"MATCHER_{field.upper()}: required, not set")
    if problems or settings is None:
        _fail([f"matcher: configuration error: {p}" for p in problems], code=EXIT_USAGE)
    return settings


def _given(field: str, settings: Settings | None, overrides: Mapping[str, Any]) -> bool:
    if settings is not None:
        value = getattr(settings, field)
        return bool(value.get_secret_value() if isinstance(value, SecretStr) else value)
    # The settings did not validate: was the variable given at all? (Read as pydantic-
    # settings reads it: case-insensitively, empty meaning unset here.)
    variable = f"MATCHER_{field.upper()}"
    return bool(overrides.get(field)) or any(
        name.upper() == variable and value for name, value in os.environ.items()
    )


def _configure_logging(settings: KafkaSettings) -> None:
    from matcher import logs

    logs.configure(settings.log_level, settings.log_format)


def _quiet_clients() -> None:
    """For the verbs that are Kafka clients (not the daemon): the Kafka client's own log
    lines ("Unable connect to ...") are not for the person at the terminal, who gets one
    line saying what failed."""
    for name in ("aiokafka", "kafka", "matcher.lag"):
        logger = logging.getLogger(name)
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


# Output: JSON with every timestamp in RFC 3339 UTC ("...Z"), tables without markup.


def _print_json(value: Any) -> None:
    from matcher.admin.explain import jsonable

    if isinstance(value, BaseModel):
        value = value.model_dump()
    elif isinstance(value, list):
        value = [v.model_dump() if isinstance(v, BaseModel) else v for v in value]
    print(json.dumps(jsonable(value)), flush=True)


def _when(moment: datetime | None) -> str:
    from matcher.domain.explain import rfc3339

    return "-" if moment is None else rfc3339(moment, seconds=True)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    # Cells are Text, not markup, and escaped: a tenant or a quarantine detail is whatever
    # a record said, "[red]" and ESC included.
    table = Table(*headers)
    for row in rows:
        table.add_row(*(Text(escape(str(cell))) for cell in row))
    out.print(table)


def _validation_lines(exc: ValidationError, options: Mapping[str, str]) -> list[str]:
    lines = []
    for e in exc.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        option = options.get(field, "--" + field.replace("_", "-"))
        message = str(e["msg"]).removeprefix("Value error, ")
        lines.append(f"matcher: {option} {quoted(e['input'])}: {message}")
    return lines


def _filters(model: type[Any], options: Mapping[str, str], **values: Any) -> Any:
    """The shared filter model of a list (matcher.admin.filters), or exit 2 naming the
    option that is wrong."""
    try:
        return model(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        _fail(_validation_lines(exc, options), code=EXIT_USAGE)


def _connect(settings: Settings) -> Any:
    import psycopg

    try:
        return psycopg.connect(settings.database_url.get_secret_value(), autocommit=True)
    except psycopg.OperationalError as exc:
        _fail([f"matcher: cannot reach Postgres: {_one_line(exc)}"], code=EXIT_UNREACHABLE)


def _require_schema(settings: Settings) -> None:
    """Before the daemon starts: Postgres answers (within the startup timeout) and has
    every migration, so a missing schema is said at once rather than by a dying loop."""
    import psycopg

    from matcher.store.migrate import schema_problem

    deadline = time.monotonic() + settings.startup_timeout_s
    while True:
        try:
            with psycopg.connect(
                settings.database_url.get_secret_value(), autocommit=True, connect_timeout=5
            ) as conn:
                problem = schema_problem(conn)
            break
        except psycopg.OperationalError as exc:
            if time.monotonic() >= deadline:
                _fail(
                    [f"matcher: cannot start: Postgres did not answer: {_one_line(exc)}"],
                    code=EXIT_UNREACHABLE,
                )
            time.sleep(0.5)
    if problem is not None:
        _fail([f"matcher: cannot start: {problem}: run `matcher migrate`"], EXIT_NOT_MIGRATED)


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
    from matcher.auth.registry import RegistryError
    from matcher.daemon.app import LoopFailed, StartupError
    from matcher.daemon.app import run as run_daemon

    overrides: dict[str, Any] = {}
    if admin_address is not None:
        overrides["admin_address"] = admin_address
    if as_json:
        overrides["log_format"] = "json"
    settings = _settings(**overrides)
    if settings.producers_file is None and not settings.allow_unsigned:
        _fail(
            [
                "matcher: configuration error: MATCHER_PRODUCERS_FILE is not set: without it "
                "no event can be authenticated (MATCHER_ALLOW_UNSIGNED=true accepts unsigned "
                "events, for local development)"
            ],
            code=EXIT_USAGE,
        )
    _configure_logging(settings)
    _require_schema(settings)
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
        _fail([f"matcher: cannot start: {_one_line(exc)}"], code)
    except LoopFailed as exc:
        _fail([f"matcher: stopped because a loop failed: {exc} (the log above says why)"])


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
    record on the events topic (the daemon verifies it again). Also /healthz, /readyz
    (Kafka reachable) and /metrics. Needs Kafka and the producers file, no database.
    """
    from matcher.auth.registry import RegistryError
    from matcher.config import ConfigError, load_ingress_settings
    from matcher.ingress.server import run as run_ingress

    overrides: dict[str, Any] = {}
    if address is not None:
        overrides["ingress_address"] = address
    if as_json:
        overrides["log_format"] = "json"
    try:
        settings = load_ingress_settings(**overrides)
    except ConfigError as exc:
        _fail([f"matcher: configuration error: {p}" for p in exc.problems], code=EXIT_USAGE)
    if settings.producers_file is None:
        _fail(
            [
                "matcher: configuration error: MATCHER_PRODUCERS_FILE is not set: the "
                "ingress authenticates every sender with the keys it names"
            ],
            code=EXIT_USAGE,
        )
    _configure_logging(settings)
    try:
        asyncio.run(run_ingress(settings))
    except RegistryError as exc:
        _fail([f"matcher: cannot start: {_one_line(exc)}"], code=EXIT_USAGE)
    except OSError as exc:
        _fail([f"matcher: cannot listen on {settings.ingress_address}: {exc.strerror or exc}"])


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
    from matcher.kafka.topics import prepare_topics
    from matcher.store.migrate import MigrationError
    from matcher.store.migrate import migrate as apply_migrations

    settings = _settings(kafka=topics)
    _quiet_clients()
    try:
        applied = apply_migrations(settings.database_url.get_secret_value())
    except MigrationError as exc:
        _fail([f"matcher: migrate: {_one_line(exc)}"])
    done: list[str] = []
    if topics:
        try:
            done = asyncio.run(prepare_topics(settings))
        except RuntimeError as exc:  # the broker refused a topic
            _fail([f"matcher: migrate: {_one_line(exc)}"])
    if as_json:
        _print_json(
            {
                "applied": [f"{m.version:04d}_{m.name}" for m in applied],
                "topics": done if topics else None,
            }
        )
        return
    for migration in applied:
        _say(f"applied migration {migration.version:04d}_{migration.name}")
    if not applied:
        _say("database schema is up to date")
    for line in done:
        _say(line)
    if topics and not done:
        _say("topics exist")


def _devstack() -> Any:
    """The project's devstack, found from anywhere inside the project (see
    ``matcher.devstack.stack.default_home``)."""
    from matcher.devstack.stack import Devstack

    return Devstack()


def _devstack_fail(exc: Exception) -> NoReturn:
    from matcher.devstack.procs import DevstackUsageError

    code = EXIT_USAGE if isinstance(exc, DevstackUsageError) else EXIT_FAILED
    _fail([f"matcher devstack: {_one_line(exc)}"], code=code)


@devstack_app.command("up")
def devstack_up(
    fresh: Annotated[bool, typer.Option(help="Wipe Kafka's and Postgres' data first.")] = False,
    brokers: Annotated[
        int | None,
        typer.Option(
            help="Kafka brokers: 1 (the default stack), or 3 (a cluster with a dedicated "
            "controller; topics default to 3 replicas, 2 in sync). Unset: as the stack "
            "already is.",
            show_default=False,
        ),
    ] = None,
    standby: Annotated[
        bool | None,
        typer.Option(
            "--standby/--no-standby",
            help="A synchronous streaming standby of Postgres, for `failover`. Unset: as "
            "the stack already is.",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=1, help="Seconds to wait for each service to become ready.")
    ] = 120.0,
    as_json: JsonFlag = False,
) -> None:
    """Start Kafka and Postgres (idempotent: running services are left alone). The mode
    (--brokers, --standby) is remembered: a later `up` brings back the same."""
    from matcher.devstack.procs import DevstackError
    from matcher.devstack.stack import as_json as statuses_json

    stack = _devstack()
    started = time.monotonic()
    try:
        with err.status("starting the devstack (the first start downloads Kafka's jars)"):
            stack.up(fresh=fresh, brokers=brokers, standby=standby, timeout=timeout)
    except DevstackError as exc:
        _devstack_fail(exc)
    if as_json:
        _print_json(
            {"home": str(stack.home), "services": statuses_json(stack.status()), "env": stack.env()}
        )
        return
    err.print(f"devstack up in {time.monotonic() - started:.1f}s ({stack.home})", markup=False)
    for key, value in stack.env().items():
        err.print(f"  {key}={value}", markup=False, highlight=False)


@devstack_app.command("down")
def devstack_down(
    purge: Annotated[
        bool, typer.Option(help="Also delete the data (not the jar cache): start over.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Stop Kafka and Postgres; their data is kept for the next `up` (unless --purge)."""
    from matcher.devstack.procs import DevstackError
    from matcher.devstack.stack import as_json as statuses_json

    stack = _devstack()
    try:
        stack.down(purge=purge)
    except DevstackError as exc:
        _devstack_fail(exc)
    if as_json:
        _print_json({"home": str(stack.home), "services": statuses_json(stack.status())})
        return
    err.print("devstack down, data deleted" if purge else "devstack down")


@devstack_app.command("status")
def devstack_status(as_json: JsonFlag = False) -> None:
    """Show whether each service runs (each broker and Postgres node in cluster mode: its
    node id, role, port, and whether it is paused), where, and its log. Exit 1 if one is
    down."""
    from matcher.devstack.stack import as_json as statuses_json

    statuses = _devstack().status()
    if as_json:
        print(json.dumps(statuses_json(statuses), indent=2))
    else:
        table = Table("service", "role", "state", "pid", "address", "log")
        for s in statuses:
            state = "[green]running[/]" if s.running else "[red]stopped[/]"
            if s.paused:
                state = "[yellow]paused[/]"
            table.add_row(s.name, s.role, state, str(s.pid or "-"), Text(s.address), Text(s.log))
        out.print(table)
    if not all(s.running for s in statuses):
        raise typer.Exit(EXIT_FAILED)


@devstack_app.command("env")
def devstack_env(as_json: JsonFlag = False) -> None:
    """Print shell exports for the stack: eval "$(matcher devstack env)". Works from any
    directory inside the project. With several brokers, every one is listed; with a
    standby, the database URL names both servers, the primary first, and connects to the
    one that takes writes (target_session_attrs=read-write)."""
    from matcher.devstack.procs import DevstackError

    try:
        variables = _devstack().env()
    except DevstackError as exc:
        _fail([f"matcher devstack: {_one_line(exc)}"])
    if as_json:
        print(json.dumps(variables))
    else:
        for key, value in variables.items():
            _say(f"export {key}={shlex.quote(value)}")


BrokerArg = Annotated[int, typer.Argument(help="The broker's node id (1, 2, 3).", min=0)]
StackTimeout = Annotated[float, typer.Option(min=1, help="Seconds to wait at most.")]


def _devstack_verb(action: Any, as_json: bool, line: Any) -> None:
    """Run a break-it verb: its result as JSON, or ``line(result)`` on stderr."""
    from matcher.devstack.procs import DevstackError

    try:
        result = action()
    except DevstackError as exc:
        _devstack_fail(exc)
    if as_json:
        _print_json(result)
    else:
        err.print(line(result), markup=False, highlight=False)


@devstack_app.command("stop-broker")
def devstack_stop_broker(
    node_id: BrokerArg, timeout: StackTimeout = 30.0, as_json: JsonFlag = False
) -> None:
    """Crash a broker: SIGKILL, no controlled shutdown. Returns once the process is gone;
    its data stays for `start-broker`."""
    _devstack_verb(
        lambda: _devstack().stop_broker(node_id, timeout=timeout),
        as_json,
        lambda r: (
            f"broker {node_id} killed (pid {r['pid']})"
            if r["was_running"]
            else f"broker {node_id} was not running"
        ),
    )


@devstack_app.command("start-broker")
def devstack_start_broker(
    node_id: BrokerArg, timeout: StackTimeout = 120.0, as_json: JsonFlag = False
) -> None:
    """Start a broker again on its ports and data; returns once it answers a metadata
    request listing itself (a paused one is resumed)."""
    _devstack_verb(
        lambda: _devstack().start_broker(node_id, timeout=timeout),
        as_json,
        lambda r: f"broker {node_id} answers on 127.0.0.1:{r['port']} ({r['seconds']:.1f}s)",
    )


@devstack_app.command("pause-broker")
def devstack_pause_broker(
    node_id: BrokerArg,
    seconds: Annotated[float, typer.Argument(help="How long it stays frozen.", min=0)],
    as_json: JsonFlag = False,
) -> None:
    """Freeze a broker (SIGSTOP) for SECONDS, then thaw it (SIGCONT); blocks meanwhile.
    The broker is thawed whatever ends the wait: Ctrl-C, SIGTERM, SIGHUP, an error."""
    stack = _devstack()

    def paused(pid: int) -> None:
        err.print(f"broker {node_id} paused (pid {pid}) for {seconds:g}s", markup=False)

    _devstack_verb(
        lambda: stack.pause_broker(node_id, seconds, on_paused=paused),
        as_json,
        lambda r: f"broker {node_id} resumed after {r['paused_s']:.1f}s",
    )


@devstack_app.command("resume-broker")
def devstack_resume_broker(node_id: BrokerArg, as_json: JsonFlag = False) -> None:
    """Thaw a broker now (SIGCONT): for a pause that was left behind."""
    _devstack_verb(
        lambda: _devstack().resume_broker(node_id),
        as_json,
        lambda r: (
            f"broker {node_id} resumed" if r["was_paused"] else f"broker {node_id} was not paused"
        ),
    )


@devstack_app.command("failover")
def devstack_failover(
    no_rejoin: Annotated[
        bool, typer.Option("--no-rejoin", help="Leave the old primary down (see `rejoin`).")
    ] = False,
    timeout: StackTimeout = 120.0,
    as_json: JsonFlag = False,
) -> None:
    """Crash the Postgres primary (SIGKILL to the postmaster and each of its processes),
    promote the standby, and wait until it takes writes; then rewind the old primary
    (pg_rewind) and make it the new synchronous standby. Needs `up --standby`."""

    def line(r: dict[str, Any]) -> str:
        said = f"promoted pg{r['promoted']['node']} in {r['promotion_s']:.1f}s"
        if r["rejoined"]:
            return f"{said}; pg{r['killed']['node']} rejoined as its standby ({r['rejoin_s']:.1f}s)"
        return f"{said}; pg{r['killed']['node']} is down: `matcher devstack rejoin` brings it back"

    _devstack_verb(
        lambda: _devstack().failover(rejoin=not no_rejoin, timeout=timeout), as_json, line
    )


@devstack_app.command("rejoin")
def devstack_rejoin(timeout: StackTimeout = 120.0, as_json: JsonFlag = False) -> None:
    """Make the Postgres node that is not the primary its synchronous standby again:
    rewind a failed-over former primary (pg_rewind), or start a stopped standby."""
    _devstack_verb(
        lambda: _devstack().rejoin(timeout=timeout),
        as_json,
        lambda r: f"pg{r['node']} streams as the synchronous standby ({r['rejoin_s']:.1f}s)",
    )


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
    import psycopg

    from matcher.admin.explain import explain_run, explanation_body
    from matcher.admin.filters import RunFilters
    from matcher.store.explain import AmbiguousRun, UnknownRun

    # As `waits list` checks its filters: an argument that is not UTF-8 (or not storable)
    # is bad input, not a query.
    _filters(RunFilters, {"run_id": "RUN"}, run_id=run_id, tenant=tenant)
    settings = _settings(kafka=False)
    _quiet_clients()

    async def go() -> Any:
        async with await psycopg.AsyncConnection.connect(
            settings.database_url.get_secret_value(), autocommit=True
        ) as conn:
            return await explain_run(settings, conn, run_id, tenant)

    try:
        explanation = asyncio.run(go())
    except UnknownRun:
        _fail([f"matcher: no waits for run {quoted(run_id)}"])
    except AmbiguousRun as exc:
        _fail([f"matcher: {exc}: give --tenant"], code=EXIT_USAGE)
    wait = explanation.evidence["wait"]
    if as_json:
        _print_json(explanation_body(run_id, explanation))
        return
    _say(
        f"run {run_id} ({wait['tenant']}), position {wait['position']}, wait "
        f"{wait['id']}: {explanation.verdict.value}"
    )
    for reason in explanation.reasons:
        _say(f"  - {reason}")


# The bound of `reconcile --older-than`: further back than any intent, and near enough that
# the time it names is a timestamp Postgres can hold.
_CENTURY_S = 100 * 365.25 * 86400


def _load_reconciler(spec: str) -> Any:
    """``module:attribute``, or the name of a ``matcher.reconcilers`` entry point."""
    import importlib
    from importlib.metadata import entry_points

    if ":" in spec:
        module_name, _, attribute = spec.partition(":")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            _fail([f"matcher: --reconciler {quoted(spec)}: {exc}"], code=EXIT_USAGE)
        return target
    found = entry_points(group="matcher.reconcilers", name=spec)
    if not found:
        where = "no such entry point in group matcher.reconcilers"
        _fail([f"matcher: --reconciler {quoted(spec)}: {where}"], EXIT_USAGE)
    return next(iter(found)).load()


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
    from matcher.store.launches import reconcile as run_reconcile

    settings = _settings(kafka=False)
    function = _load_reconciler(reconciler)
    with _connect(settings) as conn:
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
        _print_json([r.__dict__ for r in results])
        return
    for r in results:
        extra = f" job {r.external_job_id}" if r.external_job_id else ""
        note = f" ({r.detail})" if r.detail else ""
        _say(f"{r.launch_id} run {r.run_id}: {r.answer}{extra}{note}")
    if not results:
        _say("no launch intents to reconcile")


def _uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        _fail([f"matcher: {quoted(value)} is not a {what} id (a UUID)"], code=EXIT_USAGE)


@launches_app.command("show")
def launches_show(
    launch_id: Annotated[str, typer.Argument(help="The launch's id.")],
    as_json: JsonFlag = False,
) -> None:
    """A launch intent and its audit trail."""
    from matcher.store.launches import audit_trail, get_launch

    key = _uuid(launch_id, "launch")
    with _connect(_settings(kafka=False)) as conn:
        launch = get_launch(conn, key)
        if launch is None:
            _fail([f"matcher: no launch {launch_id}"])
        trail = audit_trail(conn, launch.id)
    if as_json:
        _print_json({**launch.model_dump(), "audit": trail})
        return
    _say(
        f"launch {launch.id} run {launch.run_id} pos {launch.position}: {launch.state.value}, "
        f"key {launch.idempotency_key}, correlation {launch.correlation_id}, "
        f"job {launch.external_job_id or '-'}"
    )
    for entry in trail:
        _say(
            f"  {_when(entry['at'])} {entry['actor']}: {entry['answer']}"
            + (f" {entry['external_job_id']}" if entry["external_job_id"] else "")
        )


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
            _fail([f"matcher: --deadline {quoted(text)}: must be more than 0 seconds"], EXIT_USAGE)
        try:
            return now + timedelta(seconds=seconds)
        except OverflowError:
            _fail([f"matcher: --deadline {quoted(text)}: past the year 9999"], code=EXIT_USAGE)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        _fail(
            [f"matcher: --deadline {quoted(text)} is neither seconds nor an ISO-8601 time"],
            EXIT_USAGE,
        )
    if moment.tzinfo is None:
        _fail(
            [f"matcher: --deadline {quoted(text)} needs a timezone, e.g. {text}Z"], code=EXIT_USAGE
        )
    try:
        moment.astimezone(UTC)  # 9999-12-31T23:00-05:00 is in the year 10000
    except OverflowError:
        _fail([f"matcher: --deadline {quoted(text)}: past the year 9999"], code=EXIT_USAGE)
    if moment <= now:
        _fail([f"matcher: --deadline {quoted(text)}: must be in the future"], code=EXIT_USAGE)
    return moment


@waits_app.command("add")
def waits_add(
    tenant: Annotated[str, typer.Option(help="Tenant the wait belongs to.")],
    run: Annotated[str, typer.Option(help="Run id.")],
    position: Annotated[int, typer.Option(help="The run's position this wait is for.")],
    event_type: Annotated[
        list[str], typer.Option("--type", help="An accepted event type; repeat for several.")
    ],
    correlation: Annotated[str, typer.Option(help="Correlation id the event will carry.")],
    deadline: Annotated[
        str | None,
        typer.Option(help="Seconds from now, or an ISO-8601 time with a timezone."),
    ] = None,
    job_id: Annotated[str | None, typer.Option(help="External job id, if known.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Register a wait. If a matching event already arrived, it resolves at once."""
    from matcher.domain.waits import WaitSpec
    from matcher.store.waits import register_wait

    try:
        spec = WaitSpec(
            tenant=tenant,
            run_id=run,
            position=position,
            event_types=event_type,
            correlation_id=correlation,
            deadline=_parse_deadline(deadline) if deadline is not None else None,
            external_job_id=job_id,
        )
    except ValidationError as exc:
        options = {
            "run_id": "--run",
            "event_types": "--type",
            "correlation_id": "--correlation",
            "external_job_id": "--job-id",
        }
        _fail(_validation_lines(exc, options), EXIT_USAGE)
    with _connect(_settings(kafka=False)) as conn:
        wait = register_wait(conn, spec)
    if as_json:
        _print_json(wait)
    else:
        _say(f"wait {wait.id} {wait.state.value}")


_FILTER_OPTIONS = {
    "run_id": "--run",
    "correlation_id": "--correlation",
    "external_job_id": "--job-id",
}


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
    from matcher.admin.filters import WaitFilters
    from matcher.domain.waits import Wait

    filters = _filters(
        WaitFilters,
        _FILTER_OPTIONS,
        tenant=tenant,
        state=state,
        run_id=run,
        correlation_id=correlation,
        external_job_id=job_id,
        limit=limit,
        offset=offset,
    )
    waits = [Wait.model_validate(r) for r in _view(filters, "waits")]
    if as_json:
        _print_json(waits)
        return
    _table(
        ("id", "tenant", "run", "pos", "types", "correlation", "state", "created"),
        [
            (
                w.id,
                w.tenant,
                w.run_id,
                w.position,
                ",".join(w.event_types),
                w.correlation_id,
                w.state.value,
                _when(w.created_at),
            )
            for w in waits
        ],
    )


def _view(filters: Any, name: View) -> list[dict[str, Any]]:
    """The page of rows of a list view (matcher/store/queries/views.sql)."""
    from matcher.admin.filters import page
    from matcher.store.views import view_rows

    with _connect(_settings(kafka=False)) as conn:
        rows = view_rows(conn, name, filters.params())
    items, _ = page(rows, filters)
    return items


@waits_app.command("cancel")
def waits_cancel(
    wait_id: Annotated[str, typer.Argument(help="The wait's id.")],
    as_json: JsonFlag = False,
) -> None:
    """Cancel a waiting wait (a resume with outcome `cancelled` is published)."""
    from matcher.store.waits import cancel_wait, get_wait

    key = _uuid(wait_id, "wait")
    with _connect(_settings(kafka=False)) as conn:
        wait = get_wait(conn, key)
        if wait is None:
            _fail([f"matcher: no wait {wait_id}"])
        if not cancel_wait(conn, wait.id):
            _fail([f"matcher: wait {wait_id} is already {wait.state.value}"])
        cancelled = get_wait(conn, wait.id)
    if as_json:
        _print_json(cancelled)
    else:
        _say(f"wait {wait_id} cancelled")


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
    from matcher.admin.filters import EventFilters

    filters = _filters(
        EventFilters,
        _FILTER_OPTIONS,
        tenant=tenant,
        correlation_id=correlation,
        status=status,
        external_job_id=job_id,
        limit=limit,
        offset=offset,
    )
    from matcher.domain.events import StoredEvent

    events = [StoredEvent.model_validate(r) for r in _view(filters, "events")]
    if as_json:
        _print_json(events)
        return
    _table(
        ("source", "id", "tenant", "type", "correlation", "status", "received", "at"),
        [
            (
                e.producer,
                e.event_id,
                e.tenant,
                e.type,
                e.correlation_id,
                e.status,
                _when(e.received_at),
                f"{e.kafka_partition}@{e.kafka_offset}",
            )
            for e in events
        ],
    )


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
    from matcher.kafka.resumes import tail

    settings = _settings(postgres=False)
    _quiet_clients()

    def show(data: dict[str, Any]) -> None:
        if as_json:
            print(json.dumps(data), flush=True)
        else:
            event = data.get("event") or {}
            what = f"{event.get('source')}/{event.get('id')}" if event else "-"
            _say(
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
    from matcher.domain.events import CompletionEvent
    from matcher.kafka.resumes import publish_event

    settings = _settings(postgres=False)
    _quiet_clients()
    try:
        payload = json.loads(data) if data is not None else None
    except ValueError as exc:
        _fail([f"matcher: --data is not JSON: {exc}"], code=EXIT_USAGE)
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
        _fail(_validation_lines(exc, options), EXIT_USAGE)
    signing_key = None
    if key_file is not None:
        from matcher_producer.cli import load_key

        try:
            signing_key = load_key(key_id, key_file)
        except (ValueError, OSError) as exc:
            _fail([f"matcher: --key-file: {_one_line(exc)}"], code=EXIT_USAGE)
    partition, offset = asyncio.run(
        publish_event(settings, event, structured=structured, signing_key=signing_key)
    )
    if as_json:
        _print_json(
            {
                "source": event.source,
                "id": event.id,
                "topic": settings.events_topic,
                "partition": partition,
                "offset": offset,
            }
        )
    else:
        _say(
            f"emitted {event.source}/{event.id} to {settings.events_topic} "
            f"(partition {partition}, offset {offset})"
        )


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
    from matcher.admin.filters import QuarantineFilters

    filters = _filters(
        QuarantineFilters,
        _FILTER_OPTIONS,
        reason=reason,
        correlation_id=correlation,
        limit=limit,
        offset=offset,
    )
    from matcher.domain.events import QuarantinedRecord

    records = [QuarantinedRecord.model_validate(r) for r in _view(filters, "quarantine")]
    if as_json:
        _print_json(records)
        return
    _table(
        ("id", "received", "at", "reason", "source", "event", "tenant", "detail"),
        [
            (
                q.id,
                _when(q.received_at),
                f"{q.kafka_partition}@{q.kafka_offset}",
                q.reason + (f" (replayed: {q.replay_result})" if q.replayed_at else ""),
                q.producer or "-",
                q.event_id or "-",
                q.tenant or "-",
                q.detail or "",
            )
            for q in records
        ],
    )


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
    from matcher.admin.filters import QuarantineFilters
    from matcher.auth.gate import judge as gate_judge
    from matcher.auth.registry import Registry, RegistryError, load_registry
    from matcher.domain.records import RawRecord
    from matcher.store.replay import replay

    if (record_id is None) == (reason is None):
        _fail(["matcher: give a quarantine ID or --reason, not both"], code=EXIT_USAGE)
    if reason is not None:
        _filters(QuarantineFilters, {}, reason=reason)
    settings = _settings(kafka=False)
    if settings.producers_file is None and not settings.allow_unsigned:
        _fail(["matcher: MATCHER_PRODUCERS_FILE is not set: nothing to judge against"], EXIT_USAGE)
    try:
        registry = load_registry(settings.producers_file) if settings.producers_file else Registry()
    except RegistryError as exc:
        _fail([f"matcher: {_one_line(exc)}"], code=EXIT_USAGE)
    policy = settings.policy()

    def judge(record: RawRecord) -> Any:
        return gate_judge(record, registry, policy)

    async def go() -> Any:
        import psycopg

        async with await psycopg.AsyncConnection.connect(
            settings.database_url.get_secret_value(), autocommit=True
        ) as conn:
            return await replay(conn, judge, quarantine_id=record_id, reason=reason)

    outcomes = asyncio.run(go())
    if as_json:
        _print_json([o.__dict__ for o in outcomes])
    else:
        for o in outcomes:
            _say(f"{o.id}: {o.result}" + (f" ({o.detail})" if o.detail else ""))
        if not outcomes:
            _say("nothing to replay")
    if record_id is not None and not outcomes:
        _fail([f"matcher: no unreplayed quarantine record {record_id}"])


# The command tree, with the environment variable of every option set by one rule.


def _envvar_name(path: Sequence[str], option: TyperOption) -> str:
    longest = max(option.opts, key=len).lstrip("-")
    return "_".join(["MATCHER", *path, longest]).upper().replace("-", "_")


def _name_envvars(command: click.Command, path: list[str]) -> None:
    for param in command.params:
        if not isinstance(param, TyperOption) or param.name in ("help", "version"):
            continue
        if param.envvar is None:
            param.envvar = _envvar_name(path, param)
        param.show_envvar = True
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            _name_envvars(sub, [*path, name])


@functools.cache
def command() -> click.Command:
    """The ``matcher`` command (click), every option's environment variable named."""
    built = typer.main.get_command(app)
    _name_envvars(built, [])
    return built


def _kafka_error(exc: BaseException) -> int | None:
    """The exit code for an aiokafka error, or None when ``exc`` is not one."""
    from aiokafka import errors

    if isinstance(
        exc,
        errors.KafkaConnectionError
        | errors.KafkaTimeoutError
        | errors.NoBrokersAvailable
        | errors.RequestTimedOutError
        | errors.NodeNotReadyError,
    ):
        return EXIT_UNREACHABLE
    if isinstance(exc, errors.KafkaError):
        return EXIT_FAILED
    return None


def _expected_failure(exc: BaseException) -> tuple[str, int] | None:
    """The one line and the exit code for an expected failure, or None (a bug: the
    traceback is worth having)."""
    import psycopg

    from matcher.kafka.resumes import MissingTopic

    not_migrated = (
        psycopg.errors.UndefinedTable,
        psycopg.errors.UndefinedColumn,
        psycopg.errors.UndefinedFunction,
        psycopg.errors.InvalidSchemaName,
    )
    if isinstance(exc, not_migrated):
        return (
            f"matcher: the database has no matcher schema, or an older one than this "
            f"matcher ({_one_line(exc.diag.message_primary or exc)}): run `matcher migrate`",
            EXIT_NOT_MIGRATED,
        )
    if isinstance(exc, psycopg.OperationalError):
        # No SQLSTATE: the client's side (connecting, the connection lost).
        what = "cannot reach Postgres" if exc.sqlstate is None else "Postgres"
        return f"matcher: {what}: {_one_line(exc)}", EXIT_UNREACHABLE
    if isinstance(exc, MissingTopic):
        return f"matcher: {exc}: run `matcher migrate`", EXIT_NOT_MIGRATED
    code = _kafka_error(exc)
    if code is not None:
        return f"matcher: Kafka: {_one_line(exc) or type(exc).__name__}", code
    if isinstance(exc, ConnectionError | TimeoutError):
        what = _one_line(exc) or type(exc).__name__
        return f"matcher: a service did not answer: {what}", EXIT_UNREACHABLE
    return None


def main(args: Sequence[str] | None = None) -> None:
    try:
        code = command().main(args, prog_name="matcher", standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        exc.show()
        code = EXIT_USAGE
    except click_errors.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "matcher"
        _say(f"{where}: {_one_line(exc.format_message())} (see --help)", stderr=True)
        code = EXIT_USAGE
    except click_errors.ClickException as exc:
        _say(f"matcher: {_one_line(exc.format_message())}", stderr=True)
        code = exc.exit_code
    except typer.Abort:
        code = EXIT_INTERRUPTED
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except Exception as exc:
        found = _expected_failure(exc)
        if found is None:
            raise
        line, code = found
        _say(line, stderr=True)
    sys.exit(code if isinstance(code, int) else EXIT_OK)
