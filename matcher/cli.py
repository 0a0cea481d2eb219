"""The ``matcher`` command line: the daemon, migrations, and the local stack."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, NoReturn

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
    # Every option can also come from the environment: MATCHER_<COMMAND>_<OPTION>, e.g.
    # MATCHER_WAITS_ADD_TENANT=acme or MATCHER_RESUMES_TAIL_TIMEOUT=10.
    context_settings={"auto_envvar_prefix": "MATCHER", "show_default": True},
)
devstack_app = typer.Typer(
    help="A local Apache Kafka (KRaft) and PostgreSQL for development and tests, kept in "
    ".devstack/ at the project root (or MATCHER_DEVSTACK_DIR).",
    no_args_is_help=True,
)
app.add_typer(devstack_app, name="devstack")
waits_app = typer.Typer(help="Register, list and cancel waits.", no_args_is_help=True)
app.add_typer(waits_app, name="waits")
events_app = typer.Typer(help="Look at the event inbox.", no_args_is_help=True)
app.add_typer(events_app, name="events")
resumes_app = typer.Typer(help="Read the resume topic.", no_args_is_help=True)
app.add_typer(resumes_app, name="resumes")
launches_app = typer.Typer(help="Launch intents and their audit trail.", no_args_is_help=True)
app.add_typer(launches_app, name="launches")
quarantine_app = typer.Typer(
    help="Rejected records: see why, and replay them after fixing the cause.",
    no_args_is_help=True,
)
app.add_typer(quarantine_app, name="quarantine")

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
def run(
    admin_address: Annotated[
        str | None,
        typer.Option(
            envvar="MATCHER_ADMIN_ADDRESS",
            help="HOST:PORT of the admin HTTP API (health, metrics, explain).",
            show_default="127.0.0.1:9464",
        ),
    ] = None,
) -> None:
    """Run the daemon in the foreground until SIGTERM or Ctrl-C (then exit 0)."""
    from matcher.daemon.app import LoopFailed, StartupError
    from matcher.daemon.app import run as run_daemon

    settings = _settings()
    if admin_address is not None:
        try:
            settings = load_settings(admin_address=admin_address)
        except ConfigError as exc:
            _fail([f"matcher: configuration error: {p}" for p in exc.problems], code=2)
    _configure_logging(settings)
    try:
        asyncio.run(run_daemon(settings))
    except StartupError as exc:
        _fail([f"matcher: cannot start: {exc}"])
    except LoopFailed as exc:
        _fail([f"matcher: stopped because a loop failed: {exc}"])


@app.command()
def migrate(
    topics: Annotated[
        bool,
        typer.Option(
            help="Also create the missing topics (events, resumes, dead letters) and give the "
            "events topic broker timestamps (message.timestamp.type=LogAppendTime)."
        ),
    ] = True,
) -> None:
    """Apply pending database migrations and create the Kafka topics that are missing.

    Safe to run concurrently and repeatedly: an advisory lock serialises migrators and
    applied migrations are skipped.
    """
    from matcher.kafka.topics import prepare_topics
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
        done = asyncio.run(prepare_topics(settings))
        for line in done:
            out.print(line)
        if not done:
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


@app.command()
def explain(
    run_id: Annotated[str, typer.Argument(help="The run to explain.")],
    tenant: Annotated[
        str | None, typer.Option(help="The run's tenant (needed when run ids repeat).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Why a run is where it is: resolved (by which event, or deadline, or cancel), or
    still waiting because of a missing signal, a mismatch, or a backlog."""
    import psycopg

    from matcher.admin.explain import explain_run, explanation_body
    from matcher.store.explain import AmbiguousRun, UnknownRun

    settings = _settings()

    async def go() -> Any:
        async with await psycopg.AsyncConnection.connect(
            settings.database_url.get_secret_value(), autocommit=True
        ) as conn:
            return await explain_run(settings, conn, run_id, tenant)

    try:
        explanation = asyncio.run(go())
    except UnknownRun:
        _fail([f"matcher: no waits for run {run_id!r}"])
    except AmbiguousRun as exc:
        _fail([f"matcher: {exc}: give --tenant"], code=2)
    wait = explanation.evidence["wait"]
    if as_json:
        _print_json(explanation_body(run_id, explanation))
        return
    out.print(
        f"run [bold]{run_id}[/] ({wait['tenant']}), position {wait['position']}, wait "
        f"{wait['id']}: [bold]{explanation.verdict.value}[/]"
    )
    for reason in explanation.reasons:
        out.print(f"  - {reason}", markup=False, highlight=False)


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
            _fail([f"matcher: --reconciler {spec!r}: {exc}"], code=2)
        return target
    found = entry_points(group="matcher.reconcilers", name=spec)
    if not found:
        _fail(
            [f"matcher: --reconciler {spec!r}: no such entry point in group matcher.reconcilers"], 2
        )
    return next(iter(found)).load()


