"""What the CLI prints for people is escaped: a stored id, tenant or detail is whatever a
record said, and a terminal acts on the control characters and rich on the markup in it."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import matcher_devstack.cli
import pytest
from rich.console import Console

from matcher.cli import output

HOSTILE = "inj\x1b[2J\x1b]0;PWNED\x07\x1b[31mFAKE-OK\n\t\u202e[red]x[/red][link=https://e.example]l[/link]"
RAW = ("\x1b", "\x07", "\u202e", "\n\t")


def test_table_cells_are_escaped_and_not_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(output, "out", Console(file=screen, width=500))
    output.table(("id", "tenant"), [(1, HOSTILE)])
    shown = screen.getvalue()
    for raw in RAW:
        assert raw not in shown
    assert "inj\\x1b[2J\\x1b]0;PWNED\\x07\\x1b[31mFAKE-OK\\n\\t\\u202e" in shown
    assert "[red]x[/red][link=https://e.example]l[/link]" in shown
    assert len(shown.strip().splitlines()) == 5  # borders, header, one row: no broken cell


def test_lines_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    output.say(f"run {HOSTILE}")
    output.say(f"matcher: {HOSTILE}", stderr=True)
    said = capsys.readouterr()
    for stream in (said.out, said.err):
        assert stream.count("\n") == 1
        for raw in RAW:
            assert raw not in stream
        assert "\\x1b[2J" in stream


# Every line a person reads goes through say or table. A bare print() may only write JSON
# (json.dumps escapes control characters); rich's print only for the devstack's own text
# (ports, paths, states) and in table.
SOURCES = [
    *sorted(Path(output.__file__).parent.glob("*.py")),
    Path(matcher_devstack.cli.__file__),
]


def _calls(tree: ast.AST) -> list[tuple[set[str], ast.Call]]:
    """Every call in a function, with the names of the functions it is inside."""
    inside: dict[ast.Call, set[str]] = {}
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Call):
                    inside.setdefault(node, set()).add(function.name)
    return [(names, call) for call, names in inside.items()]


def _escaped_or_json(functions: set[str], call: ast.Call) -> bool:
    target = call.func
    if isinstance(target, ast.Name) and target.id == "print":
        first = call.args[0] if call.args else None
        is_json = isinstance(first, ast.Call) and ast.unparse(first.func) == "json.dumps"
        return is_json or "say" in functions
    if (
        isinstance(target, ast.Attribute)
        and target.attr == "print"
        and ast.unparse(target.value) in ("out", "err")
    ):
        return "table" in functions or any("devstack" in f for f in functions)
    return True


def test_every_human_readable_line_goes_through_the_escaping() -> None:
    offenders = [
        f"{source.name}: {ast.unparse(call)}"
        for source in SOURCES
        for functions, call in _calls(ast.parse(source.read_text()))
        if not _escaped_or_json(functions, call)
    ]
    assert offenders == []
