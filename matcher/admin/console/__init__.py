"""The operator console: server-rendered pages at /console, behind the admin token, with
no JavaScript (links and forms), strict security headers and CSRF-checked forms."""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from matcher.admin.console import auth, pages
from matcher.admin.console.render import HEADERS, BadRequest, favicon, html, stylesheet, url
from matcher.admin.console.session import Sessions
from matcher.admin.state import AdminState
from matcher.admin.throttle import FailureThrottle


class ConsoleHeaders:
    """The security headers on every /console response (errors and redirects too)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope["path"]).startswith("/console"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, with_headers)


def _error(status: int, message: str) -> HTMLResponse:
    return html("error.html", {"csrf": "", "signed_in": False, "message": message}, status)


def mount(app: FastAPI, state: AdminState, throttle: FailureThrottle) -> None:
    sessions = Sessions.for_token(state.settings.admin_token)
    # Signed-in sessions are kept in the database; an open console's are not.
    access = auth.Access(sessions, None if sessions.open else state.pool, throttle)
    css = stylesheet()

    icon = favicon()

    @app.get("/console/static/console.css", include_in_schema=False)
    async def console_css() -> Response:
        return Response(css, media_type="text/css")

    # The console's icon, also where browsers ask for one unbidden (an SVG either way).
    @app.get("/console/static/favicon.svg", include_in_schema=False)
    @app.get("/favicon.ico", include_in_schema=False)
    async def console_icon() -> Response:
        return Response(icon, media_type="image/svg+xml")

    app.include_router(auth.routes(access))
    app.include_router(pages.routes(state, access))
    app.add_middleware(ConsoleHeaders)

    @app.exception_handler(auth.SignInRequired)
    async def sign_in_required(request: Request, exc: auth.SignInRequired) -> Response:
        return RedirectResponse(url("/console/sign-in", next=exc.next_path), 303)

    @app.exception_handler(auth.Forbidden)
    async def forbidden(request: Request, exc: Any) -> Response:
        return _error(403, "Sign in again: this form is not valid without a fresh session.")

    @app.exception_handler(auth.TooManyAttempts)
    async def too_many(request: Request, exc: auth.TooManyAttempts) -> Response:
        response = _error(429, "Too many failed attempts from this address: try again later.")
        response.headers["Retry-After"] = str(math.ceil(exc.retry_after_s))
        return response

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> Response:
        return _error(400, str(exc))
