"""What every verb prints and how it fails: the exit codes, lines for people (escaped),
tables, JSON with every timestamp in RFC 3339 UTC ("...Z")."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from matcher.admin.explain import jsonable
from matcher.domain.explain import rfc3339
from matcher.logs import escape, quoted

# The exit codes (docs/reference/exit-codes.md).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_MIGRATED = 4
EXIT_INTERRUPTED = 130
err = Console(stderr=True)
out = Console()
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def say(line: str, *, stderr: bool = False) -> None:
    """Print a line for a person. Every human-readable line goes through here (tables
    through ``_table``): what it shows is often stored text a sender chose, or an argument
    that is not UTF-8, and a terminal would act on the control characters in it."""
    print(escape(line), file=sys.stderr if stderr else sys.stdout, flush=True)


def fail(lines: Sequence[str], code: int = EXIT_FAILED) -> NoReturn:
    for line in lines:
        say(line, stderr=True)  # unwrapped: one line per problem, even on a narrow tty
    raise typer.Exit(code)


def print_json(value: Any) -> None:
    if isinstance(value, BaseModel):
        value = value.model_dump()
    elif isinstance(value, list):
        value = [v.model_dump() if isinstance(v, BaseModel) else v for v in value]
    print(json.dumps(jsonable(value)), flush=True)


def when(moment: datetime | None) -> str:
    return "-" if moment is None else rfc3339(moment, seconds=True)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    # Cells are Text, not markup, and escaped: a tenant or a quarantine detail is whatever
    # a record said, "[red]" and ESC included.
    table = Table(*headers)
    for row in rows:
        table.add_row(*(Text(escape(str(cell))) for cell in row))
    out.print(table)


def validation_lines(exc: ValidationError, options: Mapping[str, str]) -> list[str]:
    lines = []
    for e in exc.errors():
        message = str(e["msg"]).removeprefix("Value error, ")
        if not e["loc"]:  # a rule across options: no one value to quote
            lines.append(f"matcher: {message}")
            continue
        field = str(e["loc"][0])
        option = options.get(field, "--" + field.replace("_", "-"))
        lines.append(f"matcher: {option} {quoted(e['input'])}: {message}")
    return lines