@app.command()
def reconcile(
    reconciler: Annotated[
        str,
        typer.Option(
            help="Your lookup: module:function, or a matcher.reconcilers entry point name. "
            "It gets a Launch and answers Found(job_id), NotFound() or Unknown(reason)."
        ),
    ],
    older_than: Annotated[
        float, typer.Option(help="Only intents older than this many seconds.")
    ] = 300.0,
    limit: Annotated[int, typer.Option(help="At most this many intents per run.")] = 1000,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Reconcile launch intents that never recorded a job id (the worker died around the
    external call): ask the external system, by idempotency key, what became of each."""
    from matcher.store.launches import reconcile as run_reconcile

    settings = _settings()
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
        extra = f" job {r.job_id}" if r.job_id else ""
        note = f" ({r.detail})" if r.detail else ""
        print(f"{r.launch_id} run {r.run_id}: {r.answer}{extra}{note}")
    if not results:
        print("no launch intents to reconcile")


@launches_app.command("show")
def launches_show(
    launch_id: Annotated[str, typer.Argument(help="The launch's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """A launch intent and its audit trail."""
    from matcher.store.launches import audit_trail, get_launch

    with _connect(_settings()) as conn:
        try:
            launch = get_launch(conn, launch_id)
        except Exception:
            launch = None
        if launch is None:
            _fail([f"matcher: no launch {launch_id}"])
        trail = audit_trail(conn, launch.id)
    if as_json:
        _print_json({**launch.model_dump(mode="json"), "audit": trail})
        return
    out.print(
        f"launch {launch.id} run {launch.run_id} pos {launch.position}: {launch.state.value}, "
        f"key {launch.idempotency_key}, correlation {launch.correlation_id}, "
        f"job {launch.external_job_id or '-'}"
    )
    for entry in trail:
        print(
            f"  {entry['at'].isoformat(timespec='seconds')} {entry['actor']}: {entry['answer']}"
            + (f" {entry['external_job_id']}" if entry["external_job_id"] else "")
        )


def _connect(settings: Settings) -> Any:
    import psycopg

    try:
        return psycopg.connect(settings.database_url.get_secret_value(), autocommit=True)
    except psycopg.OperationalError as exc:
        _fail([f"matcher: cannot reach Postgres: {' '.join(str(exc).split())}"])


def _parse_deadline(text: str) -> datetime:
    try:
        return datetime.now(UTC) + timedelta(seconds=float(text))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        _fail([f"matcher: --deadline {text!r} is neither seconds nor an ISO-8601 time"], code=2)
    if moment.tzinfo is None:
        _fail([f"matcher: --deadline {text!r} needs a timezone, e.g. {text}Z"], code=2)
    return moment


def _print_json(value: Any) -> None:
    print(json.dumps(value, default=str))


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
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Register a wait. If a matching event already arrived, it resolves at once."""
    from pydantic import ValidationError

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
        _fail([f"matcher: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()], 2)
    with _connect(_settings()) as conn:
        wait = register_wait(conn, spec)
    if as_json:
        _print_json(wait.model_dump(mode="json"))
    else:
        out.print(f"wait {wait.id} {wait.state.value}")


@waits_app.command("list")
def waits_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
    state: Annotated[
        str | None, typer.Option(help="waiting, matched, timed_out or cancelled.")
    ] = None,
    run: Annotated[str | None, typer.Option(help="Only this run id.")] = None,
    correlation: Annotated[str | None, typer.Option(help="Only this correlation id.")] = None,
    job_id: Annotated[str | None, typer.Option(help="Only this external job id.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """List waits, newest first."""
    from matcher.store.waits import list_waits

    with _connect(_settings()) as conn:
        waits = list_waits(
            conn,
            tenant=tenant,
            state=state,
            run_id=run,
            correlation_id=correlation,
            external_job_id=job_id,
            limit=limit,
        )
    if as_json:
        _print_json([w.model_dump(mode="json") for w in waits])
        return
    table = Table("id", "tenant", "run", "pos", "types", "correlation", "state", "created")
    for w in waits:
        table.add_row(
            str(w.id),
            w.tenant,
            w.run_id,
            str(w.position),
            ",".join(w.event_types),
            w.correlation_id,
            w.state.value,
            w.created_at.isoformat(timespec="seconds"),
        )
    out.print(table)


@waits_app.command("cancel")
def waits_cancel(wait_id: Annotated[str, typer.Argument(help="The wait's id.")]) -> None:
    """Cancel a waiting wait (a resume with outcome `cancelled` is published)."""
    from matcher.store.waits import cancel_wait, get_wait

    with _connect(_settings()) as conn:
        try:
            wait = get_wait(conn, wait_id)
        except Exception:
            wait = None
        if wait is None:
            _fail([f"matcher: no wait {wait_id}"])
        if not cancel_wait(conn, wait.id):
            _fail([f"matcher: wait {wait_id} is already {wait.state.value}"])
    out.print(f"wait {wait_id} cancelled")


@events_app.command("list")
def events_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
    correlation: Annotated[str | None, typer.Option(help="Only this correlation id.")] = None,
    status: Annotated[str | None, typer.Option(help="pending, consumed, late or expired.")] = None,
    job_id: Annotated[str | None, typer.Option(help="Only this external job id.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """List stored events, newest first."""
    from psycopg.rows import dict_row

    from matcher.store.sql import query

    params = {
        "tenant": tenant,
        "correlation_id": correlation,
        "status": status,
        "external_job_id": job_id,
        "limit": limit,
        "offset": 0,
    }
    with _connect(_settings()) as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("views", "events"), params).fetchall()
    if as_json:
        _print_json(rows)
        return
    table = Table("source", "id", "tenant", "type", "correlation", "status", "received", "at")
    for r in rows:
        table.add_row(
            r["producer"],
            r["event_id"],
            r["tenant"],
            r["type"],
            r["correlation_id"],
            r["status"],
            r["received_at"].isoformat(timespec="seconds"),
            f"{r['kafka_partition']}@{r['kafka_offset']}",
        )
    out.print(table)


@resumes_app.command("tail")
def resumes_tail(
    from_beginning: Annotated[
        bool, typer.Option(help="Start at the oldest resume, not at the newest.")
    ] = False,
    max_count: Annotated[
        int | None, typer.Option("--max", help="Stop after this many resumes.")
    ] = None,
    timeout: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Print resumes as they are published: one line each (the resume's data)."""
    from matcher.kafka.resumes import tail

    settings = _settings()

    def show(data: dict[str, Any]) -> None:
        if as_json:
            print(json.dumps(data), flush=True)
        else:
            event = data.get("event") or {}
            what = f"{event.get('source')}/{event.get('id')}" if event else "-"
            print(
                f"{data['tenant']} run={data['run_id']} pos={data['position']} "
                f"{data['outcome']} event={what} resolution={data['resolution_id']}",
                flush=True,
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
) -> None:
    """Publish one completion event by hand (a CloudEvent on the events topic), signed
    with --key-file as the producer SDK signs."""
    import uuid

    from pydantic import ValidationError

    from matcher.domain.events import CompletionEvent
    from matcher.kafka.resumes import publish_event

    settings = _settings()
    try:
        payload = json.loads(data) if data is not None else None
    except ValueError as exc:
        _fail([f"matcher: --data is not JSON: {exc}"], code=2)
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
        _fail([f"matcher: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()], 2)
    signing_key = None
    if key_file is not None:
        from matcher_producer.cli import load_key

        try:
            signing_key = load_key(key_id, key_file)
        except (ValueError, OSError) as exc:
            _fail([f"matcher: --key-file: {exc}"], code=2)
    asyncio.run(publish_event(settings, event, structured=structured, signing_key=signing_key))
    out.print(f"emitted {event.source}/{event.id} to {settings.events_topic}")


@quarantine_app.command("list")
def quarantine_list(
    reason: Annotated[
        str | None, typer.Option(help="Only this reason code (e.g. bad_signature).")
    ] = None,
    correlation: Annotated[str | None, typer.Option(help="Only this correlation id.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """List quarantined records, newest first, with the reason each was refused."""
    from psycopg.rows import dict_row

    from matcher.store.sql import query

    params = {"reason": reason, "correlation_id": correlation, "limit": limit, "offset": 0}
    with _connect(_settings()) as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("views", "quarantine"), params).fetchall()
    if as_json:
        _print_json(rows)
        return
    table = Table("id", "received", "at", "reason", "source", "event", "tenant", "detail")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["received_at"].isoformat(timespec="seconds"),
            f"{r['kafka_partition']}@{r['kafka_offset']}",
            r["reason"] + (f" (replayed: {r['replay_result']})" if r["replayed_at"] else ""),
            r["producer"] or "-",
            r["event_id"] or "-",
            r["tenant"] or "-",
            r["detail"] or "",
        )
    out.print(table)


@quarantine_app.command("replay")
def quarantine_replay(
    record_id: Annotated[
        int | None, typer.Argument(help="The quarantine id to replay.", show_default=False)
    ] = None,
    reason: Annotated[
        str | None, typer.Option(help="Replay every unreplayed record with this reason.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Judge quarantined records again with the current producers file and limits; those
    that pass are stored and matched like any other event (duplicates still recognised).
    A record is judged as of when it first arrived (signature timestamps included)."""
    from matcher.auth.gate import judge as gate_judge
    from matcher.auth.record import RawRecord
    from matcher.auth.registry import Registry, RegistryError, load_registry
    from matcher.store.replay import replay

    if (record_id is None) == (reason is None):
        _fail(["matcher: give a quarantine ID or --reason, not both"], code=2)
    settings = _settings()
    if settings.producers_file is None and not settings.allow_unsigned:
        _fail(["matcher: MATCHER_PRODUCERS_FILE is not set: nothing to judge against"], code=2)
    try:
        registry = load_registry(settings.producers_file) if settings.producers_file else Registry()
    except RegistryError as exc:
        _fail([f"matcher: {exc}"], code=2)
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
            print(f"{o.id}: {o.result}" + (f" ({o.detail})" if o.detail else ""))
        if not outcomes:
            print("nothing to replay")
    if record_id is not None and not outcomes:
        _fail([f"matcher: no unreplayed quarantine record {record_id}"])


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
