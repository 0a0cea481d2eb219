"""``main``: the command tree with every option's environment variable named by one
rule, and every expected failure as one line and an exit code (no traceback)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

import psycopg
import typer
from aiokafka import errors
from typer import _click as click  # typer vendors click: its commands are these
from typer._click import exceptions as click_errors
from typer.core import TyperGroup, TyperOption

from matcher.cli import events, explain, launches, resumes, serve, waits, worker
from matcher.cli.app import app
from matcher.cli.output import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_MIGRATED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    one_line,
    say,
)
from matcher.kafka.resumes import MissingTopic

app.add_typer(waits.waits_app, name="waits")
app.add_typer(events.events_app, name="events")
app.add_typer(resumes.resumes_app, name="resumes")
app.add_typer(launches.launches_app, name="launches")
app.add_typer(events.quarantine_app, name="quarantine")
_VERBS = (events, explain, launches, resumes, serve, waits, worker)  # their commands are on `app`


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
    # Verb groups of other distributions: the development-only devstack adds its own.
    for plugin in entry_points(group="matcher.cli"):
        app.add_typer(plugin.load(), name=plugin.name)
    built = typer.main.get_command(app)
    _name_envvars(built, [])
    return built


def _kafka_error(exc: BaseException) -> int | None:
    """The exit code for an aiokafka error, or None when ``exc`` is not one."""
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
    not_migrated = (
        psycopg.errors.UndefinedTable,
        psycopg.errors.UndefinedColumn,
        psycopg.errors.UndefinedFunction,
        psycopg.errors.InvalidSchemaName,
    )
    if isinstance(exc, not_migrated):
        return (
            f"matcher: the database has no matcher schema, or an older one than this "
            f"matcher ({one_line(exc.diag.message_primary or exc)}): run `matcher migrate`",
            EXIT_NOT_MIGRATED,
        )
    if isinstance(exc, psycopg.OperationalError):
        # No SQLSTATE: the client's side (connecting, the connection lost).
        what = "cannot reach Postgres" if exc.sqlstate is None else "Postgres"
        return f"matcher: {what}: {one_line(exc)}", EXIT_UNREACHABLE
    if isinstance(exc, MissingTopic):
        return f"matcher: {exc}: run `matcher migrate`", EXIT_NOT_MIGRATED
    code = _kafka_error(exc)
    if code is not None:
        return f"matcher: Kafka: {one_line(exc) or type(exc).__name__}", code
    if isinstance(exc, ConnectionError | TimeoutError):
        what = one_line(exc) or type(exc).__name__
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
        say(f"{where}: {one_line(exc.format_message())} (see --help)", stderr=True)
        code = EXIT_USAGE
    except click_errors.ClickException as exc:
        say(f"matcher: {one_line(exc.format_message())}", stderr=True)
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
        say(line, stderr=True)
    sys.exit(code if isinstance(code, int) else EXIT_OK)
