"""Who is asking: a console session (cookie), or the admin token as a bearer header (for
curl); the sign-in and sign-out routes; CSRF on every POST; failed attempts throttled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse
from psycopg_pool import AsyncConnectionPool

from matcher.admin.console.render import BadRequest, html, url
from matcher.admin.console.session import (
    COOKIE,
    SESSION_S,
    Sessions,
    csrf_token,
    expires_at,
    session_id,
)
from matcher.admin.throttle import FailureThrottle
from matcher.store import console_sessions

MAX_FORM_BYTES = 64 * 1024


@dataclass(frozen=True)
class Visitor:
    session: str | None  # None: the bearer header, which needs no CSRF token
    new: bool = False  # a session issued now (the open console): the response sets it
    secure: bool = False  # asked over https: the cookie is Secure

    @property
    def csrf(self) -> str:
        return csrf_token(self.session) if self.session else ""


@dataclass(frozen=True)
class Access:
    """What decides who may use the console: the cookie's keys, where signed-in sessions
    are kept (None: an open console, whose sessions are not kept), and the throttle on
    failed attempts (shared with /v1's bearer check)."""

    sessions: Sessions
    pool: AsyncConnectionPool | None
    throttle: FailureThrottle = field(default_factory=FailureThrottle)

    async def kept(self, cookie: str) -> bool:
        if self.pool is None:
            return True
        async with self.pool.connection() as conn:
            return await console_sessions.session_open(conn, session_id(cookie))

    async def keep(self, cookie: str) -> None:
        if self.pool is not None:
            async with self.pool.connection() as conn:
                await console_sessions.open_session(conn, session_id(cookie), expires_at(cookie))

    async def forget(self, cookie: str) -> None:
        if self.pool is not None:
            async with self.pool.connection() as conn:
                await console_sessions.close_session(conn, session_id(cookie))

    def token_matches(self, request: Request, given: str) -> bool:
        """The admin token compared, unless this address failed too often (429)."""
        client = client_address(request)
        wait = self.throttle.retry_after(client)
        if wait is not None:
            raise TooManyAttempts(wait)
        if self.sessions.token_matches(given):
            return True
        self.throttle.failed(client)
        return False


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


class SignInRequired(Exception):
    def __init__(self, next_path: str) -> None:
        self.next_path = next_path


class Forbidden(Exception):
    pass


class TooManyAttempts(Exception):
    def __init__(self, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s


async def identify(access: Access, request: Request) -> Visitor | None:
    sessions = access.sessions
    authorization = request.headers.get("authorization", "")
    if not sessions.open and authorization[:7].lower() == "bearer ":
        matches = access.token_matches(request, authorization[7:].strip())
        return Visitor(None) if matches else None
    cookie = request.cookies.get(COOKIE)
    if cookie and sessions.valid(cookie) and await access.kept(cookie):
        return Visitor(cookie)
    if sessions.open and request.method == "GET":
        return Visitor(sessions.issue(), new=True, secure=request.url.scheme == "https")
    return None


async def require(access: Access, request: Request) -> Visitor:
    """The visitor of a GET, or a redirect to the sign-in page."""
    visitor = await identify(access, request)
    if visitor is None:
        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise SignInRequired(here)
    return visitor


async def form(request: Request) -> dict[str, list[str]]:
    """An urlencoded form body, bounded."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        raise BadRequest("the form must be sent as application/x-www-form-urlencoded")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_FORM_BYTES:
        raise BadRequest("the form is too large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():  # counted while read: never buffered past the bound
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            raise BadRequest("the form is too large")
        chunks.append(chunk)
    body = b"".join(chunks)
    try:
        return parse_qs(body.decode(), keep_blank_values=True, max_num_fields=1000)
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("the form is not readable") from None


async def require_post(access: Access, request: Request) -> tuple[Visitor, dict[str, list[str]]]:
    """The visitor of a POST and its form: a session with its CSRF token, or the bearer
    header; anything else is 403."""
    visitor = await identify(access, request)
    if visitor is None:
        raise Forbidden
    try:
        fields = await form(request)
    except BadRequest:
        if visitor.session is not None:
            raise Forbidden from None  # no readable CSRF token
        raise
    if visitor.session is not None and not Sessions.csrf_ok(visitor.session, first(fields, "csrf")):
        raise Forbidden
    return visitor, fields


def first(fields: dict[str, list[str]], name: str) -> str | None:
    values = fields.get(name)
    return values[0] if values else None


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a console path, never another site."""
    if not value or "\\" in value or any(ord(c) < 0x20 for c in value):
        return "/console"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or value.startswith("//"):
        return "/console"
    if parts.path != "/console" and not parts.path.startswith("/console/"):
        return "/console"
    return value


def set_session(response: Response, secure: bool, session: str) -> None:
    response.set_cookie(
        COOKIE,
        session,
        max_age=SESSION_S,
        path="/console",
        httponly=True,
        samesite="strict",
        secure=secure,
    )


def _sign_in_form(next_path: str, error: str | None, status: int) -> Response:
    return html(
        "sign_in.html", {"next": next_path, "error": error, "csrf": "", "signed_in": False}, status
    )


def routes(access: Access) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    sessions = access.sessions

    @router.get("/console/sign-in")
    async def sign_in_page(request: Request) -> Response:
        if sessions.open:
            return RedirectResponse("/console", 303)
        return _sign_in_form(safe_next(request.query_params.get("next")), None, 200)

    @router.post("/console/sign-in")
    async def sign_in(request: Request) -> Response:
        fields = await form(request)
        next_path = safe_next(first(fields, "next"))
        if sessions.open:
            return RedirectResponse(next_path, 303)
        if not access.token_matches(request, first(fields, "token") or ""):
            return _sign_in_form(next_path, "That token is not valid.", 401)
        response = RedirectResponse(next_path, 303)
        session = sessions.issue()
        await access.keep(session)
        # uvicorn takes the scheme from X-Forwarded-Proto only from a proxy it trusts
        # (FORWARDED_ALLOW_IPS, by default 127.0.0.1), so a client cannot claim https.
        set_session(response, request.url.scheme == "https", session)
        return response

    @router.post("/console/sign-out")
    async def sign_out(request: Request) -> Response:
        visitor, _ = await require_post(access, request)
        if visitor.session is not None:
            await access.forget(visitor.session)  # ended wherever the cookie was copied
        response = RedirectResponse(url("/console/sign-in"), 303)
        response.delete_cookie(COOKIE, path="/console", httponly=True, samesite="strict")
        return response

    return router


def context(visitor: Visitor, **values: Any) -> dict[str, Any]:
    # The navigation is shown only to whom the console let in (not on the sign-in page).
    return {
        "csrf": visitor.csrf,
        "signed_in": visitor.session is not None,
        "navigation": True,
        **values,
    }
