"""The root of the ``matcher`` command: its help, ``--version``, and how verb groups are
made (no markup in help texts: "[keys]" is a TOML table, not a style)."""

from __future__ import annotations

from typing import Annotated

import typer

from matcher import __version__
from matcher.cli.output import say

_HELP = (
    "matcher: durable waits for agent runs. Completion events from Kafka are matched to "
    "stored waits exactly once, and resumes are published for the next worker.\n\n"
    'Every setting is a MATCHER_* environment variable; `eval "$(matcher devstack env)"` '
    "points them at the local stack. Every option can also be set as "
    "MATCHER_<COMMAND>_<OPTION> (e.g. MATCHER_WAITS_LIST_JOB_ID, MATCHER_EXPLAIN_JSON).\n\n"
    "Exit codes: 0 done, 1 the operation failed, 2 bad usage or configuration, 3 Postgres "
    "or Kafka unreachable, 4 not migrated (run `matcher migrate`), 130 interrupted."
)


def sub_app(help_text: str) -> typer.Typer:
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


def _version(value: bool) -> None:
    if value:
        say(f"matcher {__version__}")
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
