"""Named SQL blocks loaded from the ``.sql`` files beside this module.

A file holds blocks that each start with a line ``-- name: <block name>``; the text up to
the next such line is the query. SQL stays SQL (reviewable, EXPLAIN-able, greppable) and
Python refers to it by name.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import LiteralString, cast

QUERIES_DIR = Path(__file__).parent / "queries"
_NAME_RE = re.compile(r"^-- name: ([a-z0-9_]+)\s*$", re.MULTILINE)


def parse_blocks(text: str) -> dict[str, LiteralString]:
    parts = _NAME_RE.split(text)
    blocks: dict[str, LiteralString] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise ValueError(f"SQL block {name!r} is defined twice")
        # The files ship with the package: their text is as constant as a literal.
        blocks[name] = cast(LiteralString, body.strip())
    return blocks


@cache
def queries(module: str) -> dict[str, LiteralString]:
    """The named blocks of ``queries/<module>.sql``."""
    return parse_blocks((QUERIES_DIR / f"{module}.sql").read_text())


def query(module: str, name: str) -> LiteralString:
    try:
        return queries(module)[name]
    except KeyError:
        raise KeyError(f"no SQL block {name!r} in queries/{module}.sql") from None
