"""Templates (Jinja2, autoescaped: everything shown is attacker-controlled text), links
built with URL encoding, and the console's responses and errors."""

from __future__ import annotations

import json
import unicodedata
from datetime import datetime
from importlib.resources import files
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
import markupsafe
from fastapi.responses import HTMLResponse

from matcher.domain.explain import rfc3339
from matcher.logs import escaped_character, reveal_invisible

# Every console response carries these (the console has no script at all).
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

MAX_LIMIT = 200
DEFAULT_LIMIT = 50
MAX_OFFSET = 1_000_000
MAX_IDENT = 512
PREVIEW_CHARS = 2048


class BadRequest(ValueError):
    """A query parameter or form field the console refuses (400, with the sentence)."""


def url(path: str, *segments: str, **params: Any) -> str:
    """``path``, then each of ``segments`` percent-encoded as one path segment, then the
    query: parameters that are None or empty are left out."""
    built = path + "".join("/" + quote(s, safe="") for s in segments)
    query = [(k, str(v)) for k, v in params.items() if v is not None and v != ""]
    return f"{built}?{urlencode(query)}" if query else built


def when(moment: datetime | None) -> str:
    return "-" if moment is None else rfc3339(moment, seconds=True)


def as_json(value: Any, limit: int = PREVIEW_CHARS) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + " …"


def _revealed(character: str) -> str:
    # Marked, so a revealed character reads apart from a stored text "\u200b" (the same
    # six characters, unmarked); its Unicode name on hover. Names are A-Z, 0-9, space, "-".
    name = unicodedata.name(character, "")
    return f'<span class="revealed" title="{name}">{escaped_character(character)}</span>'


def _visible(value: Any) -> Any:
    # A form field's value is written `{{ value|e }}` (Markup, already escaped) and left
    # as it is: shown as \u200b in the field, a filter would come back as another text.
    if isinstance(value, markupsafe.Markup) or not isinstance(value, str):
        return value
    # Escaped here (autoescape leaves Markup alone); then only the marks are added, each
    # of fixed text but for a character's escape and name (ASCII letters, digits, "\\").
    escaped = str(markupsafe.escape(value))
    return markupsafe.Markup(reveal_invisible(escaped, _revealed))  # noqa: S704


def unmarked(value: str) -> markupsafe.Markup:
    """``value`` escaped, its format characters shown as escapes without the mark: for a
    page's <title>, whose text shows markup as it is."""
    return markupsafe.escape(reveal_invisible(value))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("matcher.admin.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        # Every value shown is stored text a sender chose: a right-to-left override in a
        # tenant would reverse the ids after it in the same cell. Shown as \u202e instead.
        finalize=_visible,
    )
    env.globals.update(url=url)
    env.filters.update(when=when, as_json=as_json, unmarked=unmarked)
    return env


ENV = _environment()


def html(template: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    return HTMLResponse(ENV.get_template(template).render(**context), status_code=status)


def stylesheet() -> bytes:
    return files("matcher.admin.console").joinpath("static/console.css").read_bytes()


def favicon() -> bytes:
    return files("matcher.admin.console").joinpath("static/favicon.svg").read_bytes()


def ident(params: Any, name: str) -> str | None:
    """An identifier filter: absent or empty is None; bounded, never NUL."""
    value = params.get(name)
    if value is None or value == "":
        return None
    if len(value) > MAX_IDENT or "\x00" in value:
        raise BadRequest(f"{name} must be at most {MAX_IDENT} characters, without NUL")
    return str(value)


def choice(params: Any, name: str, allowed: list[str]) -> str | None:
    value = ident(params, name)
    if value is not None and value not in allowed:
        raise BadRequest(f"{name} must be one of {', '.join(allowed)}")
    return value


def paging(params: Any) -> tuple[int, int]:
    """``limit`` (1 to 200, default 50; larger asks are clamped to 200) and ``offset``."""
    try:
        limit = int(params.get("limit") or DEFAULT_LIMIT)
        offset = int(params.get("offset") or 0)
    except ValueError:
        raise BadRequest("limit and offset must be whole numbers") from None
    if limit < 1 or offset < 0 or offset > MAX_OFFSET:
        raise BadRequest(f"limit must be at least 1 and offset between 0 and {MAX_OFFSET}")
    return min(limit, MAX_LIMIT), offset


def pager(
    path: str, filters: dict[str, Any], limit: int, offset: int, more: bool
) -> dict[str, Any]:
    """The Previous and Next links of a page (None where there is none)."""
    previous = url(path, **filters, limit=limit, offset=max(0, offset - limit)) if offset else None
    following = url(path, **filters, limit=limit, offset=offset + limit) if more else None
    return {"previous": previous, "next": following}
