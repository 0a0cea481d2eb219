"""``matcher devstack``: the local stack's verbs, added to the ``matcher`` command when
this development-only package is installed (entry point group ``matcher.cli``)."""

from __future__ import annotations

import json
import shlex
import time
from typing import Annotated, Any, NoReturn

import typer
from rich.table import Table
from rich.text import Text

from matcher.cli.app import sub_app
from matcher.cli.output import (
    EXIT_FAILED,
    EXIT_USAGE,
    JsonFlag,
    err,
    fail,
    one_line,
    out,
    print_json,
    say,
)
from matcher_devstack.procs import DevstackError, DevstackUsageError
from matcher_devstack.stack import Devstack
from matcher_devstack.stack import as_json as statuses_json

devstack_app = sub_app(
    "A local Apache Kafka (KRaft) and PostgreSQL for development and tests, kept in "
    ".devstack/ at the project root (or MATCHER_DEVSTACK_DIR). One broker and one server "
    "by default; `up --brokers 3 --standby` runs a cluster and a synchronous standby, "
    "which the stop-, start-, pause-, resume-broker, failover and rejoin commands break "
    "on purpose."
)


def _devstack() -> Devstack:
    """The project's devstack, found from anywhere inside the project (see
    ``matcher_devstack.stack.default_home``)."""
    return Devstack()


def _devstack_fail(exc: Exception) -> NoReturn:
    code = EXIT_USAGE if isinstance(exc, DevstackUsageError) else EXIT_FAILED
    fail([f"matcher devstack: {one_line(exc)}"], code=code)


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

    stack = _devstack()
    started = time.monotonic()
    try:
        with err.status("starting the devstack (the first start downloads Kafka's jars)"):
            stack.up(fresh=fresh, brokers=brokers, standby=standby, timeout=timeout)
    except DevstackError as exc:
        _devstack_fail(exc)
    if as_json:
        print_json(
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

    stack = _devstack()
    try:
        stack.down(purge=purge)
    except DevstackError as exc:
        _devstack_fail(exc)
    if as_json:
        print_json({"home": str(stack.home), "services": statuses_json(stack.status())})
        return
    err.print("devstack down, data deleted" if purge else "devstack down")


@devstack_app.command("status")
def devstack_status(as_json: JsonFlag = False) -> None:
    """Show whether each service runs (each broker and Postgres node in cluster mode: its
    node id, role, port, and whether it is paused), where, and its log. Exit 1 if one is
    down."""

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

    try:
        variables = _devstack().env()
    except DevstackError as exc:
        fail([f"matcher devstack: {one_line(exc)}"])
    if as_json:
        print(json.dumps(variables))
    else:
        for key, value in variables.items():
            say(f"export {key}={shlex.quote(value)}")


BrokerArg = Annotated[int, typer.Argument(help="The broker's node id (1, 2, 3).", min=0)]


StackTimeout = Annotated[float, typer.Option(min=1, help="Seconds to wait at most.")]


def _devstack_verb(action: Any, as_json: bool, line: Any) -> None:
    """Run a break-it verb: its result as JSON, or ``line(result)`` on stderr."""

    try:
        result = action()
    except DevstackError as exc:
        _devstack_fail(exc)
    if as_json:
        print_json(result)
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
